"""The top-down release: measure every level, pass the answers up, then solve every parent's children.

1. **Measure** every unit of every level, root first, with each of the level's queries: one
   charge per query for the whole level (units are disjoint: parallel composition through
   :meth:`~dpopt.privacy.accountant.Accountant.parallel`, McSherry 2009, Thm. 4), noise drawn
   here on the driver in a fixed order (so the release depends only on the seed, never on the
   executor), in chunks of units to bound memory.
2. **Upward pass** (:mod:`~dpopt.algorithms.topdown.upward`, Hay et al. 2010): each unit's
   answers combined with its children's summed estimates, leaves first, so that a parent's
   table is fitted to everything measured in its subtree (``upward=False``: its own answers only).
3. **Solve**, level by level, root first (Abowd et al. 2022, §5–6; design notes §2), each
   parent's children jointly (:func:`~dpopt.algorithms.topdown.solve.solve_parent`) on the
   executor, largest problems first, against the parent's released table.
4. **Check** each level on the driver, independently of the workers: children add up to their
   parent cell by cell (except where the failsafe relaxed it, reported), invariants, zeros,
   non-negativity; and record the residuals against the noisy answers and the solve times.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from dpopt.algorithms.topdown.constraints import UnitInvariant, ZeroRules
from dpopt.algorithms.topdown.executors import Executor
from dpopt.algorithms.topdown.solve import ParentTask, SolveOptions, TaskInvariant, TaskQuery, solve_parent
from dpopt.algorithms.topdown.upward import QueryEstimate, estimates, identity_key, query_key
from dpopt.errors import PrivacyParameterError
from dpopt.estimate.status import Status
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.kronecker import Kronecker
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import NoiseLaw, calibrate, measure

__all__ = ["LevelQuery", "LevelOutcome", "TopDownOutcome", "run_levels", "measure_level", "CHUNK_CELLS"]

#: Noisy answers drawn per chunk of units (bounds the sampler's memory).
CHUNK_CELLS = 2**22

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LevelQuery:
    """A query asked of every unit of one level, with its noise law (from the plan)."""

    level: int
    label: str
    query: LinearQuery
    law: NoiseLaw
    share: Fraction
    ledger_label: str


@dataclass(eq=False)
class LevelOutcome:
    """One level's released tables, noisy answers and report."""

    name: str
    level: int
    table: np.ndarray
    noisy: dict
    solutions: list
    report: dict


@dataclass(eq=False)
class TopDownOutcome:
    """Every level's outcome; ``status`` OPTIMAL when every parent's solve was."""

    levels: list = field(default_factory=list)
    status: Status = Status.OPTIMAL
    message: str = ""
    failsafe: list = field(default_factory=list)


