"""The ``auto`` plan: the user names the tables; dpopt chooses what to measure and how to fit.

A workload-first spec states the tables it wants answered (``[workload]``), the budget and the
constraints, and nothing about measurements or objectives. ``auto`` then

1. **chooses what to measure, before any data** (:mod:`dpopt.strategy.candidates`): every
   candidate strategy — the full histogram, the workload's own marginals with their budget shares
   optimised, the ResidualPlanner's optimal residual measurement (Xiao et al., NeurIPS 2023), the
   lower orders alone, HDMM's optimised strategies for ranges — is scored by the exact expected
   error of each workload table under the noise the budget buys, beside the SVD lower bound, and
   the rule of that module picks one. ``dpopt check`` prints it all. One candidate is adaptive,
   compared only when named (``[auto] candidates`` or ``strategy = "tree"``): ``tree``
   (:mod:`dpopt.strategy.tree_selection`, after MST) measures the one-way marginals, chooses a
   spanning tree of pairs by the exponential mechanism, then measures those pairs; it is weighed
   before data by a charge on what it may leave unmeasured, and then fitted by the smooth
   estimates only;
2. **measures** it with the whole budget (:func:`~dpopt.privacy.mechanisms.measure`, charged before
   the draw);
3. **chooses how to fit from the noisy answers alone** (:mod:`dpopt.estimate.choice`): least
   squares or the smooth estimate, on all the residuals measured or only the workload's (lower)
   ones, scored by Stein's unbiased risk estimate of the workload error with exact Jacobians, the
   release being the least-risk fit or its least-risk blend with another (positive when the fit
   has exact zeros); non-negativity on, the total held at its estimate when no invariant fixes it. The estimation
   is one call, :meth:`Auto.fit` (a subclass or :attr:`AutoParams.fitter` can replace it, e.g.
   with a marginal-space estimator for domains too large for a dense table);
4. **rounds** to integers when the constraints ask, by controlled rounding that keeps every
   workload table's answer at the floor or ceiling of its fitted value.

The release's notes give the choice of strategy and of estimate with their evidence, and every
directly measured workload table whose estimated error is above its noisy answers'.

**Beyond the dense table.** On a domain of more than ``EXACT_CELLS`` (2^20) cells no table is
formed: what to measure is :mod:`dpopt.strategy.wide_selection`'s rule (one-way marginals, then
every workload marginal or, when that would be mostly noise, a few chosen by the exponential
mechanism as in MST/AIM), and the consistent non-negative marginals are estimated in marginal space
(:func:`dpopt.estimate.marginal_space.estimate_marginals`: residual least squares, then the
certified projection over the local polytope; issue #27); integer output is the marginals of
synthetic records drawn from that estimate. Ranges need the table and are refused there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd

from dpopt.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    AlgorithmPlan,
    PlannedMeasure,
    Release,
    make_release,
    marginal_answers,
    register,
    round_release,
)
from dpopt.errors import DpoptError, ParameterError, at_key
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.measurement import Measurement
from dpopt.privacy.budget import MECHANISMS
from dpopt.privacy.mechanisms import measure
from dpopt.spec.workload import WORKLOAD_KEYS, WorkloadDeclaration, parse_workload
from dpopt.strategy.candidates import CANDIDATES, DEFAULT_CANDIDATES, CandidateComparison, compare_candidates
from dpopt.strategy.tables import Workload

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.estimate.choice.rule import FitChoice
    from dpopt.model.data import Dataset
    from dpopt.privacy.accountant import Accountant
    from dpopt.privacy.randomness import RandomSource

__all__ = ["Auto", "AutoParams", "AutoPlan", "ESTIMATORS"]

#: ``estimator`` choices: the rule, or one objective forced (still under non-negativity).
ESTIMATORS = ("auto", "l2", "smooth")
#: Keys of the optional ``[auto]`` table.
AUTO_KEYS = ("strategy", "candidates", "estimator", "select", "mechanism", "time_limit", "nonnegative", "total")
#: Bytes a wide release holds per answer of its workload marginals (``memory``): the algorithm's
#: tables (the marginal's codes, count and fitted), the released frames beside the noisy answers,
#: and a piece of the long file being written. Measured on adult's 364 triples (20.9 M answers,
#: models/adult_auto.toml): peak RSS 1.80 GB after the algorithm with 0.84 GB of answer frames,
#: 2.55 GB without writing them, 3.00 GB writing them as Parquet: about 2.0 GB, ~96 B per answer.
ANSWER_BYTES_PER_CELL = 96


@dataclass(frozen=True)
class AutoParams(AlgorithmParams):
    """Parameters of :class:`Auto` (``[workload]`` and the optional ``[auto]`` table).

    Attributes
    ----------
    workload : WorkloadDeclaration or Workload
        The tables to answer (a :class:`~dpopt.strategy.tables.Workload` must be over the plan's domain).
    strategy : str
        ``"best"`` (the rule of :mod:`dpopt.strategy.candidates`) or a candidate's name to force it.
    candidates : tuple of str
        The strategies compared (default: every one but the adaptive ``tree``, which is compared
        only when named here; :data:`~dpopt.strategy.candidates.DEFAULT_CANDIDATES`).
    estimator : {"auto", "l2", "smooth"}
        ``"auto"``: the risk rule of :mod:`dpopt.estimate.choice.rule`; otherwise only that objective's
        candidates are scored. Beyond the dense table it is the marginal-space estimate's
        ``objective``: ``"auto"`` is the rule of
        :func:`~dpopt.estimate.marginal_space.estimator.choose_objective` on the sets the selection
        measured (smooth when their junction tree holds at most
        :data:`~dpopt.estimate.marginal_space.estimator.SMOOTH_TREE_CELLS` cells and nothing it cannot
        keep is declared), ``"smooth"`` needs the junction tree of every workload set to fit.
    select : str or None
        How the scored fits become the release (:func:`~dpopt.estimate.choice.rule.choose_fit`'s
        ``select``: ``"by_noise"``, ``"least"``, ``"one_se"``, ``"l1"``, ``"stack"``, ``"ewa"``,
        ``"se_weights"``); None: the library's
        default (:data:`~dpopt.estimate.choice.rule.DEFAULT_SELECTION`).
    mechanism : {"laplace", "gaussian"} or None
        Default: the budget's natural noise.
    time_limit : float or None
        Seconds for each solve and for the rounding.
    nonnegative : bool
        Non-negativity (on by default; counts cannot be negative).
    total : {"auto", "measured", "free"}
        Beyond the dense table: the marginal-space estimator's record count
        (:mod:`dpopt.estimate.marginal_space.total`; default its rule). The dense fit always holds
        the total at its measured estimate (``"auto"`` and ``"measured"``; ``"free"`` is refused there).
    fitter : callable or None
        Replaces :meth:`Auto.fit`: ``fitter(measurements, constraints, workload, params) -> FitChoice``.
    """

    workload: WorkloadDeclaration | Workload | None = None
    strategy: str = "best"
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    estimator: str = "auto"
    select: str | None = None
    mechanism: str | None = None
    time_limit: float | None = None
    nonnegative: bool = True
    total: str = "auto"
    fitter: Callable | None = field(default=None, repr=False, compare=False)

    def validate(self) -> None:
        if not isinstance(self.workload, (WorkloadDeclaration, Workload)):
            raise ParameterError(f"workload must be a WorkloadDeclaration or a Workload, got "
                                 f"{type(self.workload).__name__}")
        if isinstance(self.candidates, str) or not self.candidates:
            raise ParameterError(f"candidates must be a non-empty list of strategy names, got {self.candidates!r}")
        object.__setattr__(self, "candidates", tuple(self.candidates))
        bad = [c for c in self.candidates if c not in CANDIDATES]
        if bad:
            raise ParameterError(f"candidates: unknown strategy {bad[0]!r}; choose from {list(CANDIDATES)}")
        if self.strategy != "best" and self.strategy not in CANDIDATES:
            raise ParameterError(f"strategy must be 'best' or one of {list(CANDIDATES)}, got {self.strategy!r}")
        if self.estimator not in ESTIMATORS:
            raise ParameterError(f"estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        from dpopt.estimate.choice.rule import SELECTIONS

        if self.select is not None and self.select not in SELECTIONS:
            raise ParameterError(f"select must be one of {list(SELECTIONS)}, got {self.select!r}")
        if self.mechanism is not None and self.mechanism not in MECHANISMS:
            raise ParameterError(f"mechanism must be one of {list(MECHANISMS)}, got {self.mechanism!r}")
        if self.time_limit is not None and not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0):
            raise ParameterError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")
        if not isinstance(self.nonnegative, bool):
            raise ParameterError(f"nonnegative must be true or false, got {self.nonnegative!r}")
        from dpopt.algorithms.marginal_space import check_total_mode

        check_total_mode(self.total)
        if self.fitter is not None and not callable(self.fitter):
            raise ParameterError("fitter must be callable")

    def to_dict(self) -> dict:
        out = super().to_dict()
        w = self.workload
        out["workload"] = w.describe()
        out.pop("fitter", None)
        return out

    def describe(self) -> str:
        return (f"workload: {self.workload.describe()}; strategy {self.strategy}, estimator {self.estimator}"
                + ("" if self.nonnegative else ", negative counts allowed"))

    @classmethod
    def from_spec(cls, reader) -> "AutoParams":
        """``[workload]`` (required) and ``[auto]`` (optional); every error names file, line and key."""
        workload = parse_workload(reader.table("workload", required=True))
        t = reader.table("auto")
        strategy = t.str("strategy", default="best", choices=("best",) + CANDIDATES)
        candidates = tuple(t.str_list("candidates", default=list(DEFAULT_CANDIDATES), choices=CANDIDATES))
        estimator = t.str("estimator", default="auto", choices=ESTIMATORS)
        from dpopt.estimate.choice.rule import SELECTIONS

        select = t.str("select", default=None, choices=SELECTIONS)
        mechanism = t.str("mechanism", default=None, choices=MECHANISMS)
        if mechanism is not None:
            try:
                reader.budget.noise(mechanism)
            except DpoptError as exc:
                raise t.error(("mechanism",), str(exc)) from None
        time_limit = t.float("time_limit", default=None, positive=True)
        nonnegative = t.bool("nonnegative", default=True)
        from dpopt.algorithms.marginal_space import total_from_spec

        return cls(workload, strategy, candidates, estimator, select, mechanism, time_limit, nonnegative,
                   total_from_spec(t))


@dataclass(frozen=True, eq=False)
class AutoPlan:
    """The public plan of ``auto``: the workload, the comparison of strategies and the chosen one."""

    workload: Workload
    comparison: CandidateComparison
    mechanism: str
    tree: object = None  # dpopt.strategy.tree_selection.TreePlan when the adaptive tree is the plan

    @property
    def chosen(self):
        return self.comparison.chosen

    def frame(self) -> pd.DataFrame:
        return self.comparison.frame()


@dataclass(frozen=True, eq=False)
class AutoWidePlan:
    """The plan of ``auto`` beyond the dense table: every workload marginal measured once (module notes)."""

    workload: Workload
    mechanism: str
    sets: tuple
    cells: int
    selection: object = None  # dpopt.strategy.wide_selection.WideSelectionPlan
    tree_cells: int = 0  # the junction tree of every workload set and one-way (bounds the smooth estimate's)
    #: The most clique cells a least-squares fit of this plan can hold: every fit it runs is held to
    #: wide_selection.fit_in_reach (0 when no least-squares fit is in reach, so none runs).
    l2_cells: int | None = None


@register
class Auto(Algorithm):
    """Answer a workload: the strategy with the least expected error, the fit with the least estimated risk."""

    name = "auto"
    aliases = ("workload",)
    title = "the workload's tables: measurement chosen by expected error, fit chosen by estimated risk"
    reference = ("Y. Xiao, G. Ding, D. Ding, Y. Hu, S. Wang, An optimal and scalable matrix mechanism for noisy "
                 "marginals under convex loss functions, NeurIPS 2023 (ResidualPlanner); C. Li et al., PODS 2010 "
                 "(expected error); C. Stein, Ann. Statist. 9 (1981) (unbiased risk estimate)")
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities"})
    sections = {"workload": WORKLOAD_KEYS, "auto": AUTO_KEYS}
    Params = AutoParams

    # ---- plan -------------------------------------------------------------------------------------
    def plan(self, domain, constraints, budget) -> AlgorithmPlan:
        params = self.params
        workload = params.workload
        if isinstance(workload, Workload):
            if workload.domain != domain:
                raise ParameterError(f"workload: it is over {workload.domain}, not the plan's {domain}")
        else:
            workload = workload.build(domain)
        mechanism = budget.noise(params.mechanism)
        if not self.holds_dense_table(domain):
            return self._plan_marginal_space(domain, constraints, budget, workload, mechanism)
        if params.total == "free":  # the dense fit's risk estimates are derived with the total held
            raise at_key(ParameterError("total = 'free' applies beyond the dense table only (marginal space); the "
                                        "dense fit always holds the total at its measured estimate"), ("auto", "total"))
        label = "strategy"
        cost = budget.shares({label: 1})[label]
        if params.strategy == "tree":  # forced: compared with the unbiased candidates it is charged against
            comparison = compare_candidates(workload, cost, mechanism,
                                            tuple(dict.fromkeys([*params.candidates, "tree"])))
            forced = next(c for c in comparison.candidates if c.name == "tree")
            if not forced.applies:
                raise ParameterError(f"strategy: 'tree' does not apply here: {forced.reason}")
            comparison.chosen, comparison.reason = forced, "forced by [auto] strategy = 'tree'"
        else:
            names = params.candidates if params.strategy == "best" else (params.strategy,)
            comparison = compare_candidates(workload, cost, mechanism, names)
        chosen = comparison.chosen
        tree = None
        if chosen.name == "tree":
            from dpopt.strategy.tree_selection import plan_tree

            tree = plan_tree(domain, cost, mechanism)
            steps = tree.steps()
        else:
            steps = [PlannedMeasure(label, chosen.query, mechanism, Fraction(1), cost, chosen.law,
                                    what=f"{chosen.name}: {chosen.query.name}", answers=chosen.query.num_rows)]
        details = AutoPlan(workload, comparison, mechanism, tree)
        lines = comparison.lines()
        lines.append("how to fit: chosen after the measurement, from the noisy answers only (Stein's unbiased risk "
                     "estimate of the workload error; dpopt.estimate.choice)"
                     + ("" if params.estimator == "auto" else f", among {params.estimator} fits only")
                     + ("; non-negative" if params.nonnegative else "")
                     + ("; then controlled rounding to integers" if constraints.integral else ""))
        return self.new_plan(domain, constraints, budget, steps=steps, details=details, lines=lines)

    # ---- run ----------------------------------------------------------------------------------------
    def run(self, plan: AlgorithmPlan, data: "Dataset", accountant: "Accountant", rng: "RandomSource") -> Release:
        details: AutoPlan = plan.details
        if data.domain != plan.domain:
            raise ParameterError(f"the data's domain {data.domain} differs from the plan's {plan.domain}")
        if isinstance(details, AutoWidePlan):
            return self._run_marginal_space(plan, data, accountant, rng)
        plan.domain.require_dense("the auto plan's released table")
        tree = None
        if details.tree is not None:
            from dpopt.strategy.tree_selection import run_tree

            tree = run_tree(details.tree, data, accountant, rng)
            measurements = tree.measurements
        else:
            step = plan.steps[0]
            measurements = [measure(step.query, data, step.law, accountant, rng, label=step.label)]
        constraints = plan.constraints
        if self.params.nonnegative and not constraints.nonnegative:
            constraints = ConstraintSet(plan.domain, [*constraints.constraints, NonNegativity()])
        fit = self.fit(measurements, constraints, details.workload, tree=tree is not None)
        result = fit.result
        info = self._info(details, fit)
        notes = self._notes(details, fit)
        if tree is not None:
            info["tree"] = tree.info()
            notes.insert(1, "the tree's pairs (chosen by the exponential mechanism): "
                         + ", ".join(" x ".join(e) for e in tree.edges))
        if not result.success or result.x is None:
            status = result.status if isinstance(result.status, Status) else Status.NOT_SOLVED
            return make_release(self, plan, accountant, status=status, measurements=measurements,
                                reconstruction=result, info=info, notes=notes,
                                message=f"the fit ended with status {status.name}: {result.message}")
        kept = []
        for t in details.workload.tables:
            q = t.query(plan.domain)
            if q.is_integer:
                kept.append(Measurement.exact(q, q.matvec(result.x), label=t.label))
        counts, rounding, failure = round_release(result.x, constraints, kept, self.params.time_limit)
        if failure is not None:
            return make_release(self, plan, accountant, status=rounding.status, measurements=measurements,
                                reconstruction=result, rounding=rounding, message=failure, info=info, notes=notes)
        sets = [t.attrs for t in details.workload.tables if t.kind == "marginal"]
        answers = marginal_answers(plan.domain, np.asarray(counts, dtype=np.float64), sets) if sets else {}
        return make_release(self, plan, accountant, status=result.status, message=result.message, counts=counts,
                            answers=answers, measurements=measurements, reconstruction=result, rounding=rounding,
                            notes=notes, info=info)

    def without_attributes(self, attrs) -> "Auto":
        """The workload's marginals with ``attrs`` taken out (a single-valued attribute adds only a
        constant column to a marginal, and has no residual): for the privacy audit's domains."""
        import dataclasses

        w = self.params.workload
        drop = set(attrs)
        if not isinstance(w, WorkloadDeclaration) or not drop or (not w.sets and not set(w.ranges) & drop):
            return self
        sets = tuple(dict.fromkeys(tuple(a for a in s if a not in drop) for s in w.sets))
        sets = tuple(s for s in sets if s)
        declared = dataclasses.replace(w, sets=sets, ranges=tuple(a for a in w.ranges if a not in drop),
                                       total=w.total or not (sets or w.k or w.ranges), weights=())
        return type(self)(dataclasses.replace(self.params, workload=declared))

    # ---- beyond the dense table (module notes) -----------------------------------------------------
    def holds_dense_table(self, domain) -> bool:
        from dpopt.estimate.marginal_space import EXACT_CELLS

        return domain.size <= EXACT_CELLS

    def memory(self, plan) -> list[tuple]:
        """What a marginal-space run holds (read by ``resources`` when no table is held)."""
        from dpopt.algorithms.marginal_space import SOLVER_BYTES_PER_CELL

        from dpopt.algorithms.marginal_space import TREE_BYTES_PER_CELL
        from dpopt.estimate.marginal_space.estimator import SMOOTH_TREE_CELLS

        cells = answers = getattr(plan.details, "cells", 0)
        # The release itself: every cell of every workload marginal, read off the fit whatever it is.
        released = ("the released answer tables", ("workload",), float(answers) * ANSWER_BYTES_PER_CELL,
                    f"{answers:,} answers", "name fewer or smaller marginals in [workload]")
        # Every least-squares fit the plan runs is held to wide_selection.fit_in_reach (the fit of
        # "all" before any draw, each selection's pick before it is measured): charge what it can hold.
        held = getattr(plan.details, "l2_cells", None)
        cells = cells if held is None else min(cells, held)
        least_squares = ("the marginal-space estimate", ("workload",), float(cells) * SOLVER_BYTES_PER_CELL,
                         f"{cells:,} marginal cells", "name fewer or smaller marginals in [workload]")
        if self.params.estimator == "l2":
            return [least_squares, released]
        # The smooth estimate's tree is that of the measured sets, known after the selection: at most
        # every workload set's, and under "auto" at most SMOOTH_TREE_CELLS (else least squares runs).
        tree = getattr(plan.details, "tree_cells", 0)
        if self.params.estimator == "auto":
            tree = min(tree, SMOOTH_TREE_CELLS)
        smooth = ("the smooth marginal-space estimate", ("auto", "estimator"), float(tree) * TREE_BYTES_PER_CELL,
                  f"a junction tree of at most {tree:,} cells", "name fewer or smaller marginals in [workload], or "
                  "set [auto] estimator = 'l2'")
        if self.params.estimator == "smooth":
            return [smooth, released]
        return [max(least_squares, smooth, key=lambda row: row[2]), released]

    def _plan_marginal_space(self, domain, constraints, budget, workload: Workload, mechanism: str) -> AlgorithmPlan:
        from dpopt.estimate.marginal_space.layout import clique_cells
        from dpopt.errors import DomainError
        from dpopt.estimate.marginal_space import EXACT_CELLS, MAX_CLIQUE_CELLS
        from dpopt.estimate.marginal_space.estimator import SMOOTH_TREE_CELLS
        from dpopt.strategy.wide_selection import (
            ALL_L2_CELLS,
            DECOMPOSABLE_L2_CELLS,
            least_squares_reach,
            plan_wide_selection,
        )

        if not workload.is_marginal:
            raise ParameterError(f"workload: the domain has {domain.size:.3g} cells, beyond the dense table "
                                 f"({EXACT_CELLS:,} cells), where auto answers marginal tables only; ranges need the "
                                 "table (use fewer or coarser attributes)")
        if constraints.inequalities:
            raise ParameterError("constraints: inequalities are not kept in marginal space (the domain has "
                                 f"{domain.size:.3g} cells, beyond the dense table)")
        sets = workload.marginal_sets()
        cells = clique_cells(domain, sets)
        if cells > MAX_CLIQUE_CELLS:
            raise DomainError(f"workload: its marginals hold {cells:,} cells, above the marginal-space limit of "
                              f"{MAX_CLIQUE_CELLS:,}; name fewer or smaller marginals")
        tree = self._wide_tree(domain, constraints, sets)
        # What to measure: that module's rule, which also decides from public sizes whether the fit of
        # "all" can finish (else only selection is open), with the fit's own options.
        selection = plan_wide_selection(domain, sets, budget, mechanism, fit={
            "constraints": constraints, "objective": self.params.estimator, "total": self.params.total,
            "nonnegative": self.params.nonnegative})
        how = {"auto": "the smooth estimate on a junction tree of the measured sets when it holds at most "
                       f"{SMOOTH_TREE_CELLS:,} cells and nothing it cannot keep is declared, else residual least "
                       "squares and the certified non-negative consistent projection (decided after the selection, "
                       "from the sets it chose)",
               "l2": "residual least squares, then the certified non-negative consistent projection",
               "smooth": f"the smooth estimate on a junction tree of the measured sets (at most {tree:,} cells)"
               }[self.params.estimator]
        lines = [f"the domain has {domain.size:.3g} cells, beyond the dense table ({EXACT_CELLS:,} cells)",
                 *selection.lines(),
                 f"how to fit ([auto] estimator = {self.params.estimator!r}): estimated in marginal space, {cells:,} "
                 f"marginal cells; {how}; the full table is never formed"
                 + ("; integer marginals from synthetic records" if constraints.integral else "")]
        # The largest least-squares fit any run of this plan can hold: every fit is held to
        # fit_in_reach, whose least-squares limit (least_squares_reach) is at most DECOMPOSABLE_L2_CELLS;
        # and none runs when least squares on the workload's sets is already out of reach.
        reach = least_squares_reach(domain, list(sets) + [(a,) for a in domain.attrs])
        l2_cells = min(cells, max(ALL_L2_CELLS, DECOMPOSABLE_L2_CELLS)) if reach.fits else 0
        details = AutoWidePlan(workload, mechanism, tuple(sets), cells, selection, tree, l2_cells)
        return self.new_plan(domain, constraints, budget, steps=selection.steps(), details=details, lines=lines)

    def _wide_tree(self, domain, constraints, sets) -> int:
        """Cells of the junction tree of every workload set and one-way: the most the selection can
        measure, so a bound on the smooth estimate's tree. With ``estimator = "smooth"`` it must fit
        (:data:`~dpopt.estimate.marginal_space.MAX_CLIQUE_CELLS`), and non-negativity must be on,
        or the plan is refused here, before any budget is spent."""
        import math

        from dpopt.errors import DomainError
        from dpopt.estimate.marginal_space import MAX_CLIQUE_CELLS
        from dpopt.estimate.marginal_space.graphical.smooth import tree_cells

        axes = [tuple(sorted(domain.axes(s))) for s in sets] + [(a,) for a in range(len(domain))]
        cells, largest, _ = tree_cells(domain.sizes, axes, [], MAX_CLIQUE_CELLS)
        if self.params.estimator != "smooth":
            return cells
        if not self.params.nonnegative:
            raise at_key(ParameterError("estimator = 'smooth' keeps non-negativity: nonnegative = false needs "
                                        "estimator 'l2'"), ("auto", "estimator"))
        from dpopt.estimate.marginal_space.estimator import smooth_cannot_keep

        unkept = smooth_cannot_keep(constraints, self.params.total)
        if unkept is not None:  # refused here, before any budget is spent
            raise at_key(ParameterError(f"estimator = 'smooth' cannot run: {unkept}; use 'l2' or 'auto'"),
                         ("auto", "estimator"))
        if cells > MAX_CLIQUE_CELLS:
            raise at_key(DomainError(
                f"estimator = 'smooth' may need a junction tree of more than {MAX_CLIQUE_CELLS:,} cells (the "
                f"selection may measure every workload set; a clique of "
                f"{math.prod(domain.sizes[a] for a in largest):,} cells: "
                f"{', '.join(domain.attrs[a] for a in largest)}); use estimator 'auto' or 'l2'"), ("auto", "estimator"))
        return cells

    def _run_marginal_space(self, plan, data, accountant, rng) -> Release:
        from dpopt.algorithms.marginal_space import (
            marginal_release_answers,
            not_certified_message,
            objective_note,
            total_note,
        )
        from dpopt.estimate.marginal_space import estimate_marginals
        from dpopt.model.data import decode_codes
        from dpopt.strategy.wide_selection import run_wide_selection

        details: AutoWidePlan = plan.details
        selection = run_wide_selection(details.selection, data, accountant, rng)
        measurements = selection.measurements
        estimate = estimate_marginals(measurements, list(details.sets), plan.constraints,
                                      nonnegative=self.params.nonnegative, time_limit=self.params.time_limit,
                                      total=self.params.total, objective=self.params.estimator)
        info = {"marginal_space": True, "marginals": len(details.sets), "cells": details.cells,
                "wide_selection": selection.info(), "total": estimate.info["total"],
                "objective": estimate.info["objective"]}
        if not estimate.success:
            return make_release(self, plan, accountant, status=estimate.status, measurements=measurements,
                                reconstruction=estimate, info={**info, "spec_key": ("auto",)},
                                message=not_certified_message(estimate))
        integral = plan.constraints.integral
        records = estimate.records(rng=rng) if integral else None
        polytope = estimate.info["polytope"]
        notes = [f"the domain has {plan.domain.size:.3g} cells: {selection.describe()}; estimated in marginal space "
                 f"({polytope if polytope == 'junction tree' else polytope + ' polytope'}); no table was formed",
                 objective_note(estimate, "[auto] estimator"), total_note(estimate, "[auto] total")]
        if integral:
            notes.append("integer marginals: those of synthetic records drawn from the estimate (whole persons, "
                         "consistent); the estimate's fractional counts are in the 'fitted' column")
        release = make_release(self, plan, accountant, status=Status.OPTIMAL, message=estimate.message,
                               measurements=measurements, reconstruction=estimate, notes=notes, info=info,
                               records=None if records is None else decode_codes(records, plan.domain))
        release.answers = marginal_release_answers(plan.domain, estimate.workload, estimate.marginal, records,
                                                   measurements, integral)
        return release

    def fit(self, measurements, constraints: ConstraintSet, workload: Workload, tree: bool = False) -> "FitChoice":
        """The estimation step: one call (module notes). Default: :func:`dpopt.estimate.choice.rule.choose_fit`.

        After the adaptive tree (``tree``), only the smooth fits are candidates: the residuals the
        tree left out are completed by the maximum-entropy model (Private-PGM's completion), where
        least squares would leave them wherever the solver stops and no risk estimate sees them."""
        if self.params.fitter is not None:
            return self.params.fitter(measurements, constraints, workload, self.params)
        from dpopt.estimate.choice.rule import DEFAULT_CANDIDATES, choose_fit

        candidates = DEFAULT_CANDIDATES
        if tree and not constraints.inequalities:
            candidates = tuple(c for c in candidates if c.objective == "smooth")
        if self.params.estimator != "auto":
            candidates = tuple(c for c in candidates if c.objective == self.params.estimator)
        if constraints.inequalities:
            candidates = tuple(c for c in candidates if c.objective == "l2")  # smooth takes no inequalities
        return choose_fit(measurements, constraints, workload, candidates, time_limit=self.params.time_limit,
                          select=self.params.select)

    # ---- report -------------------------------------------------------------------------------------
    @staticmethod
    def _info(details: AutoPlan, fit) -> dict[str, Any]:
        info = {"strategy": details.chosen.name, "candidates": details.frame().to_dict("records"),
                "svd_bound": details.comparison.bound, "fit_rule": fit.rule}
        if fit.chosen is not None:
            info["estimator"] = fit.chosen.candidate.name
            info["estimators"] = fit.frame().to_dict("records")
            info["tables"] = fit.table_frame(details.workload).to_dict("records")
        info["over_noisy"] = [{"table": a, "released_risk": b, "noisy_risk": c} for a, b, c in fit.over_noisy]
        info["accuracy_tables"] = _accuracy_tables(details, info.get("tables", []))
        return info

    @staticmethod
    def _notes(details: AutoPlan, fit) -> list[str]:
        c = details.comparison
        notes = [f"measured: {c.chosen.name} ({c.reason})"]
        notes.extend(fit.lines(details.workload, max_tables=8))
        return notes

    @classmethod
    def example(cls, domain) -> AutoParams:
        k = 2 if len(domain) >= 2 else 1
        return cls.Params(WorkloadDeclaration(k=k))


def _accuracy_tables(details: AutoPlan, tables: list[dict]) -> list[dict]:
    """Per workload table, RMS per answer for the report (dpopt.release.accuracy's columns): the
    chosen plan's expected error before data and, after the fit, the risk estimate of the released
    table beside that of the noisy (or least-squares) answers. Risks are total squared errors."""
    from dpopt.strategy.candidates import _cells

    chosen = [r for r in details.frame().to_dict("records") if r["chosen"]]
    fitted = {t["table"]: t for t in tables}
    cells_of = {t.label: _cells(details.workload, t) for t in details.workload.tables}
    out = []
    for r in chosen:
        cells = cells_of.get(r["table"])
        t = fitted.get(r["table"], {})
        per_cell = (lambda risk: float(np.sqrt(max(risk, 0.0) / cells))  # noqa: E731
                    if cells and risk is not None and np.isfinite(risk) else None)
        out.append({"table": r["table"], "answers": cells, "expected_rmse": float(r["rmse_per_cell"]),
                    "estimated_rmse": per_cell(t.get("released_risk")),
                    "noisy_estimated_rmse": per_cell(t.get("noisy_risk")), "noisy_is": t.get("noisy_is")})
    return out

