"""Measure marginals, then estimate in marginal space: the release for domains no table can hold.

The plan is that of ``measure_reconstruct`` (the spec's ``[[measure]]`` tables, each with its
exact share of the budget and the noise :func:`~dpopt.privacy.mechanisms.calibrate` derives),
restricted to marginals, totals and the identity; the reconstruction is
:func:`dpopt.estimate.marginal_space.estimate_marginals` (residual least squares, then the
non-negative consistent fit over the marginal polytope's local relaxation, certified), which
never forms the full table. The release holds

- the workload marginals (every measured set, plus ``[marginal_space] workload``), with their
  ``noisy`` answers beside the measured ones;
- synthetic records drawn from a Bayesian network fitted to the estimate
  (:func:`~dpopt.estimate.marginal_space.sampling.synthetic_records`, post-processing with the
  release's own random source);
- with ``[constraints] integer = true``, integer marginals: those of the records (consistent
  with each other and whole persons), the estimate's fractional counts beside them.

A deliberately small algorithm: choosing *what* to measure is the workload-first ``auto``
plan's job; this one measures what the spec names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from dpopt.algorithms.base import Algorithm, AlgorithmParams, Release, make_release, register
from dpopt.algorithms.measure_reconstruct import parse_measure_tables, plan_measures
from dpopt.errors import DomainError, DpoptError, ParameterError, QueryError, at_key
from dpopt.estimate.marginal_space import EXACT_CELLS, MAX_CLIQUE_CELLS, MarginalFrameMap, estimate_marginals
from dpopt.estimate.marginal_space.estimator import OBJECTIVES, choose_objective, smooth_cannot_keep
from dpopt.estimate.marginal_space.layout import clique_cells, maximal_sets
from dpopt.estimate.marginal_space.total import TOTAL_MODES
from dpopt.estimate.status import Status
from dpopt.privacy.mechanisms import measure
from dpopt.spec.model import MeasureSpec

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.spec.table import SpecReader

__all__ = ["MarginalSpace", "MarginalSpaceParams", "marginal_release_answers", "SOLVER_BYTES_PER_CELL",
           "TREE_BYTES_PER_CELL"]

#: Bytes held per clique cell by the estimator (L-BFGS-B's ten pairs of vectors, the iterate, the
#: gradient, the marginals, the index map) — the envelope ``resources`` charges.
SOLVER_BYTES_PER_CELL = 8 * 28
#: Bytes held per junction-tree cell by the smooth estimate (clique marginals, log factors and
#: their tangents, separators, the conjugate-gradient vectors over the measured rows). Measured,
#: not guessed: tracemalloc's peak over the tree's cells was 263-268 B on trees of 16 k, 115 k
#: and 852 k cells (binary windows of 10, 13 and 16 attributes, one row per tree cell).
TREE_BYTES_PER_CELL = 8 * 35
#: The query kinds a ``[[measure]]`` table may name here.
MARGINAL_KINDS = {"marginal": ("attrs",), "total": (), "identity": (), "all_marginals": ("k",)}


@dataclass(frozen=True)
class MarginalSpaceParams(AlgorithmParams):
    """``[[measure]]`` tables and ``[marginal_space]``.

    Attributes
    ----------
    measures : tuple of MeasureSpec
        As for ``measure_reconstruct``; marginals, totals and the identity only.
    workload : tuple of attribute tuples, or int, or None
        Marginals released besides the measured ones: listed sets, or ``k`` for every ``k``-way
        marginal.
    time_limit : float or None
        Seconds for the estimation.
    records : bool
        Draw synthetic records (needed for integer marginals).
    max_parents : int or None
        Largest parent set of the records' network (default: the largest clique minus one).
    exact_cells : int
        Domains of at most this many cells are solved as a table (exact), see
        :func:`~dpopt.estimate.marginal_space.estimate_marginals`.
    shrink : bool
        Empirical-Bayes shrinkage of the measured interactions towards independence
        (``estimate_marginals(shrink=True)``); off by default.
    total : {"auto", "measured", "free"}
        The record count when nothing public fixes it (``estimate_marginals(total=...)``,
        :mod:`~dpopt.estimate.marginal_space.total`): held at its measured estimate ``n̂``, left to
        the non-negative fit, or (default) held when the free total's predicted bias exceeds
        ``n̂``'s standard error. A public count is an invariant on the total (``[constraints]``).
    objective : {"auto", "l2", "smooth"}
        ``estimate_marginals(objective=...)``: least squares, the smooth estimate on a junction
        tree, or (default) the rule of
        :func:`~dpopt.estimate.marginal_space.estimator.choose_objective` (smooth when nothing it
        cannot keep is declared, the domain is beyond the dense table and the tree of the measured
        sets holds at most :data:`~dpopt.estimate.marginal_space.estimator.SMOOTH_TREE_CELLS`
        cells). Decided in the
        plan, from public quantities only.
    """

    measures: tuple[MeasureSpec, ...] = ()
    workload: tuple | int | None = None
    time_limit: float | None = None
    records: bool = True
    max_parents: int | None = None
    exact_cells: int = EXACT_CELLS
    shrink: bool = False
    total: str = "auto"
    objective: str = "auto"

    def validate(self) -> None:
        if not self.measures:
            raise ParameterError("measures: give at least one measurement")
        w = self.workload
        if w is not None and not (isinstance(w, int) and not isinstance(w, bool) and w >= 1) and \
                not (isinstance(w, tuple) and w and all(isinstance(s, tuple) and s for s in w)):
            raise ParameterError(f"workload must be an order k >= 1 or a non-empty list of attribute lists, got {w!r}")
        if self.time_limit is not None and not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0):
            raise ParameterError(f"time_limit must be positive seconds, got {self.time_limit!r}")
        if self.max_parents is not None and not (isinstance(self.max_parents, int) and self.max_parents >= 0):
            raise ParameterError(f"max_parents must be an integer >= 0, got {self.max_parents!r}")
        if not isinstance(self.records, bool):
            raise ParameterError(f"records must be true or false, got {self.records!r}")
        if isinstance(self.exact_cells, bool) or not isinstance(self.exact_cells, int) or self.exact_cells < 0:
            raise ParameterError(f"exact_cells must be an integer >= 0, got {self.exact_cells!r}")
        if not isinstance(self.shrink, bool):
            raise ParameterError(f"shrink must be true or false, got {self.shrink!r}")
        check_total_mode(self.total)
        if isinstance(self.objective, bool) or self.objective not in OBJECTIVES:
            raise ParameterError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got "
                                 f"{self.objective!r}")
        if self.objective == "smooth" and self.shrink:
            raise ParameterError("shrink = true is an option of objective 'l2', not 'smooth'")

    def describe(self) -> str:
        w = self.workload
        extra = "" if w is None else f", workload {w if isinstance(w, int) else len(w)}"
        return f"{len(self.measures)} measurement{'s' if len(self.measures) != 1 else ''}{extra}"

    @classmethod
    def from_spec(cls, reader: "SpecReader") -> "MarginalSpaceParams":
        from dpopt.spec.queries import parse_marginals

        measures = parse_measure_tables(reader, MARGINAL_KINDS)
        t = reader.table("marginal_space")
        workload = parse_marginals(t, "workload") if t.has("workload") else None
        return cls(measures, workload, t.float("time_limit", positive=True), t.bool("records", default=True),
                   t.int("max_parents", minimum=0), t.int("exact_cells", default=EXACT_CELLS, minimum=0),
                   t.bool("shrink", default=False), total_from_spec(t),
                   t.str("objective", default="auto", choices=OBJECTIVES))


@register
class MarginalSpace(Algorithm):
    """Measure the named marginals; estimate the workload's in marginal space; draw records from it."""

    name = "marginal_space"
    title = "noisy marginals, then the consistent non-negative marginals that fit them best, without the full table"
    reference = ("residual least squares (Xiao et al., NeurIPS 2023; Mullins et al., NeurIPS 2024) with non-negativity "
                 "over the local marginal polytope (Wainwright and Jordan 2008, §4.1)")
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants"})
    sections = {"measure": ("label", "query", "attrs", "k", "mechanism", "share"),
                "marginal_space": ("workload", "time_limit", "records", "max_parents", "exact_cells", "shrink",
                                   "total", "objective")}
    dense_domain = False
    Params = MarginalSpaceParams

    def workload_sets(self, domain) -> list[tuple[str, ...]]:
        w = self.params.workload
        if w is None:
            return []
        if isinstance(w, int):
            if w > len(domain):
                raise at_key(QueryError(f"workload = {w} exceeds the {len(domain)} attributes"),
                             ("marginal_space", "workload"))
            return [tuple(c) for c in combinations(domain.attrs, w)]
        try:
            return [domain.canonical(domain.check_attrs(s)) for s in w]
        except DpoptError as exc:
            raise at_key(QueryError(str(exc)), ("marginal_space", "workload")) from None

    def plan(self, domain, constraints, budget):
        planned = plan_measures(self.params.measures, domain, budget)
        from dpopt.estimate.marginal_space import marginal_sets
        from dpopt.model.measurement import Measurement

        for m in planned:  # only marginals, totals and the identity can be estimated in marginal space
            try:
                marginal_sets([Measurement.exact(m.query, np.zeros(m.query.num_rows), m.label)])
            except QueryError as exc:
                raise at_key(exc, m.path) from None
        workload = self.workload_sets(domain)
        sets = [tuple(getattr(m.query, "attrs", ())) for m in planned] + workload
        cells = clique_cells(domain, sets)
        if cells > MAX_CLIQUE_CELLS:
            raise at_key(DomainError(f"the marginals to estimate hold {cells:,} cells, above the limit of "
                                     f"{MAX_CLIQUE_CELLS:,}; measure or release fewer or smaller marginals"),
                         ("marginal_space", "workload") if workload else ("measure",))
        how = "solved as a table (exact)" if domain.size <= self.params.exact_cells else \
            "estimated in marginal space (the full table is never formed)"
        choice = self.objective(domain, constraints, planned, workload)
        lines = [f"marginal space: {len(set(sets))} marginals ({cells:,} cells), {how}",
                 f"objective ([marginal_space] objective = {self.params.objective!r}): {choice.reason}",
                 "records: a Bayesian network fitted to the estimate" if self.params.records else "no records"]
        lines.extend(least_squares_size_warning(domain, sets, choice))
        return self.new_plan(domain, constraints, budget, steps=planned, measures=planned, details=workload,
                             lines=lines)

    def objective(self, domain, constraints, planned, workload):
        """The estimate's objective (:func:`plan_objective`) for these planned measures and workload."""
        from dpopt.estimate.marginal_space import marginal_sets
        from dpopt.model.measurement import Measurement

        measured = marginal_sets([Measurement.exact(m.query, np.zeros(m.query.num_rows), m.label) for m in planned])
        return plan_objective(domain, constraints, measured, workload, self.params, ("marginal_space", "objective"))

    def memory(self, plan) -> list[tuple]:
        """What the run holds: ``(what, spec path, bytes, detail, advice)`` (read by ``resources``)."""
        choice = self.objective(plan.domain, plan.constraints, plan.measures, list(plan.details or []))
        if choice.objective == "smooth" and not choice.table:
            return [("the smooth marginal-space estimate", ("marginal_space", "objective"),
                     float(choice.tree_cells) * TREE_BYTES_PER_CELL, f"a junction tree of {choice.tree_cells:,} cells",
                     "measure fewer or smaller marginals, or set [marginal_space] objective = 'l2'")]
        sets = [tuple(getattr(m.query, "attrs", ())) for m in plan.measures] + list(plan.details or [])
        cells = clique_cells(plan.domain, sets)
        return [("the marginal-space estimate", ("marginal_space",), float(cells) * SOLVER_BYTES_PER_CELL,
                 f"{cells:,} marginal cells", "measure or release fewer or smaller marginals")]

    def run(self, plan, data, accountant, rng) -> Release:
        p = self.params
        measurements = [measure(m.query, data, m.law, accountant, rng, label=m.label) for m in plan.measures]
        workload = list(dict.fromkeys([tuple(getattr(m.query, "attrs", ())) for m in measurements
                                       if getattr(m.query, "attrs", ())] + list(plan.details or [])))
        estimate = estimate_marginals(measurements, workload or None, plan.constraints, time_limit=p.time_limit,
                                      exact_cells=p.exact_cells, shrink=p.shrink, total=p.total,
                                      objective=p.objective)
        if not estimate.success:
            return make_release(self, plan, accountant, status=estimate.status, measurements=measurements,
                                reconstruction=estimate,
                                info={"spec_key": ("marginal_space",), "total": estimate.info["total"],
                                      "objective": estimate.info["objective"]},
                                message=not_certified_message(estimate))
        if estimate.get("table") is not None:  # a small domain, solved as a table: release it as a table
            return self._release_table(plan, accountant, estimate, measurements)
        records = None
        if p.records or plan.constraints.integral:
            records = estimate.records(rng=rng, max_parents=p.max_parents)
        answers = marginal_release_answers(plan.domain, estimate.workload, estimate.marginal, records,
                                           measurements, plan.constraints.integral)
        notes = [polytope_note(estimate), objective_note(estimate), total_note(estimate)]
        if records is not None:
            notes.append("Synthetic records: drawn from a Bayesian network fitted to the estimate (post-processing); "
                         "each family's counts within one record of its conditional law.")
        if plan.constraints.integral:
            notes.append("Integer marginals: those of the synthetic records (whole persons, consistent); the "
                         "estimate's fractional counts are in the 'fitted' column.")
        from dpopt.model.data import decode_codes

        release = make_release(self, plan, accountant, status=Status.OPTIMAL, message=estimate.message,
                            measurements=measurements, reconstruction=estimate,
                            records=None if records is None or not p.records else decode_codes(records, plan.domain),
                            notes=notes, info={"polytope": estimate.info["polytope"],
                                               "certificate": estimate.info["certificate"],
                                               "marginals": len(estimate.workload), "total": estimate.info["total"],
                                               "objective": estimate.info["objective"]})
        release.answers = answers  # a lazy mapping: frames are built when read
        return release

    def _release_table(self, plan, accountant, estimate, measurements) -> Release:
        """The dense route's release: the table (rounded when integral, as ``measure_reconstruct``
        rounds), its answers to the measurements and its workload marginals."""
        from dpopt.algorithms.base import marginal_answers, measured_answers, round_release

        counts, rounding, failure = round_release(estimate.table, plan.constraints, measurements,
                                                  self.params.time_limit)
        if failure is not None:
            return make_release(self, plan, accountant, status=rounding.status, measurements=measurements,
                                reconstruction=estimate, rounding=rounding, message=failure,
                                info={"spec_key": ("constraints", "integer")})
        answers = {**measured_answers(measurements, counts),
                   **marginal_answers(plan.domain, counts, [w for w in plan.details or []])}
        return make_release(self, plan, accountant, status=Status.OPTIMAL, message=estimate.message, counts=counts,
                            answers=answers, measurements=measurements, reconstruction=estimate, rounding=rounding,
                            notes=[f"The domain has {plan.domain.size:,} cells, at most exact_cells = "
                                   f"{self.params.exact_cells:,}: solved as a table, exactly.", objective_note(estimate),
                                   total_note(estimate)],
                            info={"polytope": "table", "total": estimate.info["total"],
                                  "objective": estimate.info["objective"]})

    @classmethod
    def example(cls, domain):
        from dpopt.algorithms.measure_reconstruct import MeasureReconstruct

        return cls.Params(MeasureReconstruct.example(domain).measures)  # three pair marginals


