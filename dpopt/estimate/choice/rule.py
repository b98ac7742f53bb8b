"""How to fit, chosen per release from the noisy answers alone: the estimate with the least risk.

**The candidates.** Every estimate is fitted to the residual statistics of the measurements
(:mod:`dpopt.estimate.choice.statistics`), under the release's constraints plus non-negativity,
with the table's total held at its estimate from the measurements when no invariant fixes it
(Private-PGM's ``known_total``). They differ in two ways:

* **what they fit**: every residual the measurements saw (``all``); only those of the workload's
  tables (``workload``); only the workload's lower orders (``lower``), the top-order interactions
  then coming from the log-linear model of the lower ones (the smooth estimate's exponential
  family);
* **how**: least squares (``l2``: the projection onto the non-negative tables, exact zeros
  allowed; with the total held, or left free, which on the histogram is the clamp ``max(y, 0)``),
  or the smooth estimate (:mod:`dpopt.estimate.engines.smooth`: three relative-entropy proximal
  steps, every cell positive) with the weight ``λ = c/σ̄`` at the default ``c`` times
  :data:`SMOOTHING_FACTORS` (``σ̄`` the noise of the fitted residual coordinates,
  :func:`_sigma_bar`), searched along that grid from 1 while the risk falls (:func:`_line_search`).

**The rule.** For every candidate, Stein's unbiased risk estimate of the weighted workload error
(:mod:`dpopt.estimate.choice.risk`), with the exact Jacobian (:mod:`dpopt.estimate.choice.jacobian`);
the release takes the least. It reads the noisy answers and public noise laws only: no data, no
truth, no random draw (a test swaps the data under fixed noisy answers and gets the same choice).
Every workload table measured directly must come out with a risk at most its noisy answers'
(exact: noise variance times cells): the rule takes the least-risk candidate that keeps every such
table there, and when none does it takes the least-risk one and the report names each table and
by how much it is over (:attr:`FitChoice.over_noisy`).

**Blends and positivity** (:func:`_blend_or_positive`). The risk estimate of a convex combination
of two fits is a quadratic in its weight, known exactly from theirs
(:func:`~dpopt.estimate.choice.risk.blend_risks`); the release is the least-risk combination of
the least-risk fit with one other when that is lower (stacking, scored by the risk estimate).
When the least-risk fit leaves cells at exactly 0, its partners are the positive fits only, and
when no blend is lower a positive fit within one standard error is preferred: the release is then
positive, and its relative entropy to any table the data could hold finite.

**The one-standard-error rule** (:func:`_one_standard_error`, ``select="one_se"``; opt-in, not
the default :data:`DEFAULT_SELECTION`, as it did not pay off on generated data: docs page on
auto). The least of a dozen noisy risk estimates is optimistic (the winner's estimate tends to
have come out low), so the release is the simplest fit, in an order fixed before
any data (:func:`simplicity_order`: least squares, total held then free, then the smooth fits from
the heaviest weight down), whose estimate is within one standard error of the paired difference
above the least's (Hastie, Tibshirani and Friedman, ESL §7.10); a blend replaces it only when it
beats it by more than the blend's own standard error, and the positivity step takes the nearest
positive fit or blend within one standard error. ``select="least"`` is the rule of the paragraphs
above.

**The default** (:data:`DEFAULT_SELECTION`, ``"by_noise"``): under Gaussian noise (zCDP) the
release is ``select="se_weights"`` below, under Laplace noise (pure ε) ``select="least"``. On
generated data only (``bench_auto.py --select-generated``, new seeds, docs page on auto),
``"se_weights"`` was no worse than ``"least"`` beyond one standard error in any Gaussian row and
better on average, but worse in three Laplace rows, where the risk estimates are second-moment
approximations and not Stein's exact ones.

**Four more selections** (the evidence is on the docs page on auto).
``select="l1"`` (:func:`_least_absolute`) takes the fit of least estimated *absolute* error on the
workload's cells (:func:`~dpopt.estimate.choice.risk.absolute_risks`: the squared-error risk split
into the fitted cells' variance, from the Jacobian, and bias; a Gaussian per cell), since the
benchmark's metric is absolute and the squared-error rule cannot tell bias from noise.
``select="stack"`` releases the least-risk convex combination of *every* scored fit (the simplex
version of the pairwise blend; :func:`_aggregate`), ``select="ewa"`` the exponentially weighted
aggregate ``π_k ∝ exp(−R̂_k/β)`` at the worst-case temperature ``β = 8σ²`` of Dalalyan and Salmon
2012, Theorem 1(i) (proven for affine fits under Gaussian noise only; dpopt's fits are not affine:
:func:`_aggregate` says what is and is not covered), and ``select="se_weights"``
``π_k ∝ Φ(−(R̂_k − R̂_0)/se_k)``, each fit's weight the chance that its risk is below the least's
given its estimated gap in standard errors of the paired difference (:func:`evidence_weights`):
all three answer the selection's optimism (the least of a dozen noisy estimates is a noisy
minimum) by hedging instead of picking.

Measurements outside the marginals algebra (ranges, HDMM's p-Identity) have no residual statistics;
they are fitted by least squares under the constraints and non-negativity, and the report says that
no risk estimate was made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from dpopt.errors import DpoptError
from dpopt.estimate.choice.jacobian import DenseRows, EqualityRows, fitted_face, projection_jacobian, smooth_jacobian
from dpopt.estimate.choice.risk import (TableRisk, absolute_risks, blend_risks, coordinate_weights, difference_spread,
                                        identity_face, identity_l2_risks, identity_l2_variances, risk_spread,
                                        table_risks, table_set_matrix, table_variances, unbiased_risks)
from dpopt.estimate.choice.statistics import ResidualStatistics, residual_statistics
from dpopt.estimate.engines.smooth import default_smoothing
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Integrality, Invariant, NonNegativity
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Stack, Total, Weighted

__all__ = ["EstimatorCandidate", "FitChoice", "choose_fit", "DEFAULT_CANDIDATES", "MAX_COORDINATES"]

#: The smooth weights tried, as multiples of the default ``c`` (module notes).
SMOOTHING_FACTORS = (0.25, 1.0, 4.0, 16.0)
#: Families of residual statistics with more coordinates than this are not fitted (the Jacobians
#: are ``m × m``).
MAX_COORDINATES = 3000
#: Least squares on a subfamily of residuals fits dense rows: at most this many entries.
MAX_DENSE_L2 = 2_000_000
#: How the rule selects among the scored fits (:func:`choose_fit`'s ``select``): ``"by_noise"``,
#: ``"se_weights"`` (:func:`evidence_weights`) when every noisy measurement is Gaussian (Stein's
#: lemma holds and the risk estimates are exactly unbiased) and ``"least"`` (the least risk
#: estimate then the least-risk blend) under Laplace noise, where the estimates are second-moment
#: approximations; chosen on generated data only (docs page on auto).
DEFAULT_SELECTION = "by_noise"
#: The selections :func:`choose_fit` offers (``"l1"``: :func:`_least_absolute`; ``"one_se"``:
#: :func:`_one_standard_error`; ``"stack"``, ``"ewa"``, ``"se_weights"``: :func:`_aggregate`).
SELECTIONS = ("by_noise", "least", "one_se", "l1", "stack", "ewa", "se_weights")
#: A fit whose residual rows ``m`` and cells ``n`` have ``m² n`` at most this is handed to the
#: engines and the Jacobians as an explicit matrix (:func:`_explicit`).
EXPLICIT_GRAM = 20_000_000
#: Under Laplace noise, fits of residuals beyond the workload's are not candidates (their
#: second-moment risk estimate was measured 15-43% low). A module switch, not a parameter: it
#: exists so a benchmark can measure what re-admitting them does (``bench_auto.py
#: --select-generated --generated-rules least least@wide``; docs page on auto, where the result
#: is: not adopted).
LEAVE_OUT_WIDE_UNDER_LAPLACE = True


@dataclass(frozen=True)
class EstimatorCandidate:
    """One way to fit: ``objective`` (``"l2"`` or ``"smooth"``), the family of residuals fitted
    (``"all"``, ``"workload"``, ``"lower"``), for ``smooth`` the factor on the default weight, and
    whether the table's total is held at its estimate (``held``; least squares only may leave it
    free, when no invariant fixes it)."""

    objective: str
    family: str
    factor: float = 1.0
    held: bool = True
    label: str = ""

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        what = self.objective if self.objective == "l2" else f"smooth (c x {self.factor:g})"
        return f"{what} on {self.family}" + ("" if self.held else ", total free")


DEFAULT_CANDIDATES = tuple(
    [EstimatorCandidate("l2", "all"), EstimatorCandidate("l2", "all", held=False)]
    + [EstimatorCandidate("smooth", f, c) for f in ("all", "workload", "lower") for c in SMOOTHING_FACTORS])


@dataclass(eq=False)
class Evidence:
    """A candidate's fit and its estimated risk."""

    candidate: EstimatorCandidate
    status: str
    risk: float = float("nan")
    tables: list[TableRisk] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""
    result: object = None
    sets: int = 0
    spread: float = float("nan")
    dof: float = float("nan")
    fitted: np.ndarray | None = None
    #: The weighted workload's estimated expected absolute error, and per table
    #: (:func:`~dpopt.estimate.choice.risk.absolute_risks`); nan / None when not estimated (a blend).
    absolute_risk: float = float("nan")
    absolute: np.ndarray | None = None
    #: ``∂/∂d`` of the risk estimate's distance term with respect to the whitened noisy
    #: coordinates ``d_r = û_r / s_r`` (:func:`risk_gradient`); None when not computed.
    gradient: np.ndarray | None = None


