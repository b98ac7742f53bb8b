"""The matrix mechanism: measure a strategy ``A`` to answer a workload ``W``, then reconstruct.

Li, Hay, Rastogi, Miklau, McGregor, "Optimizing linear counting queries under differential
privacy" (PODS 2010; VLDB J. 2015 as "The matrix mechanism"), with HDMM's optimised templates
(McKenna, Miklau, Hay, Machanavajjhala, VLDB 2018) and Li and Miklau's SVD lower bound. In the
shared model (design notes §2)::

    plan:         A = argmin over candidates of  v(A) · trace(W (AᵀA)⁺ Wᵀ)      (public, no data)
    measure:      y = A x + z,   z ~ the noise calibrate(A, budget) gives        (all of the budget)
    reconstruct:  x^ = A⁺ y, or argmin ‖A x - y‖² under the declared constraints
    answer:       W x^

The plan knows, before any data is read, each candidate strategy's expected total squared
error (exact for dpopt's discrete noise: the variance comes from
:func:`~dpopt.privacy.mechanisms.calibrate`) and the SVD bound no strategy can beat.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpopt.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    AlgorithmPlan,
    PlannedMeasure,
    Release,
    constraint_kinds,
    make_release,
    register,
    round_release,
)
from dpopt.errors import DpoptError, ParameterError, QueryError
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import make_result
from dpopt.estimate.status import Status
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import (
    FourierParity,
    HaarWavelet,
    Hierarchical,
    Identity,
    Kronecker,
    LinearQuery,
    Marginal,
    Stack,
    downward_closure,
)
from dpopt.privacy.budget import MECHANISMS
from dpopt.privacy.mechanisms import NoiseLaw, calibrate, measure
from dpopt.spec.queries import WORKLOAD_KEYS, WORKLOAD_KINDS, WorkloadSpec, parse_workload
from dpopt.strategy.bound import classic_gaussian_constant, svd_bound
from dpopt.strategy.error import VariancePlan, kron_terms, trace_term, variance_plan
from dpopt.strategy.gram import MarginalsGram, RangeGram, WorkloadGram
from dpopt.strategy.inference import least_squares
from dpopt.strategy.optimize import (
    OptimizedStrategy,
    exact_strategy,
    optimize_kronecker,
    optimize_marginals,
    optimize_pidentity,
)
from dpopt.strategy.workload import gram_of

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset
    from dpopt.privacy.accountant import Accountant
    from dpopt.privacy.randomness import RandomSource

__all__ = ["MatrixMechanism", "MatrixMechanismParams", "MatrixMechanismPlan", "StrategyReport", "WorkloadSpec",
           "STRATEGIES", "TEMPLATES", "WORKLOAD_KINDS"]

#: Strategies a plan can name: the named ones, ``"optimized"`` (an HDMM template fitted to the
#: workload) and ``"exact"`` (the convex program, small domains, Gaussian noise).
STRATEGIES = ("identity", "workload", "hierarchical", "wavelet", "fourier", "optimized", "exact")
#: Compared by ``strategy = "best"`` unless ``candidates`` says otherwise.
DEFAULT_CANDIDATES = ("identity", "workload", "hierarchical", "wavelet", "fourier", "optimized")
#: Optimisation templates (``"auto"`` picks by the workload's structure).
TEMPLATES = ("auto", "p-identity", "kronecker", "marginals")
#: Reconstruction objectives (through :func:`dpopt.estimate.reconstruct` when constrained).
OBJECTIVES = ("l2", "l1")
#: Domains up to this many cells let the "optimized" template also try OPT_0 on boxes.
PIDENTITY_MAX_CELLS = 10_000
#: Keys of the ``[matrix_mechanism]`` spec table.
SPEC_KEYS = ("workload", *WORKLOAD_KEYS, "strategy", "optimize", "candidates", "template",
             "p", "branching", "mechanism", "seed", "bound_delta")


# ---- parameters -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatrixMechanismParams(AlgorithmParams):
    """Parameters of :class:`MatrixMechanism`.

    Attributes
    ----------
    workload : WorkloadSpec or LinearQuery
        What to answer (a query must be over the plan's domain).
    strategy : str or LinearQuery
        ``"best"`` (default): the candidate with the least expected error; a name from
        :data:`STRATEGIES`; or an explicit strategy query.
    candidates : tuple of str
        The strategies ``"best"`` compares (and ``dpopt check`` lists).
    template : str
        The optimisation template (:data:`TEMPLATES`) of ``"optimized"``.
    p : int or None
        p-Identity's extra rows (default: :func:`dpopt.strategy.optimize.default_p`).
    branching : int
        The hierarchical strategy's branching factor.
    mechanism : {"laplace", "gaussian"} or None
        Default: the budget's natural noise (Laplace for pure ε, Gaussian otherwise).
    objective : {"l2", "l1"}
        The reconstruction's loss under constraints (unconstrained L2 is ``A⁺ y``).
    backend, time_limit, solver_options
        Passed to :func:`dpopt.estimate.reconstruct` (``solver_options`` as its keyword options).
    seed : int
        The optimiser's public random start (the plan is reproducible).
    bound_delta : Fraction or None
        A δ at which to also print the papers' SVD bound under a pure-ε budget (the MWEM paper
        uses ``1 / n``); approximate budgets use their own δ.
    """

    workload: WorkloadSpec | LinearQuery | None = None
    strategy: str | LinearQuery = "best"
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    template: str = "auto"
    p: int | None = None
    branching: int = 2
    mechanism: str | None = None
    objective: str = "l2"
    backend: str | None = None
    time_limit: float | None = None
    solver_options: dict = field(default_factory=dict)
    seed: int = 0
    bound_delta: Fraction | None = None

    def validate(self) -> None:
        if not isinstance(self.workload, (WorkloadSpec, LinearQuery)):
            raise ParameterError(f"workload must be a WorkloadSpec or a LinearQuery, got {type(self.workload).__name__}")
        if isinstance(self.strategy, str):
            if self.strategy != "best" and self.strategy not in STRATEGIES:
                raise ParameterError(f"strategy must be 'best', one of {list(STRATEGIES)} or a query, "
                                     f"got {self.strategy!r}")
        elif not isinstance(self.strategy, LinearQuery):
            raise ParameterError(f"strategy must be a name or a LinearQuery, got {type(self.strategy).__name__}")
        if isinstance(self.candidates, str) or not self.candidates:
            raise ParameterError(f"candidates must be a non-empty list of strategy names, got {self.candidates!r}")
        object.__setattr__(self, "candidates", tuple(self.candidates))
        for c in self.candidates:
            if c not in STRATEGIES:
                raise ParameterError(f"candidates: unknown strategy {c!r}; choose from {list(STRATEGIES)}")
        if self.template not in TEMPLATES:
            raise ParameterError(f"template must be one of {list(TEMPLATES)}, got {self.template!r}")
        if self.p is not None and (isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1):
            raise ParameterError(f"p must be an integer >= 1, got {self.p!r}")
        if isinstance(self.branching, bool) or not isinstance(self.branching, int) or self.branching < 2:
            raise ParameterError(f"branching must be an integer >= 2, got {self.branching!r}")
        if self.mechanism is not None and self.mechanism not in MECHANISMS:
            raise ParameterError(f"mechanism must be one of {list(MECHANISMS)}, got {self.mechanism!r}")
        if self.objective not in OBJECTIVES:
            raise ParameterError(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}")
        if not isinstance(self.solver_options, dict) or not all(isinstance(k, str) for k in self.solver_options):
            raise ParameterError(f"solver_options must be a dict of option names to values, got {self.solver_options!r}")
        if self.time_limit is not None and not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0):
            raise ParameterError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ParameterError(f"seed must be an integer, got {self.seed!r}")
        if self.bound_delta is not None:
            delta = Fraction(self.bound_delta)
            if not 0 < delta < 1:
                raise ParameterError(f"bound_delta must be in (0, 1), got {self.bound_delta!r}")
            object.__setattr__(self, "bound_delta", delta)

    def to_dict(self) -> dict:
        """The parameters as plain values (the workload and a given strategy by their names)."""
        out = super().to_dict()
        w = self.workload
        out["workload"] = w.describe() if isinstance(w, WorkloadSpec) else w.name
        if isinstance(self.strategy, LinearQuery):
            out["strategy"] = f"given: {self.strategy.name}"
        if not self.solver_options:
            out.pop("solver_options")
        return out

    @classmethod
    def from_spec(cls, reader) -> "MatrixMechanismParams":
        """``[matrix_mechanism]`` (the workload and the strategy) and ``[reconstruct]`` (objective,
        backend, time limit); every error names the file, line and key."""
        t = reader.table("matrix_mechanism", required=True)
        workload = parse_workload(t)
        strategy = t.str("strategy", default="best", choices=("best",) + STRATEGIES)
        if t.has("optimize"):
            if t.bool("optimize"):
                if strategy not in ("best", "optimized"):
                    raise t.error(("optimize",), f"optimize = true asks for the optimised strategy, but "
                                  f"strategy = {strategy!r} names another; keep one of the two")
                strategy = "optimized"
            elif strategy == "optimized":
                raise t.error(("optimize",), "optimize = false contradicts strategy = \"optimized\"")
        candidates = t.str_list("candidates", default=list(DEFAULT_CANDIDATES), choices=STRATEGIES)
        if strategy == "best" and t.has("optimize") and not t.bool("optimize"):
            candidates = [c for c in candidates if c != "optimized"] or ["identity"]
        r = reader.table("reconstruct")
        time_limit = r.float("time_limit", positive=True)
        try:
            return cls(workload=workload, strategy=strategy, candidates=tuple(candidates),
                       template=t.str("template", default="auto", choices=TEMPLATES), p=t.int("p", minimum=1),
                       branching=t.int("branching", default=2, minimum=2),
                       mechanism=t.str("mechanism", choices=MECHANISMS),
                       objective=r.str("objective", default="l2", choices=OBJECTIVES), backend=r.str("backend"),
                       time_limit=time_limit, seed=t.int("seed", default=0, minimum=0),
                       bound_delta=t.budget("bound_delta", unit=True))
        except ParameterError as exc:
            raise t.error((), str(exc)) from None


# ---- the plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class StrategyReport:
    """One candidate strategy's expected error (or why it does not apply)."""

    name: str
    query: LinearQuery | None
    law: NoiseLaw | None = None
    trace: float = math.nan
    expected_error: float = math.inf
    seconds: float = 0.0
    reason: str = ""
    details: dict = field(default_factory=dict)

    @property
    def applies(self) -> bool:
        return self.query is not None and math.isfinite(self.expected_error)