def check_total_mode(total) -> str:
    """``total`` of ``[marginal_space]`` / ``[auto]``: one of the estimator's modes (ParameterError)."""
    if not isinstance(total, str) or total not in TOTAL_MODES:
        raise ParameterError(f"total must be one of {', '.join(map(repr, TOTAL_MODES))}, got {total!r}")
    return total


def total_from_spec(table) -> str:
    """The ``total`` key of a spec table: a mode of :data:`~dpopt.estimate.marginal_space.total.TOTAL_MODES`
    (default ``"auto"``). A number is refused with the way to state a public count: an invariant."""
    value = table.raw.get("total")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise table.error(("total",), f"must be one of {', '.join(map(repr, TOTAL_MODES))}, got {value!r}; a record "
                                      "count that is public is an invariant: [constraints] invariants = "
                                      f"[{{ query = \"total\", values = [{value!r}] }}]")
    return table.str("total", default="auto", choices=TOTAL_MODES)


def plan_objective(domain, constraints, measured, workload, params, key: tuple):
    """The estimate's objective, decided in the plan from public quantities
    (:func:`~dpopt.estimate.marginal_space.estimator.choose_objective` under ``"auto"``); an asked-for
    ``"smooth"`` whose junction tree exceeds
    :data:`~dpopt.estimate.marginal_space.MAX_CLIQUE_CELLS` is refused at ``key``, naming its
    largest clique's cells."""
    from dpopt.estimate.marginal_space.estimator import ObjectiveChoice
    from dpopt.estimate.marginal_space.graphical.smooth import read_cells, tree_cells

    objective = params.objective
    options = {"total": params.total, "shrink": getattr(params, "shrink", False),
               "nonnegative": getattr(params, "nonnegative", True), "exact_cells": getattr(params, "exact_cells",
                                                                                           EXACT_CELLS)}
    if objective == "auto":
        return choose_objective(domain, measured, workload, constraints, **options)
    table = bool(options["exact_cells"]) and domain.size <= options["exact_cells"]
    if objective == "l2":
        return ObjectiveChoice("l2", "l2", "least squares: asked for", None, MAX_CLIQUE_CELLS, table)
    if not options["nonnegative"]:
        raise at_key(ParameterError("'smooth' keeps non-negativity: nonnegative = false needs objective 'l2'"), key)
    unkept = smooth_cannot_keep(constraints, params.total)
    if unkept is not None:  # refused here, before any budget is spent
        raise at_key(ParameterError(f"'smooth' cannot run: {unkept}; use objective 'l2' or 'auto'"), key)
    if table:
        return ObjectiveChoice("smooth", "smooth", "smooth: asked for (the table fits: the dense smooth engine)",
                               None, MAX_CLIQUE_CELLS, True)
    axes = [tuple(sorted(domain.axes(s))) for s in measured if s]
    work = [tuple(sorted(domain.axes(s))) for s in workload]
    cells, largest, _ = tree_cells(domain.sizes, axes, work, MAX_CLIQUE_CELLS)
    if cells > MAX_CLIQUE_CELLS:
        raise at_key(DomainError(
            f"'smooth' needs a junction tree of more than {MAX_CLIQUE_CELLS:,} cells (a clique of "
            f"{math.prod(domain.sizes[a] for a in largest):,} cells: {', '.join(domain.attrs[a] for a in largest)}); "
            "use objective 'l2' or 'auto', or measure fewer or smaller marginals"), key)
    read, worst = read_cells(domain.sizes, axes, work, MAX_CLIQUE_CELLS)
    if read > MAX_CLIQUE_CELLS:
        raise at_key(DomainError(
            f"'smooth' would read the workload marginal on ({', '.join(domain.attrs[a] for a in worst)}) off its "
            f"junction tree with an array of {read:,} cells, above {MAX_CLIQUE_CELLS:,}; use objective 'l2' or "
            "'auto'"), key)
    return ObjectiveChoice("smooth", "smooth", f"smooth: asked for (a junction tree of {cells:,} cells)", cells,
                           MAX_CLIQUE_CELLS, False)