@dataclass(eq=False)
class FitChoice:
    """The release's fit and the evidence for it.

    Attributes
    ----------
    result : dpopt.estimate.Result
        The chosen fit (its ``x`` is the released table before any rounding).
    chosen : Evidence or None
        None when no risk estimate could be made (``rule`` says why).
    evidence : list of Evidence
        Every candidate tried, with its risk.
    noisy_risk : list of float
        Per workload table: the risk of its noisy answers when it was measured directly, else of its
        unbiased least-squares answers (``inf`` when not supported).
    direct : list of bool
        Per workload table: measured directly.
    over_noisy : list of (label, released risk, noisy risk)
        Directly measured tables whose released risk exceeds the noisy answers'.
    rule : str
        The rule as applied, in one sentence.
    statistics : ResidualStatistics or None
    """

    result: object
    chosen: Evidence | None
    evidence: list[Evidence]
    noisy_risk: list[float]
    direct: list[bool]
    over_noisy: list[tuple[str, float, float]]
    rule: str
    statistics: ResidualStatistics | None = None
    select: str = DEFAULT_SELECTION

    def frame(self) -> pd.DataFrame:
        """One row per candidate: its estimated risk (weighted workload; squared error, and absolute
        error where estimated), status and time."""
        return pd.DataFrame([{"estimator": e.candidate.name, "residual_sets": e.sets, "risk": e.risk,
                              "absolute_risk": e.absolute_risk, "status": e.status, "seconds": e.seconds,
                              "chosen": e is self.chosen}
                             for e in self.evidence])

    def table_frame(self, workload) -> pd.DataFrame:
        """Per workload table: the chosen fit's estimated risk beside the noisy answers'."""
        rows = []
        chosen = self.chosen.tables if self.chosen is not None else [None] * len(workload.tables)
        for t, r, noisy, direct in zip(workload.tables, chosen, self.noisy_risk, self.direct):
            rows.append({"table": t.label, "released_risk": r.risk if r else float("nan"),
                         "complete": r.complete if r else False, "noisy_risk": noisy,
                         "noisy_is": "noisy answers" if direct else "least-squares answers"})
        return pd.DataFrame(rows)

    def lines(self, workload, max_tables: int = 12) -> list[str]:
        """The rule, every candidate's risk, the chosen fit's risk per table beside the noisy answers',
        and the never-worse-than-noisy statement (:meth:`promise`)."""
        out = [f"how to fit: {self.rule}"]
        if self.chosen is not None:
            for e in self.evidence:
                mark = "*" if e is self.chosen else " "
                figure = f"risk {e.risk:.6g}" if np.isfinite(e.risk) else f"{e.status}: {e.message}".rstrip(": ")
                if self.select == "l1" and np.isfinite(e.absolute_risk):
                    figure += f", absolute {e.absolute_risk:.6g}"
                out.append(f"  {mark} {e.candidate.name:<28} {figure}  ({e.sets} residual sets, {e.seconds:.2f} s)")
            frame = self.table_frame(workload)
            for row in frame.head(max_tables).itertuples(index=False):
                part = "" if row.complete else " (measured residuals only)"
                out.append(f"    {row.table}: estimated error {row.released_risk:.6g}{part}; {row.noisy_is} "
                           f"{row.noisy_risk:.6g}")
            if len(frame) > max_tables:
                out.append(f"    ... and {len(frame) - max_tables} more tables")
        out.extend(self.promise())
        return out

    def promise(self) -> list[str]:
        """Never worse than the noisy answers: met (with the count of tables it covers), not met (each
        table and by how much), or why it could not be checked."""
        count = sum(self.direct)
        if not count:
            return ["never worse than the noisy answers: no workload table was measured directly (the plan measured "
                    "other queries), so there are no noisy answers of a table to compare with"]
        if self.chosen is None:
            return [f"never worse than the noisy answers: NOT CHECKED for the {count} directly measured tables (no risk "
                    "estimate could be made)"]
        if not self.over_noisy:
            return [f"never worse than the noisy answers: met on all {count} directly measured workload tables "
                    "(estimated error at or below the noisy answers')"]
        out = [f"never worse than the noisy answers: NOT MET on {len(self.over_noisy)} of the {count} directly "
               "measured tables (no fitted candidate kept them all):"]
        for label, released, noisy in self.over_noisy:
            out.append(f"  {label}: estimated error {released:.6g} above its noisy answers' {noisy:.6g} "
                       f"(by {released - noisy:.4g}, {100 * (released / noisy - 1):.1f}%)")
        return out


def _direct_parts(query, variance: float):
    """``(marginal attrs or () for the total, variance per answer)`` of every marginal or total that
    ``query`` measures directly: itself, a scalar multiple (the answers divided by the weight have
    the variance divided by its square) or a part of a stack."""
    if isinstance(query, Marginal):
        yield query.attrs, variance
    elif isinstance(query, Total):
        yield (), variance
    elif isinstance(query, Weighted) and np.ndim(query.weights) == 0:
        yield from _direct_parts(query.query, variance / float(query.weights) ** 2)
    elif isinstance(query, Stack):
        for part in query.parts:
            yield from _direct_parts(part, variance)


def _noisy_tables(measurements: Sequence[Measurement], workload) -> tuple[list[float | None], list[bool]]:
    """Per table: the risk of its directly measured noisy answers (variance x cells; the least when
    measured more than once), or None."""
    found: dict[tuple[str, ...], float] = {}
    for m in measurements:
        for attrs, variance in _direct_parts(m.query, m.variance):
            cells = int(np.prod([m.domain.size_of(a) for a in attrs])) if attrs else 1
            risk = variance * cells
            found[attrs] = min(found.get(attrs, risk), risk)
    out = []
    for t in workload.tables:
        key = t.attrs if t.kind == "marginal" else (() if t.kind == "total" else None)
        out.append(found.get(key) if key is not None else None)
    return out, [r is not None for r in out]


def _identity_answers(noisy: Sequence[Measurement], cs: ConstraintSet) -> tuple[np.ndarray, float, float | None] | None:
    """``(y, variance, Laplace scale or None)`` when the noisy measurements are one identity and no
    invariant constrains the fit (least squares then has a closed-form risk:
    :func:`~dpopt.estimate.choice.risk.identity_l2_risks`), else None. The Laplace scale is the
    continuous law's of the same variance (``b = σ/√2``)."""
    if len(noisy) != 1 or not isinstance(noisy[0].query, Identity) or cs.invariants:
        return None
    m = noisy[0]
    laplace = m.noise in ("discrete_laplace", "laplace")
    return np.asarray(m.values, dtype=np.float64), float(m.variance), (float(np.sqrt(m.variance / 2.0)) if laplace
                                                                      else None)


def _search_groups(candidates: Sequence[EstimatorCandidate]) -> list[list[EstimatorCandidate]]:
    """The candidates in groups searched together: the smooth ones of one family by factor, every
    other alone (in the order given)."""
    groups: dict = {}
    for cand in candidates:
        key = ("smooth", cand.family, cand.held) if cand.objective == "smooth" else (id(cand),)
        groups.setdefault(key, []).append(cand)
    return [sorted(g, key=lambda c: c.factor) for g in groups.values()]