@dataclass(frozen=True, eq=False)
class MatrixMechanismPlan:
    """The public part of a matrix-mechanism run.

    Attributes
    ----------
    workload, strategy : LinearQuery
    chosen : str
        The strategy's name.
    candidates : tuple of StrategyReport
    mechanism : str
    expected_error : float
        The expected total squared error of the workload's answers (unconstrained estimate).
    svd_bound : float
        ``(σ_1 + ... + σ_r)² / n`` of the workload.
    noise_constant : float
        The chosen noise's variance per unit of squared sensitivity (continuous law).
    bound : float
        ``noise_constant · svd_bound``: no strategy's expected error is below it.
    paper_bound : float or None
        ``P(ε, δ) · svd_bound`` with the papers' Gaussian constant, when a δ is known.
    paper_delta : Fraction or None
    variance : VariancePlan or None
        How the run computes each answer's standard error (method, memory, work), or None when
        the release will not have them (constrained or rounded estimates).
    """

    workload: LinearQuery
    strategy: LinearQuery
    chosen: str
    candidates: tuple[StrategyReport, ...]
    mechanism: str
    expected_error: float
    svd_bound: float
    noise_constant: float
    bound: float
    paper_bound: float | None = None
    paper_delta: Fraction | None = None
    variance: VariancePlan | None = None

    def memory_items(self) -> list[dict]:
        """What the run holds beyond the table and the fit, for the plan's memory estimate
        (:func:`dpopt.release.resources.estimate_memory`): the workload's answers with their labels,
        and the standard-error step."""
        from dpopt.release.resources import BYTES_PER_ANSWER

        m = self.workload.num_rows
        path = ("matrix_mechanism", "workload")
        items = [dict(what="the workload's answers", path=path, bytes=float(m) * BYTES_PER_ANSWER, engine="table",
                      detail=f"{m:,} answers with their labels", advice="ask for fewer workload queries")]
        if self.variance is not None and self.variance.feasible:
            items.append(dict(what="the standard-error step", path=path, bytes=self.variance.bytes,
                              engine=self.variance.method, detail=f"the variance of each of {m:,} answers",
                              advice="declare constraints (e.g. nonnegative = true) to release without standard "
                                     "errors, or ask for fewer workload queries"))
        return items

    def frame(self) -> pd.DataFrame:
        """One row per candidate: rows, sensitivity, expected error, RMSE per query, ratio to the bound."""
        m = self.workload.num_rows
        rows = []
        for c in self.candidates:
            rows.append({
                "strategy": c.name, "chosen": c.name == self.chosen,
                "rows": c.query.num_rows if c.query is not None else None,
                "sensitivity": float(c.law.sensitivity) if c.law is not None else math.nan,
                "expected_total_squared_error": c.expected_error,
                "rmse_per_query": math.sqrt(c.expected_error / m) if math.isfinite(c.expected_error) else math.inf,
                "ratio_to_bound": c.expected_error / self.bound if self.bound > 0 else math.inf,
                "seconds": c.seconds, "note": c.reason,
            })
        return pd.DataFrame(rows)