def measure_level(q: LevelQuery, counts: sp.csr_matrix, chars: Domain, accountant: Accountant, rng,
                  level_name: str) -> np.ndarray:
    """Noisy answers of ``q.query`` for every unit (rows of ``counts``): charged once, drawn in chunks.

    The level is charged ``q.law.cost`` once (:meth:`Accountant.parallel`); each chunk of units
    is a disjoint part measured by :func:`~dpopt.privacy.mechanisms.measure` with the
    block-diagonal query ``I ⊗ Q``, whose sensitivity (derived from the operator, and checked
    equal to the planned one) is that of ``Q``: one person is in one unit.
    """
    units = counts.shape[0]
    rows = q.query.num_rows
    part_of = accountant.parallel(q.ledger_label, q.law.cost,
                                  detail=f"{q.law.describe()}; parallel composition over the {units:,} disjoint "
                                         f"units of level {level_name!r}")
    per_chunk = max(1, CHUNK_CELLS // max(chars.size, rows))
    out = np.empty((units, rows), dtype=np.float64)
    for start in range(0, units, per_chunk):
        stop = min(units, start + per_chunk)
        domain = Domain(("unit", *chars.attrs), (stop - start, *chars.sizes), chars.labels)
        block = Kronecker([(sp.identity(stop - start, format="csr"), "unit"), q.query], domain=domain)
        law = calibrate(block, q.law.cost, q.law.mechanism)
        if (law.parameter, law.grid) != (q.law.parameter, q.law.grid):  # pragma: no cover - an identity of norms
            raise PrivacyParameterError(f"{q.ledger_label}: the block query's noise {law.parameter} differs from "
                                        f"the planned {q.law.parameter}")
        sub = counts[start:stop].tocoo()
        codes = np.column_stack([sub.row, chars.unravel(sub.col)]) if sub.nnz else np.zeros((0, len(domain)), np.int64)
        data = Dataset(codes, domain, sub.data.astype(np.int64))
        m = measure(block, data, q.law, part_of.part(f"units {start}-{stop - 1}"), rng,
                    label=f"{q.ledger_label} [{start}:{stop}]")
        out[start:stop] = m.values.reshape(stop - start, rows)
    return out


def run_levels(
    geography: Geography,
    chars: Domain,
    leaf_counts: sp.csr_matrix,
    queries: list[LevelQuery],
    invariants: list[UnitInvariant],
    zeros: ZeroRules,
    accountant: Accountant,
    rng,
    *,
    executor: Executor,
    options: SolveOptions = SolveOptions(),
    progress: bool = False,
    keep_noisy: bool = True,
    upward: bool = True,
) -> TopDownOutcome:
    """Measure every level, combine each unit's answers with its subtree's (``upward``), then
    solve every level, root first (see the module notes)."""
    from tqdm import tqdm

    counts = geography.level_histograms(leaf_counts)
    outcome = TopDownOutcome()
    noisy, measure_seconds = [], []
    for k, name in enumerate(geography.names):
        tick = time.perf_counter()
        noisy.append({q.label: measure_level(q, counts[k], chars, accountant, rng, name)
                      for q in queries if q.level == k})
        measure_seconds.append(time.perf_counter() - tick)
        log.info("level %s: measured %d units in %.1f s", name, geography.sizes[k], measure_seconds[k])
        counts[k] = None  # the confidential counts of this level are not needed again
    tick = time.perf_counter()
    fitted = estimates(geography, queries, noisy, upward=upward)
    upward_seconds = time.perf_counter() - tick
    previous = None
    identity = identity_key(chars)
    for k, name in enumerate(geography.names):
        mine = [q for q in queries if q.level == k]
        tasks = build_tasks(k, geography, chars, previous, fitted[k], [inv for inv in invariants if inv.level == k],
                            zeros, options)
        tick = time.perf_counter()
        with tqdm(total=len(tasks), desc=f"top-down {name}", unit="parent", disable=not progress, leave=False) as bar:
            solutions = executor.map(solve_parent, tasks, sizes=[t.size for t in tasks], progress=bar)
        solve_seconds = time.perf_counter() - tick
        failed = [s for s in solutions if s.status is not Status.OPTIMAL or s.table is None]
        events = [dict(s.failsafe, level_name=name, parent_level=geography.names[k - 1],
                       cells=_cell_names(chars, s.failsafe.get("cells", [])))
                  for s in solutions if s.failsafe is not None]
        outcome.failsafe.extend(events)
        if failed:
            s = failed[0]
            outcome.status = s.status if s.status is not Status.OPTIMAL else Status.NUMERICAL_ERROR
            outcome.message = (f"level {name!r}: the problem of parent {s.parent_id!r} ended with status "
                               f"{outcome.status.name}: {s.message}" + (f" ({len(failed)} parents failed)"
                                                                         if len(failed) > 1 else ""))
            outcome.levels.append(LevelOutcome(name, k, None, noisy[k] if keep_noisy else {}, solutions,
                                               {"level": name, "failed": len(failed)}))
            return outcome
        table = np.zeros((geography.sizes[k], chars.size), dtype=np.int64)
        for task, sol in zip(tasks, solutions):
            table[np.ix_(task.children, task.cells)] = sol.table
        report = level_report(k, geography, chars, table, previous, mine, noisy[k], solutions, events,
                              [inv for inv in invariants if inv.level == k], zeros)
        report["estimates"] = [{"query": e.label, "own": e.own, "noise": e.noise,
                                "noise_stddev_median": float(np.median(np.sqrt(e.variance)))} for e in fitted[k]]
        detailed = [e for e in fitted[k] if query_key(e.query) == identity]
        if detailed:
            report["detailed_noise_stddev"] = float(np.median(np.sqrt(detailed[0].variance)))
        report["seconds"] = {"measure": measure_seconds[k], "solve": solve_seconds,
                             **({"upward": upward_seconds} if k == 0 else {})}
        t = report["solve_seconds"]
        log.info("level %s: %d units, %d parents, %d variables; measure %.1f s, solve %.1f s (per parent median "
                 "%.2f s, max %.1f s, total %.0f s); failsafe %d", name, report["units"], report["parents"],
                 report["variables"], measure_seconds[k], solve_seconds, t["median"], t["max"], t["total"], len(events))
        outcome.levels.append(LevelOutcome(name, k, table, noisy[k] if keep_noisy else {}, solutions, report))
        previous = table
    outcome.message = (f"{geography.depth} levels released" +
                       (f"; the failsafe relaxed {len(outcome.failsafe)} parents (see the report)"
                        if outcome.failsafe else ""))
    return outcome


def build_tasks(k: int, geography: Geography, chars: Domain, parent_tables: np.ndarray | None,
                fitted: list[QueryEstimate], invariants: list[UnitInvariant], zeros: ZeroRules,
                options: SolveOptions) -> list[ParentTask]:
    """One task per parent of level ``k`` (one task, the root itself, at ``k = 0``), with the
    level's answers ``fitted`` (:func:`~dpopt.algorithms.topdown.upward.estimates`)."""
    forbidden = zeros.forbidden(geography, k)
    allowed = ~zeros.shared
    matrices = [sp.csc_matrix(e.query.to_sparse()) for e in fitted]
    cache: dict[bytes, dict] = {}
    lookups = [inv.lookup(geography.sizes[k]) for inv in invariants]
    if k == 0:
        groups = [(-1, str(geography.names[0]), np.array([0]))]
    else:
        order, starts = geography.children(k - 1)
        ids = geography.units[k - 1]
        groups = [(p, str(ids[p]), order[starts[p]:starts[p + 1]]) for p in range(geography.sizes[k - 1])]
    tasks = []
    for parent, parent_id, children in groups:
        if forbidden is None:
            cells, child_zeros = np.flatnonzero(allowed), None
        else:
            mine = forbidden[children] | ~allowed
            cells = np.flatnonzero(~mine.all(axis=0))
            child_zeros = mine[:, cells] if mine[:, cells].any() else None
        key = cells.tobytes()
        if key not in cache:  # restricted query matrices are shared by parents with the same cells
            restricted = []
            for matrix in matrices:
                sub = matrix[:, cells].tocsr()
                rows = np.flatnonzero(sub.getnnz(axis=1))
                restricted.append((sub[rows], rows))
            cache[key] = {"queries": restricted,
                          "invariants": [sp.csr_matrix(inv.matrix[:, cells]) for inv in invariants]}
        restricted = cache[key]
        task_queries = tuple(_task_query(e, sub, rows, children) for e, (sub, rows) in zip(fitted, restricted["queries"]))
        task_invariants = []
        for inv, lookup, matrix in zip(invariants, lookups, restricted["invariants"]):
            pos = lookup[children]
            has = np.flatnonzero(pos >= 0)
            if has.size:
                task_invariants.append(TaskInvariant(inv.name, matrix, has, inv.values[pos[has]]))
        parent_table = None if parent_tables is None else parent_tables[parent, cells]
        tasks.append(ParentTask(k, parent, parent_id, children, cells, parent_table, task_queries,
                                tuple(task_invariants), child_zeros, options))
    return tasks


def _task_query(e: QueryEstimate, matrix: sp.csr_matrix, rows: np.ndarray, children: np.ndarray) -> TaskQuery:
    """The children's answers to one query; one variance for all of them when they share it."""
    variance, scale = e.variance[children], e.scale[children]
    if np.all(variance == variance[0]):
        variance, scale = float(variance[0]), float(scale[0])
    return TaskQuery(e.label, matrix, e.values[children][:, rows], e.noise, scale, variance)


def level_report(k, geography, chars, table, parent_tables, queries, noisy, solutions, events, invariants,
                 zeros) -> dict:
    """What a reader of the release needs about one level (JSON-ready; see the module notes)."""
    name = geography.names[k]
    fits = []
    for q in queries:
        released = np.asarray(q.query.to_sparse() @ table.T).T
        r = released - noisy[q.label]
        fits.append({"query": q.label, "noise": q.law.family, "noise_stddev": q.law.stddev,
                     "answers": int(r.size), "rms_residual": float(np.sqrt(np.mean(r**2))),
                     "rms_standardized": float(np.sqrt(np.mean(r**2)) / q.law.stddev),
                     "max_abs_residual": float(np.abs(r).max(initial=0.0))})
    residuals = {"negative_cells": int((table < 0).sum()),
                 "zero_cells_violated": int(table[:, zeros.shared].sum())}
    forbidden = zeros.forbidden(geography, k)
    if forbidden is not None:
        residuals["zero_cells_violated"] += int(table[forbidden].sum())
    if parent_tables is not None:
        sums = np.zeros_like(parent_tables)
        np.add.at(sums, geography.parents[k], table)
        gap = sums - parent_tables
        relaxed = {e["parent"] for e in events if e.get("relaxed")}
        at_failsafe = np.isin(geography.units[k - 1], list(relaxed))
        residuals["parent_sum_max_violation"] = int(np.abs(gap[~at_failsafe]).max(initial=0))
        residuals["parent_sum_failsafe_slack"] = int(np.abs(gap[at_failsafe]).sum())
    worst = 0.0
    for inv in invariants:
        got = np.asarray(inv.matrix @ table[inv.units].T).T
        worst = max(worst, float(np.abs(got - inv.values).max(initial=0.0)))
    residuals["invariants_max_violation"] = worst
    totals = np.array([s.times.get("total", 0.0) for s in solutions])
    return {
        "level": name, "units": int(geography.sizes[k]), "parents": len(solutions),
        "variables": int(sum(s.variables for s in solutions)),
        "queries": fits, "constraint_residuals": residuals, "failsafe_events": len(events),
        "backend_fallbacks": [f"{s.parent_id}: {s.fallback}" for s in solutions if s.fallback][:20],
        "solve_seconds": _distribution(totals),
        "l2_seconds": float(sum(s.times.get("l2", 0.0) for s in solutions)),
        "rounding_seconds": float(sum(s.times.get("round", 0.0) for s in solutions)),
    }


def _distribution(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"count": 0}
    q = np.quantile(values, [0.5, 0.9, 0.99])
    return {"count": int(values.size), "total": float(values.sum()), "min": float(values.min()),
            "median": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(values.max())}


def _cell_names(chars: Domain, cells) -> list[str]:
    """Labels of characteristics cells, e.g. ``"18+ | Hispanic | White | household"``."""
    if not len(cells):
        return []
    codes = chars.unravel(np.asarray(cells, dtype=np.int64))
    return [" | ".join(str(chars.labels_of(a)[c]) for a, c in zip(chars.attrs, row)) for row in codes]