def _line_search(group: list[EstimatorCandidate], attempt) -> list[Evidence]:
    """Fit the factor nearest 1, then walk up the grid while the risk falls, and down when the
    first step up did not lower it (the risk of the smooth estimate against its weight is one
    valley in every case measured; a failed fit stops the walk on that side)."""
    def scored(ev):
        return ev is not None and ev.status == "OPTIMAL" and np.isfinite(ev.risk)

    if len(group) == 1:
        ev = attempt(group[0])
        return [] if ev is None else [ev]
    start = int(np.argmin([abs(np.log(c.factor)) for c in group]))
    done = {start: attempt(group[start])}
    if not scored(done[start]):
        for i, cand in enumerate(group):
            if i not in done:
                done[i] = attempt(cand)
        return [e for _, e in sorted(done.items()) if e is not None]
    best, improved_up = start, False
    for step in (1, -1):
        if step == -1 and improved_up:
            break
        i = start + step
        while 0 <= i < len(group):
            done[i] = attempt(group[i])
            if not (scored(done[i]) and done[i].risk < done[best].risk):
                break
            best = i
            improved_up = improved_up or step == 1
            i += step
    return [e for _, e in sorted(done.items()) if e is not None]


def _family_sets(stats: ResidualStatistics, workload, family: str) -> list[tuple[str, ...]]:
    closure = set(workload.closure())
    if family == "all":
        return list(stats.sets)
    if family == "workload":
        return [a for a in stats.sets if a in closure]
    top = set(workload.top_sets())
    return [a for a in stats.sets if a in closure and a not in top]


def _entries(measurements) -> float:
    """Non-zero entries of the measured rows (``Σ |Q_ij|^p`` with a tiny ``p`` counts them)."""
    total = 0.0
    for m in measurements:
        powers = m.query.column_norm_powers(1e-12)
        total += float(np.sum(powers)) if np.ndim(powers) else float(powers) * m.query.domain.size
    return total


def _fixed_total(cs: ConstraintSet) -> float | None:
    """The total the invariants fix (rows covering every cell once), else None."""
    for inv in cs.invariants:
        coverage = inv.query.rmatvec(np.ones(inv.query.num_rows))
        if np.allclose(coverage, 1.0):
            return float(np.sum(inv.values))
    return None


def _sigma_bar(stats: ResidualStatistics, sets) -> float:
    """``σ̄``: the noise of the fitted residual coordinates in the units of ±1 contrasts (a parity's
    unnormalised row), ``sqrt(n)`` times the root harmonic mean of the coordinate variances."""
    var = np.concatenate([np.full(int(stats._basis.dims[stats.index(a)]), stats.variance_of(a)) for a in sets])
    return float(np.sqrt(stats.domain.size * var.size / np.sum(1.0 / var)))


def choose_fit(measurements: Sequence[Measurement], constraints: ConstraintSet, workload,
               candidates: Sequence[EstimatorCandidate] = DEFAULT_CANDIDATES, time_limit: float | None = None,
               blend: bool = True, select: str | None = None) -> FitChoice:
    """Fit every candidate, estimate its risk, take the least (module notes).

    Parameters
    ----------
    measurements : sequence of Measurement
        The noisy measurements of the release.
    constraints : ConstraintSet
        The release's constraints; non-negativity is added when absent.
    workload : Workload
        The tables the release is judged on.
    candidates : sequence of EstimatorCandidate
    time_limit : float, optional
        Seconds for each solve.
    blend : bool
        Whether blends and the positive preference (:func:`_blend_or_positive`) are considered
        (default; off only to measure what they bring).
    select : {"by_noise", "least", "one_se", "l1", "stack", "ewa", "se_weights"}, optional
        ``"least"``: the least risk estimate, then the least-risk blend (:func:`_blend_or_positive`);
        ``"one_se"``: the simplest fit within one standard error of the least, blended only when the
        blend beats it by more than the blend's standard error (:func:`_one_standard_error`);
        ``"l1"``: the least estimated absolute error on the workload's cells, then the positivity
        step only (:func:`_least_absolute`); ``"stack"``, ``"ewa"``, ``"se_weights"``: a convex
        combination of every scored fit (:func:`_aggregate`); ``"by_noise"``: ``"se_weights"`` when
        every noisy measurement is Gaussian, else ``"least"``. Default :data:`DEFAULT_SELECTION`.
    """
    from dpopt.estimate import reconstruct

    select = DEFAULT_SELECTION if select is None else select
    if select not in SELECTIONS:
        raise DpoptError(f"choose_fit: select must be one of {', '.join(map(repr, SELECTIONS))}, not {select!r}")

    cs = constraints if constraints.nonnegative else ConstraintSet(constraints.domain,
                                                                    [*constraints.constraints, NonNegativity()])
    noisy = [m for m in measurements if m.variance > 0]
    direct_risk, direct = _noisy_tables(noisy, workload)
    stats = residual_statistics(noisy) if (workload.is_marginal and noisy) else None
    if stats is None:
        result = reconstruct(list(measurements), cs, "l2", time_limit=time_limit, integer=False)
        noisy_risk = [r if r is not None else float("nan") for r in direct_risk]
        return FitChoice(result, None, [], noisy_risk, direct, [],
                         "least squares under the constraints and non-negativity (no risk estimate: the "
                         "measurements are not all marginals, residuals or the identity)")
    unbiased = unbiased_risks(stats, workload)
    noisy_risk = [r if r is not None else u for r, u in zip(direct_risk, unbiased)]
    laplace = any(m.noise in ("discrete_laplace", "laplace") for m in noisy)
    default_note = ""
    if select == "by_noise":
        select = "least" if laplace else "se_weights"
        default_note = (" (select='by_noise': " + ("'least' under Laplace noise)" if laplace
                                                   else "'se_weights' under Gaussian noise)"))
    identity = _identity_answers(noisy, cs)
    held = stats.total() if not cs.invariants else None
    evidence: list[Evidence] = []
    done_families: dict = {}
    wide = len(_family_sets(stats, workload, "all")) > len(_family_sets(stats, workload, "workload"))

    def attempt(cand: EstimatorCandidate) -> Evidence | None:
        sets = _family_sets(stats, workload, cand.family)
        closed_form = identity is not None and cand.objective == "l2" and list(sets) == list(stats.sets)
        if LEAVE_OUT_WIDE_UNDER_LAPLACE and laplace and wide and cand.family == "all" and not closed_form:
            # Residuals beyond the workload's (the identity's higher orders) let a fit resolve single
            # cells, where Laplace noise is far from Gaussian: the second-moment risk estimate of such
            # fits was measured 15-43% low (module notes), so they are not candidates.
            return Evidence(cand, "left out", message="fits residuals beyond the workload's under Laplace noise",
                            sets=len(sets))
        key = (cand.objective, cand.factor, cand.held, tuple(sets))
        if not sets or () not in sets and held is not None and cand.held:
            return Evidence(cand, "empty family" if not sets else "the total's residual is not measured")
        if not cand.held and (held is None or cand.objective != "l2"):
            return None  # nothing to leave free (invariants fix the total), or not offered
        if key in done_families:
            return None  # the same family under another name (e.g. "all" = "workload")
        done_families[key] = cand
        coords = sum(int(stats._basis.dims[stats.index(a)]) for a in sets)
        if coords > MAX_COORDINATES and not closed_form:
            return Evidence(cand, f"{coords} coordinates, above {MAX_COORDINATES}", sets=len(sets))
        start = time.perf_counter()
        try:
            ev = _fit_one(cand, stats, sets, cs, held if cand.held else None, workload, time_limit, reconstruct,
                          noisy, identity if closed_form else None, absolute=select == "l1",
                          gradient=select == "se_weights")
        except DpoptError as exc:
            ev = Evidence(cand, "refused", message=str(exc).split("\n")[0])
        ev.seconds = time.perf_counter() - start
        ev.sets = len(sets)
        return ev

    for group in _search_groups(candidates):
        for ev in _line_search(group, attempt):
            evidence.append(ev)
    ok = [e for e in evidence if e.status == "OPTIMAL" and np.isfinite(e.risk)]
    if not ok:
        why = "; ".join(f"{e.candidate.name}: {e.status} {e.message}" for e in evidence)
        result = reconstruct(list(measurements), cs, "l2", time_limit=time_limit, integer=False)
        return FitChoice(result, None, evidence, noisy_risk, direct, [],
                         f"least squares under the constraints (no candidate could be fitted and scored: {why})", stats)
    keeps = [e for e in ok if all(r.risk <= nr for r, nr, dr in zip(e.tables, noisy_risk, direct) if dr)]
    pool = keeps or ok
    best = min(pool, key=lambda e: e.risk)
    absolute_note = ""
    if select == "l1":
        chosen, blend_note, absolute_note = _least_absolute(best, pool, stats, workload, cs, blend)
    elif select in ("stack", "ewa", "se_weights"):
        chosen, blend_note = _aggregate(best, pool, stats, workload, cs, select)
    elif select == "one_se":
        chosen, blend_note = _one_standard_error(best, pool, stats, workload, cs, blend)
    else:
        chosen, blend_note = _blend_or_positive(best, pool, stats, workload, cs) if blend else (best, "")
    if chosen not in evidence:
        evidence.append(chosen)
    over = [(r.label, r.risk, nr) for r, nr, dr in zip(chosen.tables, noisy_risk, direct) if dr and r.risk > nr]
    complete = all(r.complete for r in chosen.tables)
    searched = " (the smooth weight searched along its grid while the risk falls)"
    if laplace:
        rule = (f"the least risk estimate of the weighted workload error among {len(ok)} fitted candidates"
                + searched + ": Stein's formula with the Laplace variances (a second-moment estimate)"
                + ("; for least squares on the histogram its exact Laplace form (zero-bias transform)"
                   if identity is not None else "")
                + "; other fits of more residuals than the workload's are left out under Laplace noise")
    else:
        rule = f"the least Stein unbiased risk estimate of the weighted workload error among {len(ok)} fitted candidates" \
            + searched
    rule += default_note
    if absolute_note:
        rule += absolute_note
    if blend_note:
        rule += blend_note
    if not complete:
        rule += (" (over the residuals the measurements saw: the top-order interactions of the workload were not "
                 "measured, so their error is not estimable)")
    if any(direct):
        rule += ("; among the fits that keep every directly measured table at or below its noisy answers" if keeps
                 else "; no candidate keeps every directly measured table at or below its noisy answers")
    return FitChoice(chosen.result, chosen, evidence, noisy_risk, direct, over, rule, stats, select)