def _workload_of(params: MatrixMechanismParams, domain: Domain) -> LinearQuery:
    w = params.workload
    if isinstance(w, WorkloadSpec):
        return w.build(domain)
    if w.domain != domain:
        raise ParameterError(f"workload: the query is over {w.domain}, not the plan's {domain}")
    return w


def _per_attribute(domain: Domain, make) -> LinearQuery:
    if len(domain) == 1:
        return make(domain, domain.attrs[0])
    return Kronecker([make(domain.project([a]), a) for a in domain.attrs], domain)


def _marginal_sets(gram: WorkloadGram) -> list[tuple[str, ...]] | None:
    return [s for s, _ in gram.sets()] if isinstance(gram, MarginalsGram) else None


def _build_named(name: str, params, domain: Domain, W: LinearQuery, gram: WorkloadGram, norm: str):
    """``(query, details)`` of a named candidate; raises ParameterError saying why it does not apply."""
    if name == "identity":
        return Identity(domain), {}
    if name == "workload":
        return W, {}
    if name == "hierarchical":
        b = params.branching
        return _per_attribute(domain, lambda d, a: Hierarchical(d, a, b)), {"branching": b}
    if name == "wavelet":
        return _per_attribute(domain, HaarWavelet), {}
    if name == "fourier":
        sets = _marginal_sets(gram)
        if any(s != 2 for s in domain.sizes) or sets is None:
            raise ParameterError("the Fourier strategy applies to marginal workloads over binary attributes")
        return FourierParity(domain, downward_closure(sets, domain)), {}
    if name == "exact":
        if norm != "l2":
            raise ParameterError("the exact strategy search is for Gaussian noise (the L1 problem is not convex)")
        fit = exact_strategy(gram)
        return fit.query, {"template": "exact", "solver": fit.info.get("solver")}
    if name == "optimized":
        fit = _optimize(params, domain, gram, norm)
        return fit.query, {"template": fit.template, "iterations": fit.iterations, **{
            k: v for k, v in fit.info.items() if k in ("p", "message", "losses")}}
    raise ParameterError(f"unknown strategy {name!r}")  # pragma: no cover - validated