def polytope_note(estimate) -> str:
    """The release note saying over what the marginals were estimated (``info["polytope"]``)."""
    polytope = estimate.info["polytope"]
    where = polytope if polytope == "junction tree" else f"{polytope} polytope"
    return f"Marginals estimated in marginal space ({where}): " + {
        "table": "the domain is small enough to be solved as a table, exactly.",
        "marginal": "the marginals are decomposable, so the fit is that of the best table.",
        "local": "a relaxation: every released marginal is non-negative and consistent with every other, but no "
                 "single table need have them all.",
        "junction tree": "the smooth estimate is a graphical model on a junction tree of the measured sets, so "
                         "every released marginal is one table's (positive and consistent)."}[polytope]


def objective_note(estimate, key: str = "[marginal_space] objective") -> str:
    """The release note saying which objective the estimate used and why (``info["objective"]``)."""
    o = estimate.info["objective"]
    return f"Objective ({key} = {o['asked']!r}): {o['reason']}."


def total_note(estimate, key: str = "[marginal_space] total") -> str:
    """The release note saying which total the estimate used and why (``info["total"]``); ``key``
    names the spec key that sets the mode."""
    t = estimate.info["total"]
    if t["mode"] == "public":
        return f"Record count: {t['reason']}."
    return f"Record count ({key} = {t['mode']!r}): {t['reason']}."