def _least_absolute(best: Evidence, pool: list[Evidence], stats: ResidualStatistics, workload, cs: ConstraintSet,
                    blend: bool = True) -> tuple[Evidence, str, str]:
    """``select="l1"``: the fit of least estimated absolute error on the workload's cells
    (:func:`~dpopt.estimate.choice.risk.absolute_risks`: each table's squared-error risk estimate
    split into its fitted cells' variance, from the fit's Jacobian, and the rest, read as bias;
    ``E |bias + noise|`` of a Gaussian per cell). The squared-error rule ranks a fit whose error is
    bias the same as one whose error is noise at equal squared error; absolute error does not (a
    noise-only error is ``√(2/π)`` of an even bias's), and the benchmark's metric is absolute.

    Then positivity only: when the fit leaves cells at exactly 0, the positivity step of
    :func:`_blend_or_positive` (the least-squared-risk blend with a positive fit, or the nearest
    positive fit within one standard error). No blend is formed otherwise: a blend's absolute error
    is not estimated (its cells' variance needs the two fits' covariance), and a blend scored by
    the squared-error risk would lean back to that rule's choice. ``(chosen, blend note, rule note)``."""
    scored = [e for e in pool if np.isfinite(e.absolute_risk)]
    if not scored:
        return best, "", ("; no fit had an absolute-error estimate, so the least squared-error risk was taken "
                          "(select='l1')")
    first = min(scored, key=lambda e: e.absolute_risk)
    note = (f"; by the least estimated absolute error (select='l1'): {first.candidate.name}, "
            f"{first.absolute_risk:.6g} (least squared-error risk: {best.candidate.name})")
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
    if not blend or _positive(first, free):
        return first, "", note
    chosen, blend_note = _blend_or_positive(first, pool, stats, workload, cs)
    return chosen, blend_note, note


def _combination_risks(fits: list[Evidence], stats: ResidualStatistics, workload):
    """``(M, D)`` with the risk estimate of ``Σ_k π_k x̂_k`` (``π`` fixed, ``Σ π = 1``) on table ``T``
    equal to ``πᵀ M[T] π + D[T] π`` exactly (the same estimate as the fits'; the pairwise form is
    :func:`~dpopt.estimate.choice.risk.blend_risks`): ``M[T]_kl`` the table's inner product of the gaps
    ``ĉ_k − û``, ``l``'s, and ``D[T]_k`` the rest of fit ``k``'s risk (its Jacobian term)."""
    matrix = table_set_matrix(stats, workload)
    gaps = [e.fitted - stats.coordinates for e in fits]
    K = len(fits)
    M = np.zeros((len(workload.tables), K, K))
    for k in range(K):
        for l in range(k, K):
            M[:, k, l] = M[:, l, k] = matrix @ _per_set_products(stats, gaps[k], gaps[l])
    D = np.array([[r.risk for r in e.tables] for e in fits]).T - np.einsum("tkk->tk", M)
    return M, D


def _per_set_products(stats: ResidualStatistics, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(stats._basis.dims)[:-1]]).astype(int)
    return np.add.reduceat(a * b, starts)


def _simplex_least(M: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """``argmin πᵀMπ + dᵀπ`` over the simplex (``M`` positive semidefinite: a convex QP of a dozen
    weights), by SLSQP from the best vertex; the KKT conditions are checked here (every weight used
    has the least gradient, to 1e-6 of the objective's scale); None when they do not hold."""
    from scipy.optimize import minimize

    K = d.size
    scale = max(float(np.abs(M).max()), float(np.abs(d).max()), 1e-300)
    Ms, ds = M / scale, d / scale
    start = np.zeros(K)
    start[int(np.argmin(np.diag(Ms) + ds))] = 1.0
    res = minimize(lambda p: p @ Ms @ p + ds @ p, start, jac=lambda p: 2 * Ms @ p + ds, method="SLSQP",
                   bounds=[(0.0, 1.0)] * K, constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0,
                                                          "jac": lambda p: np.ones(K)}],
                   options={"ftol": 1e-12, "maxiter": 500})
    p = np.clip(res.x, 0.0, None)
    if not np.isfinite(p).all() or p.sum() <= 0:
        return None
    p /= p.sum()
    grad = 2 * Ms @ p + ds
    level = float(grad @ p)
    used = p > 1e-8
    tol = 1e-6 * max(1.0, float(np.abs(grad).max()))
    if np.any(np.abs(grad[used] - level) > tol) or np.any(grad[~used] < level - tol):
        return None
    return p


def exponential_weights(risks: np.ndarray, beta: float) -> np.ndarray:
    """``π_k ∝ exp(−R̂_k / β)``, normalised (computed from ``R̂_k − min R̂`` so that no weight underflows
    to a 0/0): the exponentially weighted aggregate's weights at temperature ``β`` (Dalalyan and
    Salmon, *Ann. Statist.* 40 (2012), Eq. (2.2) with a uniform prior; their ``n r̂`` is the total
    risk ``R̂`` here)."""
    risks = np.asarray(risks, dtype=np.float64)
    pi = np.exp(-(risks - risks.min()) / float(beta))
    return pi / pi.sum()


def evidence_weights(gaps: np.ndarray, spreads: np.ndarray) -> np.ndarray:
    """``π_k ∝ Φ(−D_k / se_k)``, normalised: the weight of each fit is the chance, under a Gaussian
    reading of its risk estimate's noise, that its risk is below the least-risk fit's.

    ``D_k = R̂_k − R̂_0 ≥ 0`` is fit ``k``'s estimated excess risk over the least-risk fit ``0`` and
    ``se_k`` the standard error of that paired difference (:func:`_aggregate` takes the delta method,
    ``‖∇R̂_k − ∇R̂_0‖`` in the whitened noisy coordinates, :func:`risk_gradient`). Reading
    ``D_k ~ N(Δ_k, se_k²)`` with a flat prior on the true excess risk ``Δ_k`` gives
    ``P(Δ_k < 0 | D_k) = Φ(−D_k / se_k)``; the least-risk fit itself gets ``Φ(0) = 1/2``. So the
    weights concentrate on the least-risk fit when the estimates separate the fits by several of
    their own standard errors (``Φ(−3) ≈ 0.0013``) and spread when the differences are within
    their noise; no constant is set. A fit identical to the least-risk one on every coordinate
    (``se_k = 0``) gets ``1/2`` when ``D_k = 0`` and ``0`` when ``D_k > 0``. Approximations, each
    stated: the difference Gaussian, its standard error linearised, the prior flat, each fit
    compared with the least-risk one alone (not the chance of being the best of all)."""
    from scipy.special import ndtr

    gaps = np.asarray(gaps, dtype=np.float64)
    spreads = np.asarray(spreads, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spreads > 0, gaps / np.where(spreads > 0, spreads, 1.0), np.where(gaps > 0, np.inf, 0.0))
    pi = ndtr(-z)
    return pi / pi.sum()