def _optimize(params, domain: Domain, gram: WorkloadGram, norm: str) -> OptimizedStrategy:
    template = params.template
    if template == "auto":
        if isinstance(gram, MarginalsGram):
            template = "marginals"
        elif len(domain) > 1 and kron_terms(gram, tuple((a,) for a in domain.attrs)) is not None:
            # Products of per-attribute workloads (and stacks of them): OPT_⊗ fits each attribute's
            # p-Identity on its own Gram (HDMM §5.2). Every box of a 75 x 50 grid: 0.03 CPU-s,
            # where OPT_0 over the 3,750 cells took 3.7 CPU-s and ended 1,500 times worse.
            template = "kronecker"
        elif len(domain) == 1 or (domain.size <= PIDENTITY_MAX_CELLS and not isinstance(gram, RangeGram)):
            template = "p-identity"
        elif isinstance(gram, RangeGram) and domain.size <= PIDENTITY_MAX_CELLS:
            fits = [optimize_kronecker(gram, norm, p=params.p, seed=params.seed),
                    optimize_pidentity(gram, params.p, norm, seed=params.seed)]
            return min(fits, key=lambda f: f.loss)
        else:
            template = "kronecker"
    try:
        if template == "marginals":
            return optimize_marginals(gram, norm, seed=params.seed)
        if template == "kronecker":
            return optimize_kronecker(gram, norm, p=params.p, seed=params.seed)
        return optimize_pidentity(gram, params.p, norm, seed=params.seed)
    except QueryError as exc:
        raise ParameterError(f"template {template!r}: {exc}") from None


