"""One plain line for every technical term a release summary may print.

:func:`glossary_for` returns the lines for the terms that occur in a summary's text, so a
reader meets no word the summary does not explain. Each entry is ``(pattern, line)``: the
pattern is a regular expression matched against the summary's text (word boundaries, case as
written where case matters: ``l2`` the objective, not a cell label).
"""

from __future__ import annotations

import re

__all__ = ["GLOSSARY", "glossary_for"]

GLOSSARY: tuple[tuple[str, str], ...] = (
    (r"\bpure\b|\bepsilon\b", "epsilon (pure differential privacy): the privacy loss bound; a release is "
     "epsilon-DP when adding or removing one person changes the probability of any output by at most a factor "
     "e^epsilon. Smaller is more private."),
    (r"\bdelta\b", "delta: the small probability with which the epsilon bound may fail ((epsilon, delta)-DP); "
     "keep it well below 1 / the number of people."),
    (r"\bzcdp\b|\brho\b", "zCDP / rho: zero-concentrated differential privacy with parameter rho (Bun and Steinke "
     "2016); costs add up exactly; rho-zCDP implies (epsilon, delta)-DP for every delta (the equivalent "
     "epsilon is printed beside the budget)."),
    (r"\blaplace\b", "laplace: exact discrete Laplace noise (integer-valued, two-sided geometric), scaled to the "
     "query's L1 sensitivity; gives pure epsilon-DP."),
    (r"\bgaussian\b", "gaussian: exact discrete Gaussian noise (Canonne, Kamath, Steinke 2020), scaled to the "
     "query's L2 sensitivity; gives zCDP or (epsilon, delta)-DP."),
    (r"noise std\. dev\.|noise standard deviation|noise s\.d\.", "noise standard deviation: the spread of the "
     "noise added to each answer; about 68 % of noisy answers lie within one of it of the truth."),
    (r"Objective l2\b|\bl2\b", "l2 (weighted least squares): the released table minimises the sum of squared "
     "differences from the noisy answers, each divided by its noise variance, subject to the constraints."),
    (r"Objective l1\b", "l1: minimises the sum of absolute differences from the noisy answers (robust to "
     "occasional large noise)."),
    (r"Objective linf\b", "linf: minimises the largest absolute difference from any noisy answer."),
    (r"Objective entropy\b|max_entropy", "entropy: the table of largest entropy (the most even spread) that "
     "agrees with the measurements within their noise."),
    (r"Objective smooth\b", "smooth: least squares plus a penalty on differences between neighbouring cells, "
     "which borrows strength across cells where counts are small."),
    (r"\bcvxpy\b", "cvxpy: a modelling layer for convex optimisation that hands the problem to a solver "
     "(e.g. CLARABEL, an interior-point solver)."),
    (r"\bCLARABEL\b", "CLARABEL: an interior-point solver for conic problems, used through cvxpy."),
    (r"\bclarabel\b", "clarabel: Clarabel, an interior-point solver for conic and quadratic problems, called "
     "directly (the solver cvxpy would call, without cvxpy)."),
    (r"\bhighs\b|\bHiGHS\b", "HiGHS: an open-source solver for linear, quadratic and mixed-integer programs."),
    (r"\bscipy\b|\bnnls\b", "scipy: SciPy's solvers (e.g. nnls, non-negative least squares), used for "
     "least-squares fits without inequality rows."),
    (r"\bpulp\b|\bCBC\b", "PuLP / CBC: a modelling layer and an open-source mixed-integer solver."),
    (r"\bOPTIMAL\b", "OPTIMAL: the solver proved the returned point optimal, and dpopt re-checked its "
     "residuals and optimality conditions before release."),
    (r"\bTIME_LIMIT\b|\bITERATION_LIMIT\b", "TIME_LIMIT / ITERATION_LIMIT: the work stopped at its bound; the "
     "released point is a verified feasible one, and the gap says how far from optimal it may be."),
    (r"\bgap\b", "gap: the proven bound on how much better the best possible solution could be, as a share of "
     "the released one's objective."),
    (r"rounded to integers|Rounded to integers|\bcontrolled\b", "controlled rounding: every cell is rounded up "
     "or down (never further) so that the measured totals stay as close as possible to the fractional fit; the "
     "change is reported."),
    (r"[Ss]tructural zero", "structural zero: a cell that cannot occur (e.g. a child who is a householder); "
     "the release holds it at 0."),
    (r"\binvariant\b|[Ii]nvariants?", "invariant: a total published exactly from the data on purpose (not "
     "private); the release reproduces it exactly."),
    (r"[Nn]on-negativ", "non-negativity: every released count is at least 0 (noisy answers may be negative; "
     "the fit is projected, never clamped)."),
    (r"[Ee]rror bar", "error bar: the standard error of a released answer given the fit, i.e. how far it "
     "typically is from the truth because of the noise."),
    (r"[Ee]xpected error", "expected error: the root mean squared error per answer that the plan predicts "
     "before any data is read, from the queries and the noise alone."),
    (r"\bRMS\b", "RMS: root mean square, the square root of the average of the squares."),
    (r"\bsynthetic records?\b", "synthetic records: made-up person records drawn from the release (their counts "
     "reproduce a released table where there is one); they carry the release's privacy guarantee."),
    (r"NOT private|NOT PRIVATE", "NOT private: the figure or run uses the confidential data or a seeded noise "
     "source, for testing only; do not publish it."),
)


def glossary_for(text: str, report: dict | None = None) -> list[str]:
    """The glossary lines for the terms that occur in ``text`` (in :data:`GLOSSARY`'s order)."""
    lines = []
    for pattern, line in GLOSSARY:
        if re.search(pattern, text):
            lines.append(line)
    return lines