def _aggregate(best: Evidence, pool: list[Evidence], stats: ResidualStatistics, workload, cs: ConstraintSet,
               how: str) -> tuple[Evidence, str]:
    """A convex combination of every scored fit instead of one of them (``select="stack"``,
    ``"ewa"`` or ``"se_weights"``): the least risk estimate is one draw of a noisy minimum, and a
    combination hedges it.

    * ``"stack"``: the weights of least risk estimate over the simplex, an exact quadratic
      (:func:`_combination_risks`; stacking, Breiman, *Machine Learning* 24 (1996), scored by the
      risk estimate instead of cross-validation; the pairwise blends of :func:`_blend_or_positive`
      are its two-fit case).
    * ``"ewa"``: exponential weights ``π_k ∝ exp(−R̂_k / β)`` (:func:`exponential_weights`) at
      ``β = 8 σ²``, ``σ²`` the largest noise variance of a coordinate in the loss's own units,
      ``max_r ω_r s_r²`` over the coordinates where the fits differ (the loss is weighted; ``ω_r``:
      :func:`~dpopt.estimate.choice.risk.coordinate_weights`). **What is proven** (Dalalyan and
      Salmon, *Ann. Statist.* 40 (2012) 2327–2355, Theorem 1, checked against the paper's text):
      under Gaussian noise ``N(0, Σ)`` and for *affine* estimators ``A_λ Y + b_λ`` with ``A_λ``
      symmetric, (i) pairwise commuting, ``A_λΣ + ΣA_λ ≽ 0`` and ``b_λ = 0``: for
      ``β ≥ 8 |||Σ|||`` (spectral norm) the aggregate with the unbiased risk estimate has
      ``E‖x̂_π − x‖² ≤ min_k E‖x̂_k − x‖² + β log K`` (uniform prior over ``K`` fits); (ii) with
      ``A_λ ≼ I`` and ``A_λ b_λ = 0`` only: the same for ``β ≥ 4 |||Σ|||`` with an adjusted risk
      estimate and an extra term ``f⊤(A_λ − A_λ²)f + Tr Σ(A_λ − A_λ²)`` that vanishes for
      projections (extending Leung and Barron, *IEEE Trans. Inf. Theory* 52 (2006) 3396–3410,
      Corollary 6, projection estimators under i.i.d. noise, as Dalalyan and Salmon state it; Leung
      and Barron's own text was not read here). **What is not**: dpopt's fits are not affine (the
      non-negative projection is affine only on the face it lands on, which moves with the noise;
      the smooth fit is non-linear), their risk estimates jump where a face changes (so the
      aggregate is not weakly differentiable and Stein's lemma, the proof's tool, does not apply),
      the noise is Laplace under pure ε (the theorem is Gaussian only), and taking ``σ²`` over the
      coordinates where the fits differ rather than over all is dpopt's, not the theorem's. The 8
      is part (i)'s constant, a worst-case temperature, not a bound that holds here.
    * ``"se_weights"``: ``π_k ∝ Φ(−(R̂_k − R̂_0) / se_k)`` (:func:`evidence_weights`), the temperature
      set per fit by the evidence: concentrated at high signal, spread at low. ``se_k`` is the
      delta-method standard error ``‖∇R̂_k − ∇R̂_0‖`` of the paired difference (:func:`risk_gradient`;
      the held-fixed :func:`~dpopt.estimate.choice.risk.difference_spread`, ``2‖Σ^½ W (ĉ_k − ĉ_0)‖``,
      when a fit has no gradient: least squares on a subfamily). The held-fixed form overstates the
      noise of the difference for a fit far from the least-risk one that moves with the noise
      as it does (the clamp against the held total: 3.5 times the spread of the difference over 40
      draws, 5,000 records, ε = 0.1), which left such fits a weight near ``Φ(−1)``.

    The combination keeps every linear constraint the fits keep (re-checked) and its per-table risk
    is convex in ``π``, so a table every fit keeps at or below its noisy answers stays there."""
    scored = [e for e in pool if e.fitted is not None and np.isfinite(e.risk)]
    if len(scored) < 2:
        return best, ""
    M, D = _combination_risks(scored, stats, workload)
    weights = np.array([t.weight for t in workload.tables], dtype=np.float64)
    Mw, dw = np.einsum("t,tkl->kl", weights, M), weights @ D
    risks = np.array([e.risk for e in scored])
    if how == "stack":
        pi = _simplex_least(Mw, dw)
        if pi is None:
            return best, "; the stacking weights failed their optimality check: the least-risk fit is taken"
        what = "stacking (the least risk estimate over convex combinations of every fit)"
    elif how == "ewa":
        gaps = np.array([e.fitted for e in scored])
        differ = np.ptp(gaps, axis=0) > 1e-9 * max(1.0, float(np.abs(gaps).max()))
        w = coordinate_weights(stats, workload)
        s2 = np.repeat(stats.variances, stats._basis.dims)
        beta = 8.0 * float(np.max((w * s2)[differ])) if differ.any() else 1.0
        pi = exponential_weights(risks, beta)
        what = f"exponential weights exp(-risk / {beta:.4g}) (temperature 8 x the largest coordinate noise)"
    else:
        least = scored[int(np.argmin(risks))]
        spreads = np.array([float(np.linalg.norm(e.gradient - least.gradient))
                            if e.gradient is not None and least.gradient is not None
                            else difference_spread(stats, workload, least.fitted, e.fitted) for e in scored])
        pi = evidence_weights(risks - least.risk, spreads)
        what = ("weights Phi(-(risk - least risk) / standard error of the difference) (the chance that each fit's "
                "risk is below the least-risk fit's)")
    tables = np.einsum("k,tkl,l->t", pi, M, pi) + D @ pi
    ev = _combination(scored, pi, float(weights @ tables), tables, stats, workload, cs)
    if ev is None:
        return best, "; the combination broke a constraint its fits keep: the least-risk fit is taken"
    top = np.argsort(pi)[::-1][:3]
    parts = ", ".join(f"{pi[k]:.3g} x {scored[k].candidate.name}" for k in top if pi[k] > 1e-3)
    return ev, f"; released: {what}, {parts} (estimated risk {ev.risk:.6g})"


def _combination(fits: list[Evidence], pi: np.ndarray, risk: float, tables: np.ndarray, stats: ResidualStatistics,
                 workload, cs: ConstraintSet) -> Evidence | None:
    """The evidence of ``Σ_k π_k x̂_k`` (:func:`_blend`'s, for any number of fits)."""
    from dpopt.estimate.result import Result

    first = fits[int(np.argmax(pi))]
    x = np.einsum("k,kn->n", pi, np.array([e.result.x for e in fits]))
    result = Result(dict(first.result))
    result.x = x
    result.message = "convex combination of " + ", ".join(f"{p:.4g} x ({e.candidate.name})"
                                                          for p, e in zip(pi, fits) if p > 0)
    result.info = {**dict(first.result.get("info") or {}),
                   "combination": {e.candidate.name: float(p) for p, e in zip(pi, fits) if p > 0}}
    kept = set.intersection(*[set(e.result.constraint_residuals["constraint"]) for e in fits
                              if len(e.result.constraint_residuals)] or [set()])
    if not _keeps_constraints(result, x, kept, fits, cs):
        return None
    cand = EstimatorCandidate("blend", first.candidate.family, float(pi.max()), first.candidate.held,
                              label="combination: " + " + ".join(f"{p:.2g} x {e.candidate.name}"
                                                                 for p, e in zip(pi, fits) if p > 1e-3))
    risks = [TableRisk(t.label, float(r), all(e.tables[i].complete for e in fits))
             for i, (t, r) in enumerate(zip(workload.tables, tables))]
    fitted = np.einsum("k,kn->n", pi, np.array([e.fitted for e in fits]))
    return Evidence(cand, first.status, risk, risks, result=result, message=result.message, sets=first.sets,
                    spread=risk_spread(stats, workload, fitted), fitted=fitted)


def _positive(ev: Evidence, free: np.ndarray) -> bool:
    """Whether the fit leaves every cell that no structural zero fixes strictly positive."""
    x = getattr(ev.result, "x", None)
    return x is not None and bool(np.all(np.asarray(x)[free] > 0))