def _variance_plan(W: LinearQuery, gram: WorkloadGram, best: StrategyReport, constraints, params) -> VariancePlan | None:
    """How the run will compute the answers' standard errors, when it will: an unconstrained,
    unrounded least-squares estimate (the only one the GLS covariance describes)."""
    if params.objective != "l2" or constraint_kinds(constraints) - {"integer"} or constraints.integral:
        return None
    try:
        return variance_plan(W, best.query, workload_gram=gram)
    except DpoptError as exc:
        return VariancePlan("none", W.num_rows, 0.0, 0.0, lambda: None, str(exc).split("\n")[0])


def _evaluate(name: str, make, gram: WorkloadGram, cost, mechanism: str) -> StrategyReport:
    start = time.perf_counter()
    try:
        query, details = make()
        law = calibrate(query, cost, mechanism)
        # The workload measured as it is: its own Gram, so that the trace is its rank.
        tr = trace_term(gram, gram if name == "workload" else query)
    except DpoptError as exc:
        return StrategyReport(name, None, reason=str(exc).split("\n")[0], seconds=time.perf_counter() - start)
    return StrategyReport(name, query, law, tr, law.variance * tr, time.perf_counter() - start, details=details)


# ---- the algorithm ---------------------------------------------------------------------------------
@register
class MatrixMechanism(Algorithm):
    """Measure the strategy with the least expected error, reconstruct, answer the workload."""

    name = "matrix_mechanism"
    aliases = ("matrix-mechanism",)
    title = "matrix mechanism: a measured strategy, least squares, the workload's answers"
    reference = ("C. Li, M. Hay, V. Rastogi, G. Miklau, A. McGregor, Optimizing linear counting queries under "
                 "differential privacy, PODS 2010 (Prop. 4, expected error); C. Li, G. Miklau, arXiv 1202.3399 "
                 "(the SVD bound); R. McKenna et al., HDMM, VLDB 2018 (§5-6, templates)")
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities"})
    sections = {"matrix_mechanism": SPEC_KEYS, "reconstruct": ("objective", "backend", "time_limit")}
    Params = MatrixMechanismParams

    # ---- plan -----------------------------------------------------------------------------------
    def plan(self, domain: Domain, constraints, budget) -> AlgorithmPlan:
        params = self.params
        W = _workload_of(params, domain)
        mechanism = budget.noise(params.mechanism)
        norm = "l1" if mechanism == "laplace" else "l2"
        label = "strategy"
        cost = budget.shares({label: 1})[label]
        try:
            gram = gram_of(W)
        except QueryError as exc:
            raise ParameterError(f"workload: {exc}") from None
        if isinstance(params.strategy, LinearQuery):
            if params.strategy.domain != domain:
                raise ParameterError(f"strategy: the query is over {params.strategy.domain}, not {domain}")
            reports = [_evaluate("given", lambda: (params.strategy, {}), gram, cost, mechanism)]
        else:
            names = params.candidates if params.strategy == "best" else (params.strategy,)
            reports = [_evaluate(n, lambda n=n: _build_named(n, params, domain, W, gram, norm), gram, cost,
                                 mechanism) for n in names]
        usable = [r for r in reports if r.applies]
        if not usable:
            why = "; ".join(f"{r.name}: {r.reason}" for r in reports)
            raise ParameterError(f"strategy: no candidate applies to this workload ({why})")
        best = min(usable, key=lambda r: r.expected_error)
        unit_bound = svd_bound(gram)
        constant = _noise_constant(best.law)
        paper_delta = budget.delta if budget.delta else params.bound_delta
        paper = classic_gaussian_constant(budget.epsilon, paper_delta) * unit_bound \
            if (paper_delta and budget.epsilon) else None
        details = MatrixMechanismPlan(W, best.query, best.name, tuple(reports), mechanism, best.expected_error,
                                      unit_bound, constant, constant * unit_bound, paper,
                                      Fraction(paper_delta) if paper else None,
                                      _variance_plan(W, gram, best, constraints, params))
        step = PlannedMeasure(label, best.query, mechanism, Fraction(1), cost, best.law,
                              what=f"strategy {best.name}: {best.query.name}", answers=best.query.num_rows)
        return self.new_plan(domain, constraints, budget, steps=[step], details=details,
                             lines=_plan_lines(details, W, constraints, params))

    # ---- run ------------------------------------------------------------------------------------------
    def run(self, plan: AlgorithmPlan, data: "Dataset", accountant: "Accountant", rng: "RandomSource") -> Release:
        details: MatrixMechanismPlan = plan.details
        step = plan.steps[0]
        if data.domain != plan.domain:
            raise ParameterError(f"the data's domain {data.domain} differs from the plan's {plan.domain}")
        plan.domain.require_dense("the matrix mechanism's reconstructed table")
        measurement = measure(step.query, data, step.law, accountant, rng, label=step.label)
        constraints = plan.constraints
        params = self.params
        shaped = bool(constraint_kinds(constraints) - {"integer"})
        if shaped or params.objective != "l2":
            result = _constrained(measurement, constraints, params)
        else:
            result = _unconstrained(measurement, constraints)
        info = {"strategy": details.chosen, "expected_total_squared_error": details.expected_error,
                "svd_bound": details.bound, "candidates": details.frame().to_dict("records")}
        if not result.success or result.x is None:
            return make_release(self, plan, accountant, status=result.status, measurements=[measurement],
                                reconstruction=result, info=info,
                                message=f"the reconstruction ended with status {result.status.name}: {result.message}")
        W = details.workload
        # Controlled rounding keeps each workload answer at the floor or ceiling of its fitted value.
        kept = [Measurement.exact(W, W.matvec(result.x), label="workload")] if W.is_integer else []
        counts, rounding, failure = round_release(result.x, constraints, kept, params.time_limit)
        if failure is not None:
            return make_release(self, plan, accountant, status=rounding.status, measurements=[measurement],
                                reconstruction=result, rounding=rounding, message=failure, info=info)
        answers = pd.DataFrame({"query": W.row_labels(), "count": W.matvec(np.asarray(counts, dtype=np.float64))})
        notes = []
        variance = details.variance
        if not shaped and rounding is None and variance is not None and variance.feasible:
            answers["stderr"] = np.sqrt(step.law.variance * variance.run())
            notes.append("stderr: the exact standard error of each unconstrained least-squares answer "
                         f"(GLS covariance of A⁺y, computed {variance.method})")
        elif variance is not None and not variance.feasible:
            notes.append(f"no standard errors: {variance.reason}")
        elif params.objective != "l2":
            notes.append("no standard errors: the L1 fit is not the least-squares estimate A⁺y whose covariance "
                         "is known")
        else:
            notes.append("no standard errors: the estimate is constrained (the GLS covariance does not describe it)")
        return make_release(self, plan, accountant, status=result.status, message=result.message, counts=counts,
                            answers={"workload": answers}, measurements=[measurement], reconstruction=result,
                            rounding=rounding, notes=notes, info=info)

    @classmethod
    def example(cls, domain: Domain) -> MatrixMechanismParams:
        k = (1, 2) if len(domain) >= 2 else (1,)
        return cls.Params(workload=WorkloadSpec("all_marginals", k=k), candidates=("identity", "workload", "optimized"))


