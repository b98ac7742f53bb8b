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
  allowed), or the smooth estimate (:mod:`dpopt.estimate.engines.smooth`: three relative-entropy
  proximal steps, every cell positive) with the weight ``λ = c/σ̄`` at the default ``c`` times
  ``1/4``, 1 or 4 (``σ̄`` the root mean noise variance of the original measured rows, as the smooth
  objective's own rule).

**The rule.** For every candidate, Stein's unbiased risk estimate of the weighted workload error
(:mod:`dpopt.estimate.choice.risk`), with the exact Jacobian (:mod:`dpopt.estimate.choice.jacobian`);
the release takes the least. It reads the noisy answers and public noise laws only: no data, no
truth, no random draw (a test swaps the data under fixed noisy answers and gets the same choice).
Every workload table measured directly must come out with a risk at most its noisy answers'
(exact: noise variance times cells): the rule takes the least-risk candidate that keeps every such
table there, and when none does it takes the least-risk one and the report names each table and
by how much it is over (:attr:`FitChoice.over_noisy`).

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
from dpopt.estimate.choice.jacobian import EqualityRows, projection_jacobian, smooth_jacobian
from dpopt.estimate.choice.risk import TableRisk, risk_spread, table_risks, unbiased_risks
from dpopt.estimate.choice.statistics import ResidualStatistics, residual_statistics
from dpopt.estimate.engines.smooth import default_smoothing
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total

__all__ = ["EstimatorCandidate", "FitChoice", "choose_fit", "DEFAULT_CANDIDATES", "MAX_COORDINATES"]

#: The smooth weights tried, as multiples of the default ``c`` (module notes).
SMOOTHING_FACTORS = (0.25, 1.0, 4.0, 16.0)
#: Families of residual statistics with more coordinates than this are not fitted (the Jacobians
#: are ``m × m``).
MAX_COORDINATES = 3000
#: Least squares on a subfamily of residuals fits dense rows: at most this many entries.
MAX_DENSE_L2 = 2_000_000


@dataclass(frozen=True)
class EstimatorCandidate:
    """One way to fit: ``objective`` (``"l2"`` or ``"smooth"``), the family of residuals fitted
    (``"all"``, ``"workload"``, ``"lower"``), and for ``smooth`` the factor on the default weight."""

    objective: str
    family: str
    factor: float = 1.0

    @property
    def name(self) -> str:
        what = self.objective if self.objective == "l2" else f"smooth (c x {self.factor:g})"
        return f"{what} on {self.family}"


DEFAULT_CANDIDATES = tuple(
    [EstimatorCandidate("l2", "all")]
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

    def frame(self) -> pd.DataFrame:
        """One row per candidate: its estimated risk (weighted workload), status and time."""
        return pd.DataFrame([{"estimator": e.candidate.name, "residual_sets": e.sets, "risk": e.risk,
                              "status": e.status, "seconds": e.seconds, "chosen": e is self.chosen}
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
        out = [f"how to fit: {self.rule}"]
        if self.chosen is None:
            return out
        best = {}
        for e in self.evidence:
            best[e.candidate.name] = e
        for e in self.evidence:
            mark = "*" if e is self.chosen else " "
            figure = f"risk {e.risk:.6g}" if np.isfinite(e.risk) else e.status
            out.append(f"  {mark} {e.candidate.name:<28} {figure}  ({e.sets} residual sets, {e.seconds:.2f} s)")
        frame = self.table_frame(workload)
        for row in frame.head(max_tables).itertuples(index=False):
            part = "" if row.complete else " (measured residuals only)"
            out.append(f"    {row.table}: estimated error {row.released_risk:.6g}{part}; {row.noisy_is} "
                       f"{row.noisy_risk:.6g}")
        if len(frame) > max_tables:
            out.append(f"    ... and {len(frame) - max_tables} more tables")
        for label, released, noisy in self.over_noisy:
            out.append(f"  NOT MET for {label}: estimated error {released:.6g} above its noisy answers' {noisy:.6g} "
                       f"(by {released - noisy:.4g}, {100 * (released / noisy - 1):.1f}%)")
        return out


def _noisy_tables(measurements: Sequence[Measurement], workload) -> tuple[list[float], list[bool]]:
    """Per table: the directly measured noisy answers' risk (variance x cells), or None."""
    out, direct = [], []
    for t in workload.tables:
        found = None
        for m in measurements:
            q = m.query
            if t.kind == "marginal" and isinstance(q, Marginal) and q.attrs == t.attrs:
                risk = m.variance * q.num_rows
                found = risk if found is None else min(found, risk)
            if t.kind == "total" and isinstance(q, Total):
                found = m.variance if found is None else min(found, m.variance)
        out.append(found)
        direct.append(found is not None)
    return out, direct


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
               candidates: Sequence[EstimatorCandidate] = DEFAULT_CANDIDATES, time_limit: float | None = None
               ) -> FitChoice:
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
    """
    from dpopt.estimate import reconstruct

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
    held = stats.total() if not cs.invariants else None
    evidence: list[Evidence] = []
    done_families: dict = {}
    wide = len(_family_sets(stats, workload, "all")) > len(_family_sets(stats, workload, "workload"))
    for cand in candidates:
        sets = _family_sets(stats, workload, cand.family)
        if laplace and wide and cand.family == "all":
            # Residuals beyond the workload's (the identity's higher orders) let a fit resolve single
            # cells, where Laplace noise is far from Gaussian: the second-moment risk estimate of such
            # fits was measured 15-43% low (module notes), so they are not candidates.
            evidence.append(Evidence(cand, "left out", message="fits residuals beyond the workload's under "
                                     "Laplace noise", sets=len(sets)))
            continue
        key = (cand.objective, cand.factor, tuple(sets))
        if not sets or () not in sets and held is not None:
            evidence.append(Evidence(cand, "empty family" if not sets else "the total's residual is not measured"))
            continue
        if key in done_families:
            continue  # the same family under another name (e.g. "all" = "workload")
        done_families[key] = cand
        coords = sum(int(stats._basis.dims[stats.index(a)]) for a in sets)
        if coords > MAX_COORDINATES:
            evidence.append(Evidence(cand, f"{coords} coordinates, above {MAX_COORDINATES}", sets=len(sets)))
            continue
        start = time.perf_counter()
        try:
            ev = _fit_one(cand, stats, sets, cs, held, workload, time_limit, reconstruct, noisy)
        except DpoptError as exc:
            ev = Evidence(cand, "refused", message=str(exc).split("\n")[0])
        ev.seconds = time.perf_counter() - start
        ev.sets = len(sets)
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
    chosen = best
    over = [(r.label, r.risk, nr) for r, nr, dr in zip(chosen.tables, noisy_risk, direct) if dr and r.risk > nr]
    complete = all(r.complete for r in chosen.tables)
    rule = ((f"the least second-moment risk estimate (Stein's formula with the Laplace variances) of the weighted "
             f"workload error among {len(ok)} fitted candidates; fits of more residuals than the workload's are left "
             "out under Laplace noise") if laplace else
            f"the least Stein risk estimate of the weighted workload error among {len(ok)} fitted candidates"
            + ("" if complete else " (over the residuals the measurements saw: the top-order interactions of "
               "the workload were not measured, so their error is not estimable)")
            + ("" if keeps or not any(direct) else "; no candidate keeps every directly measured table at or "
               "below its noisy answers"))
    return FitChoice(chosen.result, chosen, evidence, noisy_risk, direct, over, rule, stats)


def _fit_one(cand, stats, sets, cs, held, workload, time_limit, reconstruct, originals) -> Evidence:
    meas = stats.measurement(sets)
    query = meas.query
    eq_queries, total_row, source = [], None, None
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
        eq_queries, total_row = [Total(cs.domain)], 0
    elif total is None and stats.total() is not None:
        total = max(*stats.total())  # the prior's total only (invariants leave the table's total free)
    for inv in cs.invariants:
        eq_queries.append(inv.query)
    eq = EqualityRows(eq_queries, total_row, source)
    free = np.ones(cs.domain.size, dtype=bool)
    if cs.zero_rules:
        free[cs.zero_mask()] = False
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
        positive = free & (x > 1e-9 * max(float(x.max()), 1e-300))
        J = projection_jacobian(query, eq, positive)
    else:
        lam_c = default_smoothing(3) * cand.factor / _sigma_bar(stats, sets)
        options = {"smoothing": lam_c, "iterates": True}
        if total is not None:
            prior = np.zeros(cs.domain.size)
            prior[free] = total / free.sum()
            options["prior"] = prior
        result = reconstruct([meas], fit_cs, "smooth", time_limit=time_limit, integer=False, **options)
        if not result.success or result.x is None:
            return Evidence(cand, result.status.name, message=result.message, result=result)
        x = result.x
        J = smooth_jacobian(query, eq, result.info["iterates"], float(result.info["lambda"]),
                            prior_scales_with_total=source is not None)
    diag = np.diag(J)
    traces = {a: float(diag[query.rows_of(i)].sum()) for i, a in enumerate(query.sets)}
    fitted = stats.of_table(x)
    tables = table_risks(stats, workload, fitted, traces)
    risk = float(np.dot([t.weight for t in workload.tables], [r.risk for r in tables]))
    status = result.status.name if isinstance(result.status, Status) else str(result.status)
    return Evidence(cand, status, risk, tables, result=result, message=result.message,
                    spread=risk_spread(stats, workload, fitted), dof=float(diag.sum()), fitted=fitted)