def _blend_or_positive(best: Evidence, pool: list[Evidence], stats: ResidualStatistics, workload,
                       cs: ConstraintSet) -> tuple[Evidence, str]:
    """The least-risk blend of the least-risk fit with one other; a positive release when the
    risk estimates cannot tell a positive fit from one with exact zeros (module notes).

    1. **The least-risk blend**: for every other fit ``x̂'`` of the pool, the convex combination
       ``(1 − α) x̂⁰ + α x̂'`` of the least-risk fit ``x̂⁰`` whose risk estimate (a quadratic in ``α``,
       :func:`~dpopt.estimate.choice.risk.blend_risks`: the same estimate as the fits', exactly) is
       least over ``α ∈ [0, 1]``; when some blend's least is below ``x̂⁰``'s at an ``α > 0``, the
       least-risk blend is released (stacking, Breiman, *Machine Learning* 24 (1996), scored by the
       unbiased risk estimate instead of cross-validation). A blend keeps every linear constraint
       both fits keep, and every directly measured table at or below its noisy answers when both
       fits do, its risk being convex in ``α``.
    2. **Positivity.** A fit with exact zeros (least squares, the clamp) claims that no record
       falls in those cells; a positive fit (the smooth estimate) does not, and its relative
       entropy to any table the data could hold is finite. When ``x̂⁰`` has such zeros, its partners
       in 1 are the positive fits only (the blend is then positive); when no blend lowers the
       risk, the positive fit nearest ``x̂⁰`` among those within one standard error of the paired
       difference above ``x̂⁰``'s (:func:`~dpopt.estimate.choice.risk.difference_spread`; the
       one-standard-error rule, Hastie, Tibshirani and Friedman, *The Elements of Statistical
       Learning*, 2nd ed., §7.10) is released; else ``x̂⁰``.

    Risks, blend weights and standard errors come from the noisy answers and the public noise laws
    only.
    """
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
    if best.fitted is None:
        return best, ""
    zeros = not _positive(best, free)
    # With zeros, only a positive partner makes a positive blend; else every other fit may lower the risk.
    partners = [e for e in pool if e.fitted is not None and e is not best and (not zeros or _positive(e, free))]
    if not partners:
        return best, ""
    blends = _lowering_blends(best, partners, stats, workload)
    if blends:
        risk, alpha, other, tables = min(blends, key=lambda b: b[0])
        ev = _blend(best, other, alpha, risk, tables, stats, workload, cs)
        if ev is None:
            return best, "; a blend was checked and broke a constraint its fits keep, so it was not taken"
        return ev, (f"; the least-risk convex combination of the least-risk fit ({best.candidate.name}, "
                    f"{best.risk:.6g}) with another{' positive' if zeros else ''} fit is taken: {1 - alpha:.3g} x that "
                    f"fit + {alpha:.3g} x {other.candidate.name} (estimated risk {risk:.6g})")
    if not zeros:
        return best, ""
    within = []
    for e in partners:
        spread = difference_spread(stats, workload, best.fitted, e.fitted)
        if e.risk - best.risk <= spread:
            within.append((spread, e))
    if not within:
        return best, ""
    spread, other = min(within, key=lambda p: p[0])
    return other, (f"; the least-risk fit ({best.candidate.name}, {best.risk:.6g}) leaves cells at exactly 0, and the "
                   f"positive {other.candidate.name} is within one standard error of it ({other.risk:.6g}, standard "
                   f"error of the difference {spread:.4g}): the positive fit is taken")


def _lowering_blends(first: Evidence, partners: list[Evidence], stats: ResidualStatistics, workload) -> list:
    """``(risk, α, partner, per-table risks)`` of the least-risk convex combination
    ``(1 − α) x̂ + α x̂'`` of ``first`` with each partner, for those whose least is below ``first``'s
    risk at an ``α > 0`` (the risk a quadratic in ``α``:
    :func:`~dpopt.estimate.choice.risk.blend_risks`)."""
    weights = np.array([t.weight for t in workload.tables], dtype=np.float64)
    own = np.array([r.risk for r in first.tables])
    matrix = table_set_matrix(stats, workload)
    out = []
    for e in partners:
        q0, q1, q2 = blend_risks(stats, workload, first.fitted, e.fitted, own, np.array([r.risk for r in e.tables]),
                                 matrix)
        c0, c1, c2 = float(weights @ q0), float(weights @ q1), float(weights @ q2)
        alpha = min(max(-c1 / (2.0 * c2), 0.0), 1.0) if c2 > 0 else (1.0 if c1 < 0 else 0.0)
        risk = c0 + c1 * alpha + c2 * alpha**2
        if alpha > 0 and risk < first.risk:
            out.append((risk, alpha, e, q0 + q1 * alpha + q2 * alpha**2))
    return out


def simplicity_order(candidates: Sequence[EstimatorCandidate]) -> list[EstimatorCandidate]:
    """The candidates from simplest to least simple, for the one-standard-error rule: least squares
    before the smooth estimate (no tuning weight; the fit the noisy answers' own projection gives),
    the total held before left free (one more constraint), then the smooth fits from the heaviest
    weight to the lightest (more smoothing, fewer effective degrees of freedom), each weight's
    families in the order ``all``, ``workload``, ``lower``. The order is fixed before any data."""
    families = {"all": 0, "workload": 1, "lower": 2}
    return sorted(candidates, key=lambda c: (c.objective != "l2", not c.held, -c.factor if c.objective == "smooth"
                                             else 0.0, families.get(c.family, 3)))


def _one_standard_error(best: Evidence, pool: list[Evidence], stats: ResidualStatistics, workload,
                        cs: ConstraintSet, blend: bool = True) -> tuple[Evidence, str]:
    """The one-standard-error rule (Hastie, Tibshirani and Friedman, *The Elements of Statistical
    Learning*, 2nd ed., §7.10), applied to the fit and to the blend alike.

    The least of a dozen noisy risk estimates is optimistic: the fit that wins is, more often than
    not, one whose estimate came out low. So:

    1. **The preferred fit** is the first, in :func:`simplicity_order`, whose risk estimate is
       within one standard error of the paired difference above the least's,
       ``R̂(x̂) − R̂(x̂⁰) ≤ se(x̂, x̂⁰)`` (:func:`~dpopt.estimate.choice.risk.difference_spread`: the
       noise both estimates share cancels).
    2. **A blend** ``(1 − α) x̂ + α x̂'`` of the preferred fit with one other (the least-risk weight,
       :func:`~dpopt.estimate.choice.risk.blend_risks`) is released only when its risk estimate is
       below the preferred fit's by more than the standard error of that difference,
       ``α · se(x̂, x̂')``; the least-risk such blend. The blend step cannot undo step 1: a blend
       wins only as a fit would have had to.
    3. **Positivity.** When the release so far has cells at exactly 0 (no structural zero fixing
       them), the partners in 2 are the positive fits only, and when no blend clears its standard
       error, the positive fit or blend (with a positive fit, at its least-risk weight) nearest the
       preferred fit (least standard error of the difference) among those within one standard
       error of it is released, so that relative entropy to any table the data could hold is
       finite; else the preferred fit.

    No tuned constant: the one standard error is the rule's own, and every figure comes from the
    noisy answers and the public noise laws.
    """
    scored = [e for e in pool if e.fitted is not None]
    if best.fitted is None or not scored:
        return best, ""
    by_candidate = {id(e.candidate): e for e in scored}
    ordered = [by_candidate[id(c)] for c in simplicity_order([e.candidate for e in scored])]
    preferred = best
    for e in ordered:
        if e is best or e.risk - best.risk <= difference_spread(stats, workload, best.fitted, e.fitted):
            preferred = e
            break
    note = ""
    if preferred is not best:
        note = (f"; one-standard-error rule: {preferred.candidate.name} (risk {preferred.risk:.6g}) is the simplest "
                f"fit within one standard error of the least ({best.candidate.name}, {best.risk:.6g})")
    if not blend:
        return preferred, note
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
    zeros = not _positive(preferred, free)
    partners = [e for e in scored if e is not preferred and (not zeros or _positive(e, free))]
    if not partners:
        return preferred, note
    blends = [(risk, alpha, e, tables, alpha * difference_spread(stats, workload, preferred.fitted, e.fitted))
              for risk, alpha, e, tables in _lowering_blends(preferred, partners, stats, workload)]
    clear = [b for b in blends if preferred.risk - b[0] > b[4]]
    if clear:
        risk, alpha, other, tables, se = min(clear, key=lambda b: b[0])
        ev = _blend(preferred, other, alpha, risk, tables, stats, workload, cs)
        if ev is not None:
            return ev, note + (f"; a blend beats it by more than one standard error ({se:.4g}): {1 - alpha:.3g} x "
                               f"that fit + {alpha:.3g} x {other.candidate.name} (estimated risk {risk:.6g})")
    if not zeros:
        return preferred, note
    near = [(b[4], b) for b in blends]  # these blends lower the risk: within one standard error
    near += [(s, e) for e in partners for s in [difference_spread(stats, workload, preferred.fitted, e.fitted)]
             if e.risk - preferred.risk <= s]
    for se, what in sorted(near, key=lambda p: p[0]):
        if isinstance(what, Evidence):
            return what, note + (f"; it leaves cells at exactly 0, and the positive {what.candidate.name} is the "
                                 f"nearest fit within one standard error ({what.risk:.6g}, {se:.4g})")
        risk, alpha, other, tables, _ = what
        ev = _blend(preferred, other, alpha, risk, tables, stats, workload, cs)
        if ev is not None:
            return ev, note + (f"; it leaves cells at exactly 0: the nearest positive release within one standard "
                               f"error is {1 - alpha:.3g} x that fit + {alpha:.3g} x {other.candidate.name} "
                               f"(estimated risk {risk:.6g}, standard error {se:.4g})")
    return preferred, note