# ---- helpers ---------------------------------------------------------------------------------------
def _noise_constant(law: NoiseLaw) -> float:
    """Variance per unit of squared sensitivity of the continuous law the noise discretises."""
    if law.mechanism == "laplace":
        return 2.0 * law.scale**2 / float(law.sensitivity) ** 2
    return law.scale**2 / float(law.sensitivity)  # Gaussian: law.sensitivity is the squared L2 sensitivity


def _plan_lines(details: MatrixMechanismPlan, W: LinearQuery, constraints, params) -> list[str]:
    m = W.num_rows
    lines = [f"matrix mechanism: workload {W.name} ({m} queries over {W.domain.size:.4g} cells), "
             f"{details.mechanism} noise"]
    head = f"  {'strategy':<14} {'rows':>9} {'sensitivity':>12} {'E total sq. error':>18} {'RMSE/query':>11} {'x bound':>8}"
    lines.append(head)
    for c in details.candidates:
        mark = "*" if c.name == details.chosen else " "
        if not c.applies:
            lines.append(f" {mark}{c.name:<14} does not apply: {c.reason}")
            continue
        lines.append(f" {mark}{c.name:<14} {c.query.num_rows:>9} {float(c.law.sensitivity):>12.4g} "
                     f"{c.expected_error:>18.6g} {math.sqrt(c.expected_error / m):>11.4g} "
                     f"{c.expected_error / details.bound:>8.3g}")
    lines.append(f"  SVD lower bound (Li & Miklau) for this noise: {details.bound:.6g} total, "
                 f"{math.sqrt(details.bound / m):.4g} RMSE per query")
    if details.paper_bound is not None:
        lines.append(f"  SVD bound with the papers' constant P(eps, delta) = 2 ln(2/delta)/eps^2 at delta = "
                     f"{details.paper_delta}: {details.paper_bound:.6g} total")
    kinds = constraint_kinds(constraints) - {"integer"}
    if kinds or params.objective != "l2":
        lines.append(f"  reconstruction: {params.objective} fit under {', '.join(sorted(kinds)) or 'no constraints'} "
                     "(dpopt.estimate.reconstruct)")
    else:
        lines.append("  reconstruction: least squares x = A⁺y (no constraints declared)")
    if constraints.integral:
        lines.append("  then exact integer rounding")
    variance = details.variance
    if variance is not None and variance.feasible:
        lines.append(f"  standard errors: the variance of each of the {m:,} answers, {variance.method} "
                     f"(about {variance.flops:.2g} operations)")
    elif variance is not None:
        lines.append(f"  no standard errors: {variance.reason}")
    return lines