def not_certified_message(estimate) -> str:
    """One line for a marginal-space estimate that is not an estimate (status not OPTIMAL): the
    status, what was not certified, and that nothing was released."""
    return (f"the marginal-space estimate is not certified ({estimate.status.name}), so nothing was released: "
            f"{estimate.message}")


def least_squares_size_warning(domain, sets, choice) -> list[str]:
    """A plan line (``dpopt check``) when least squares on the local relaxation is beyond the one
    rule of :func:`~dpopt.strategy.wide_selection.least_squares_reach` (cyclic sets above
    ``ALL_L2_CELLS``, decomposable ones above ``DECOMPOSABLE_L2_CELLS``; the evidence is in its
    docstring). ``auto``'s wide plan avoids such a fit before any draw; an explicit spec is the
    user's choice, so it is warned, not refused: a fit that is not certified by ``time_limit``
    releases nothing, after the budget is spent."""
    from dpopt.strategy.wide_selection import least_squares_reach

    if choice.objective != "l2" or choice.table:
        return []
    reach = least_squares_reach(domain, sets)
    if reach.fits:
        return []
    return [f"warning: least squares: {reach.reason} (in the measured runs 4.06 M cells of cyclic triples of adult "
            "certified in 8-17 CPU-minutes; all 364 of its triples, 20.9 M cells, in 2.6 CPU-hours, 125 minutes "
            "on 2 threads; "
            "dpopt.strategy.wide_selection.least_squares_reach); a fit not certified by "
            "time_limit releases nothing, after the budget is spent. Measure fewer or smaller marginals, or use the "
            "algorithm auto"]


def marginal_release_answers(domain, sets, marginal_of, records: np.ndarray | None, measurements, integral: bool):
    """The released marginals, built when read: attribute columns and ``count`` (the estimate's, or
    with ``integral`` the records' whole counts and the estimate's beside them as ``fitted``), plus
    ``noisy`` for a set measured once by a marginal query. ``records``: codes ``(n, d)``."""
    from dpopt.model.data import Dataset, cells_frame

    noisy = {}
    for m in measurements:
        attrs = tuple(getattr(m.query, "attrs", ()))
        if attrs:
            noisy[attrs] = None if attrs in noisy else m.values
    coded = None if records is None else Dataset(records, domain)

    def frame_of(attrs):
        attrs = domain.canonical(attrs)
        fitted = np.asarray(marginal_of(attrs), dtype=np.float64)
        frame = cells_frame(domain.project(attrs), coded.marginal(attrs) if integral else fitted)
        if integral:
            frame["fitted"] = fitted
        values = noisy.get(tuple(attrs))
        if values is not None:
            frame["noisy"] = values.astype(np.int64) if np.array_equal(values, np.round(values)) else values
        return frame

    return MarginalFrameMap(frame_of, [tuple(s) for s in sets], cells_of=lambda s: domain.project(s).size)