def _blend(first: Evidence, second: Evidence, alpha: float, risk: float, tables: np.ndarray,
           stats: ResidualStatistics, workload, cs: ConstraintSet) -> Evidence | None:
    """The evidence of ``(1 − α) x̂¹ + α x̂²``: its table, result (constraints re-checked at the
    combination) and per-table risks; None when the combination breaks a constraint by more than
    both fits do (linear constraints cannot, but the check is the release's, not an argument's)."""
    from dpopt.estimate.result import Result

    x = (1.0 - alpha) * first.result.x + alpha * second.result.x
    result = Result(dict(first.result))
    result.x = x
    result.message = (f"convex combination {1 - alpha:.4g} x ({first.candidate.name}) + {alpha:.4g} x "
                      f"({second.candidate.name}); both {first.status}")
    result.info = {**dict(first.result.get("info") or {}), "blend": {"first": first.candidate.name,
                                                                    "second": second.candidate.name,
                                                                    "alpha": alpha}}
    kept = set(first.result.constraint_residuals["constraint"]) if len(first.result.constraint_residuals) else set()
    if not _keeps_constraints(result, x, kept, (first, second), cs):
        return None
    cand = EstimatorCandidate("blend", first.candidate.family, alpha, first.candidate.held,
                              label=f"blend: {first.candidate.name} + {alpha:.2g} x {second.candidate.name}")
    risks = [TableRisk(t.label, float(r), a.complete and b.complete)
             for t, r, a, b in zip(workload.tables, tables, first.tables, second.tables)]
    fitted = (1.0 - alpha) * first.fitted + alpha * second.fitted
    return Evidence(cand, first.status, risk, risks, result=result, message=result.message, sets=first.sets,
                    spread=risk_spread(stats, workload, fitted), fitted=fitted)


def _keeps_constraints(result, x: np.ndarray, kept: set, fits, cs: ConstraintSet) -> bool:
    """Re-check the constraints ``kept`` at the combination ``x`` of ``fits`` (into ``result``'s
    residuals) and say whether none is broken by more than the worst of the fits breaks it
    (integrality aside: a fractional fit's, by design)."""
    from dpopt.estimate.result import CONSTRAINT_COLUMNS, largest_violation

    rows = [r for r in cs.residuals(x) if r["constraint"] in kept]
    result.constraint_residuals = pd.DataFrame(rows, columns=CONSTRAINT_COLUMNS)
    result.max_violation = largest_violation(rows) if rows else 0.0
    parents = [dict(zip(e.result.constraint_residuals["constraint"], e.result.constraint_residuals["max_violation"]))
               for e in fits]
    scale = max(1.0, float(np.abs(x).max(initial=0.0)))
    rounding = {c.key for c in cs.constraints if isinstance(c, Integrality)}
    return not any(r["constraint"] not in rounding
                   and r["max_violation"] > max(p.get(r["constraint"], 0.0) for p in parents) + 1e-9 * scale
                   for r in rows)


def _explicit(meas: Measurement) -> Measurement:
    """``meas`` with its residual rows as one dense array (:class:`~dpopt.estimate.choice.jacobian.DenseRows`)
    when ``m² n`` is at most :data:`EXPLICIT_GRAM` (the audit's tiny domains, small tables): the
    smooth engine's Newton systems and the Jacobians then take one BLAS product for
    ``C diag(x) Cᵀ`` instead of the residual query's blockwise Gram (a Python loop over pairs of
    sets: ~30 ms on 72 cells). The same rows: the fits and their risk estimates agree to rounding."""
    from dataclasses import replace

    q = meas.query
    if q.num_rows**2 * q.domain.size > EXPLICIT_GRAM:
        return meas
    return replace(meas, query=DenseRows(q))


def _fit_one(cand, stats, sets, cs, held, workload, time_limit, reconstruct, originals, identity=None,
             absolute: bool = False, gradient: bool = False) -> Evidence:
    """Fit ``cand`` and score it; ``absolute``: also estimate its absolute error (``select="l1"``,
    which for a fit of the lower orders costs one residual transform per fitted coordinate);
    ``gradient``: also the gradient of its risk estimate (``select="se_weights"``, :func:`risk_gradient`)."""
    if identity is not None:
        return _fit_identity_l2(cand, cs, held, workload, time_limit, reconstruct, originals, identity, stats,
                                absolute, gradient)
    meas = stats.measurement(sets)
    query = meas.query
    fit_meas = _explicit(meas)
    eq_queries, eq_values, total_row, source = [], [], None, None
    fit_cs = cs
    total = _fixed_total(cs)
    if held is not None:
        i = sets.index(())
        source = (int(query.offsets[i]), float(query.weights[i]))
        measured = float(meas.values[source[0]] / source[1])
        total = max(measured, held[1])  # at least its standard error
        if measured < held[1]:
            source = None  # held at the floor: it does not move with the noisy answers
        fit_cs = ConstraintSet(cs.domain, [*cs.constraints,
                                           Invariant(Total(cs.domain), np.array([total]), name="held total")])
        eq_queries, eq_values, total_row = [Total(cs.domain)], [np.array([total])], 0
    elif total is None and stats.total() is not None:
        total = max(*stats.total())  # the prior's total only (invariants leave the table's total free)
    for inv in cs.invariants:
        eq_queries.append(inv.query)
        eq_values.append(np.asarray(inv.values, dtype=np.float64).ravel())
    eq = EqualityRows(eq_queries, total_row, source, np.concatenate(eq_values) if eq_values else None)
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
    unfitted = _unfitted_sets(stats, workload, sets) if absolute or gradient else []
    if cand.objective == "l2":
        if list(sets) == list(stats.sets) and _entries(originals) <= MAX_DENSE_L2:
            # Every measured residual: the same fit as the original measurements' (their objectives
            # differ by a constant), whose sparse rows the engines handle far faster.
            fitted_to = list(originals)
        elif min(query.num_rows * cs.domain.size, _entries(originals)) > MAX_DENSE_L2:
            return Evidence(cand, "skipped", message=f"{query.num_rows} dense residual rows over "
                            f"{cs.domain.size} cells: above {MAX_DENSE_L2:.0e} entries for least squares")
        else:
            fitted_to = [meas]
        result = reconstruct(fitted_to, fit_cs, "l2", time_limit=time_limit, integer=False)
        if not result.success or result.x is None:
            return Evidence(cand, result.status.name, message=result.message, result=result)
        x = result.x
        positive = fitted_face(query, meas.values, x, free, eq)
        J = projection_jacobian(fit_meas.query, eq, positive)
    else:
        lam_c = default_smoothing(3) * cand.factor / _sigma_bar(stats, sets)
        options = {"smoothing": lam_c, "iterates": True}
        if total is not None:
            prior = np.zeros(cs.domain.size)
            prior[free] = total / free.sum()
            options["prior"] = prior
        result = reconstruct([fit_meas], fit_cs, "smooth", time_limit=time_limit, integer=False, **options)
        if not result.success or result.x is None:
            return Evidence(cand, result.status.name, message=result.message, result=result)
        x = result.x
        cotangent = _unfitted_cotangent(stats, workload, unfitted, x) if gradient and unfitted else None
        J = smooth_jacobian(fit_meas.query, eq, result.info["iterates"], float(result.info["lambda"]),
                            prior_scales_with_total=source is not None,
                            cells=bool(unfitted) if absolute or cotangent is None else cotangent)
        if unfitted:
            J, moves = J
    diag = np.diag(J)
    traces = {a: float(diag[query.rows_of(i)].sum()) for i, a in enumerate(query.sets)}
    fitted = stats.of_table(x)
    tables = table_risks(stats, workload, fitted, traces)
    weights = np.array([t.weight for t in workload.tables], dtype=np.float64)
    risk = float(np.dot(weights, [r.risk for r in tables]))
    # Var ĉ_r = s_r² Σ_r' J_rr'² (J is in the whitened units of d, unit variance per row).
    variances = {a: stats.variance_of(a) * float(np.sum(J[query.rows_of(i)] ** 2)) for i, a in enumerate(query.sets)} \
        if absolute else {}
    if absolute and cand.objective != "l2" and unfitted:
        variances.update(_coordinate_variances(stats, unfitted, moves))
    # (least squares on a subfamily: no ∂x̂/∂d at hand for the sets it leaves out)
    absolute = absolute_risks(workload, tables, table_variances(stats, workload, variances)) \
        if absolute and (cand.objective != "l2" or not unfitted) else None
    grad = None
    if gradient and (cand.objective != "l2" or not unfitted):
        rows = stats.rows(sets)
        cross = None
        if unfitted:  # (∂x̂/∂d)ᵀ v: given by the Jacobian's adjoint, or from the full ∂x̂/∂d (select="l1")
            cross = moves if moves.ndim == 1 else moves.T @ _unfitted_cotangent(stats, workload, unfitted, x)
        grad = risk_gradient(stats, workload, fitted, rows, J, cross)
    status = result.status.name if isinstance(result.status, Status) else str(result.status)
    return Evidence(cand, status, risk, tables, result=result, message=result.message,
                    spread=risk_spread(stats, workload, fitted), dof=float(diag.sum()), fitted=fitted,
                    absolute_risk=float(weights @ absolute) if absolute is not None else float("nan"),
                    absolute=absolute, gradient=grad)