def _unconstrained(measurement, constraints):
    sol = least_squares(measurement.query, measurement.values)
    problem = ConsistencyProblem([measurement], constraints, "l2")
    return make_result(sol.status, sol.x, message=sol.message, fun=sol.objective / measurement.variance,
                       objective="l2", backend="dpopt.strategy", solver=sol.method, time=sol.seconds,
                       nit=sol.iterations, problem=problem, info={"normal_residual": sol.normal_residual})


def _constrained(measurement, constraints, params):
    from dpopt.estimate import reconstruct
    from dpopt.estimate.engines.least_squares import MATRIX_FREE_NNZ

    backend, options = params.backend, dict(params.solver_options)
    if (backend is None and not options and params.objective == "l2" and constraints.nonnegative
            and not (constraints.invariants or constraints.inequalities)
            and _nonzeros(measurement.query) > MATRIX_FREE_NNZ):
        # Large, bounds only: the NNLS working set (at most as many positive cells as rows). The
        # engine's own size estimate counts a weighted row's entries by their L1 norm, which for
        # HDMM's weighted marginals undercounts by the number of marginals (nltcs 3-way: 30 s
        # instead of 11 minutes of interior point).
        backend, options = "scipy", {"working_set": True}
    result = reconstruct([measurement], constraints, params.objective, backend=backend,
                         time_limit=params.time_limit, integer=False, **options)
    if result.success and result.x is not None:
        # reconstruct's constraint residuals: every declared constraint must hold (1e-6).
        table = result.constraint_residuals
        shaped = table[~table["constraint"].str.startswith("integer")] if len(table) else table
        if len(shaped) and not bool(shaped["satisfied"].all()):
            bad = shaped.loc[~shaped["satisfied"], "constraint"].iloc[0]
            result.success, result.status = False, Status.NUMERICAL_ERROR
            result.message = f"the solver's point violates {bad} beyond 1e-6: not released"
    return result


def _nonzeros(query: LinearQuery) -> float:
    """The number of non-zero entries of a query: ``sum_ij |a_ij|^p`` for a tiny ``p`` counts them."""
    powers = query.column_norm_powers(1e-12)
    return float(np.sum(powers)) if np.ndim(powers) else float(powers) * query.domain.size