def _unfitted_cotangent(stats: ResidualStatistics, workload, unfitted, x: np.ndarray) -> np.ndarray:
    """``v = B_Uᵀ (ω ⊙ (ĉ − û))_U`` in cells, for the coordinates ``U`` of the sets ``unfitted``
    (``B_U`` their orthonormal rows, ``ĉ`` the table ``x``'s coordinates): ``(∂x̂/∂d)ᵀ v`` is then
    ``Kᵀ (ω ⊙ (ĉ − û))_U`` of :func:`risk_gradient`, one product with the fit's adjoint instead of one
    residual transform per fitted coordinate."""
    from dpopt.model.queries.residual import Residuals

    rows = stats.rows(unfitted)
    basis = Residuals(stats.domain, unfitted)
    gap = coordinate_weights(stats, workload)[rows] * (basis.coordinates(basis.matvec(np.asarray(x, dtype=np.float64)))
                                                       - stats.coordinates[rows])
    return basis.rmatvec(gap / basis.row_norm())


def risk_gradient(stats: ResidualStatistics, workload, fitted: np.ndarray, rows: np.ndarray, jacobian: np.ndarray,
                  cross: np.ndarray | None = None) -> np.ndarray:
    """``∂R̂/∂d`` of the distance term ``Σ_r ω_r (ĉ_r − û_r)²`` of a fit's risk estimate, with respect to
    the whitened noisy coordinates ``d_r = û_r / s_r`` (unit variance each; ``ω_r``:
    :func:`~dpopt.estimate.choice.risk.coordinate_weights`).

    With ``h = s ⊙ ω ⊙ (ĉ − û)`` and ``J̃ = ∂(ĉ_F / s_F)/∂d_F`` the fit's Jacobian on the coordinates
    ``F`` it fits (``rows``, in the order of ``jacobian``), the gradient is ``−2h`` plus ``2 J̃ᵀ h_F``
    on ``F``, plus ``2 Kᵀ (ω ⊙ (ĉ − û))_U`` on ``F`` for coordinates ``U`` of the workload the fit does
    not fit but moves (a fit of the lower orders, ``K = ∂ĉ_U/∂d_F``: ``cross`` is that product,
    :func:`_unfitted_cotangent`). The Jacobian term ``2 Σ s² tr J`` of the estimate is left out: for
    least squares it is constant on each face of the fit; for the smooth fit its gradient is a second
    derivative of the fit, not computed (an approximation). Delta method:
    ``Var (R̂_k − R̂_0) ≈ ‖∇R̂_k − ∇R̂_0‖²``."""
    omega = coordinate_weights(stats, workload)
    s = np.sqrt(np.repeat(stats.variances, stats._basis.dims))
    gap = omega * (np.asarray(fitted, dtype=np.float64) - stats.coordinates)
    h = s * gap
    grad = -2.0 * h
    grad[rows] += 2.0 * (np.asarray(jacobian).T @ h[rows])
    if cross is not None:
        grad[rows] += 2.0 * np.asarray(cross, dtype=np.float64)
    return grad


def _unfitted_sets(stats: ResidualStatistics, workload, sets) -> list[tuple[str, ...]]:
    """The measured sets of the workload's tables that a fit of ``sets`` does not fit (a fit of the
    lower orders leaves out the top ones): their fitted coordinates move with the others."""
    fitted, closure = set(sets), set(workload.closure())
    return [a for a in stats.sets if a in closure and a not in fitted]


def _coordinate_variances(stats: ResidualStatistics, unfitted, moves: np.ndarray) -> dict:
    """``{a: Σ_r Var ĉ_r}`` over the coordinates of the sets ``unfitted``, from ``∂x̂/∂d``
    (``moves``, ``n × m``, unit-variance ``d``): ``Var ĉ_a = ‖B_a ∂x̂/∂d‖_F²`` (one residual transform
    per fitted coordinate, not per cell)."""
    from dpopt.model.queries.residual import Residuals

    basis = Residuals(stats.domain, unfitted)
    coords = np.column_stack([basis.coordinates(basis.matvec(moves[:, j])) for j in range(moves.shape[1])])
    return {a: float(np.sum(coords[basis.rows_of(i)] ** 2)) for i, a in enumerate(unfitted)}


def _fit_identity_l2(cand, cs, held, workload, time_limit, reconstruct, originals, identity, stats=None,
                     absolute: bool = False, gradient: bool = False) -> Evidence:
    """Least squares on one identity measurement (the projection of the noisy histogram onto the
    non-negative tables with the total held, or the clamp with it free), scored in closed form."""
    y, variance, scale = identity
    fit_cs, moving = cs, "free"
    if held is not None:
        measured, floor = held
        total = max(measured, floor)  # at least its standard error
        moving = "moving" if measured >= floor else "fixed"
        fit_cs = ConstraintSet(cs.domain, [*cs.constraints,
                                           Invariant(Total(cs.domain), np.array([total]), name="held total")])
    result = reconstruct(list(originals), fit_cs, "l2", time_limit=time_limit, integer=False)
    if not result.success or result.x is None:
        return Evidence(cand, result.status.name, message=result.message, result=result)
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
    tables = identity_l2_risks(workload, y, result.x, free, variance, scale, moving)
    fitted = stats.of_table(result.x) if stats is not None else None
    weights = np.array([t.weight for t in workload.tables], dtype=np.float64)
    risk = float(np.dot(weights, [r.risk for r in tables]))
    absolute = absolute_risks(workload, tables, identity_l2_variances(workload, result.x, free, variance, moving, y)) \
        if absolute else None
    grad = None
    if gradient and stats is not None:
        cells = identity_l2_gradient(workload, y, result.x, free, moving)
        grad = np.sqrt(variance) * stats.of_table(cells)  # orthonormal: d = B y / σ
    status = result.status.name if isinstance(result.status, Status) else str(result.status)
    return Evidence(cand, status, risk, tables, result=result, message=result.message, fitted=fitted,
                    absolute_risk=float(weights @ absolute) if absolute is not None else float("nan"),
                    absolute=absolute, gradient=grad)


def identity_l2_gradient(workload, y: np.ndarray, x: np.ndarray, free: np.ndarray, total: str) -> np.ndarray:
    """``∇_y`` of the distance term ``Σ_T ω_T ‖T (x̂ − y)‖²`` of least squares under ``x >= 0`` on one
    identity measurement (:func:`~dpopt.estimate.choice.risk.identity_l2_risks`, its Jacobians
    ``P``, ``A`` the cells on its face, :func:`~dpopt.estimate.choice.risk.identity_face`):
    ``2 (Pᵀ − I) G (x̂ − y)``, ``G = Σ_T ω_T TᵀT``; ``Pᵀv`` is ``a ⊙ v`` with the total free,
    ``a ⊙ v + (1 − a) (a·v)/|A|`` held at ``Σ y`` (moving), ``a ⊙ v − a (a·v)/|A|`` held at a value
    that does not move."""
    x = np.asarray(x, dtype=np.float64)
    a = identity_face(y, x, free, total).astype(np.float64)
    v = np.zeros_like(x)
    for t in workload.tables:
        q = t.query(workload.domain)
        v += t.weight * q.rmatvec(q.matvec(x - np.asarray(y, dtype=np.float64)))
    size = max(float(a.sum()), 1.0)
    pv = a * v
    if total == "moving":
        pv += (1.0 - a) * float(a @ v) / size
    elif total == "fixed":
        pv -= a * float(a @ v) / size
    return 2.0 * (pv - v)
