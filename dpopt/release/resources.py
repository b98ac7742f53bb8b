"""How much memory a planned release needs, estimated before any data is read.

A release over ``n`` cells holds the table and the solver's vectors over every cell; the
consistency engine adds what its method holds per measurement. :func:`estimate_memory`
adds these up from the public plan (domain, planned queries, ``[reconstruct]`` settings,
constraints) and names the solve the plan takes; :func:`check_resources` checks the estimate
against the memory limit. Above it, a least-squares fit with bounds only (non-negativity,
structural zeros) is sent down the matrix-free path (scipy's L-BFGS-B on the measurements'
operators: ``MATRIX_FREE_BYTES_PER_CELL`` per cell, no matrix) when that fits; otherwise the
plan is refused with one line naming the measurement (or the domain) that needs the memory,
the limit, and advice that fits the case. ``dpopt check`` prints the solve and the figures.
Nothing here branches on an algorithm's name: it reads the plan's steps, the spec's generic
``reconstruct`` settings and the algorithm's ``takes_engine_options``.

The figures are an envelope of peaks measured on this code (``ru_maxrss`` of a release run
in a fresh process; ``examples/benchmarks/bench_memory.py`` prints them beside the
estimates):

* every release: about ``(120 + 16 k)`` bytes per cell for ``k`` attributes (the released
  table as labelled columns, the fitted and rounded tables, cell bounds and the
  matrix-free solver's vectors);
* an explicit interior-point or simplex solve (cvxpy/Clarabel, HiGHS; the L2 and entropy
  objectives below ``MATRIX_FREE_NNZ`` stacked non-zeros, any L2 problem with invariants
  other than the total or with inequalities, a full L1/L-infinity LP): about 1,500 bytes
  per non-zero and per row of each measurement's matrix (400 for the LP, 250 for scipy's
  bounded least squares on an explicit matrix);
* a working-set solve (non-negative least squares or column generation on large domains):
  a dense Gram matrix and block over the working set, whose size is bounded by the measured
  rows (a non-negative least-squares optimum has at most one positive cell per row),
  ``8 W (3 W + rows)`` bytes; measurements whose matrix is a diagonal (the identity, one
  row per cell) have a diagonal Gram, a vector, and are solved matrix-free when they are all
  there is.

An algorithm that does not hold the full table (``dense_domain = False``: records or answers
only) is charged what its ``memory(plan)`` method says it holds, when it has one (the
marginal-space estimate's clique cells, factored MWEM's workload cells): the domain's size
itself is no limit for it. The engine figures apply to algorithms that declare the
``[reconstruct]`` section.

The limit is ``DPOPT_MEMORY_LIMIT`` (bytes, or with a K/M/G/T suffix; ``none`` turns the check
off) when set, else three quarters (:data:`DEFAULT_MEMORY_SHARE`) of the machine's memory: its
physical memory, or the memory limit of its control group (a container) when that is lower. The
decision is therefore the same on every machine with the same memory, whatever else is running:
the memory available at the moment only adds a warning (:class:`~dpopt.errors.MemoryWarning`)
when it is below the estimate.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpopt.errors import MemoryWarning, SpecError

__all__ = ["MemoryItem", "MemoryEstimate", "ResourceLimitError", "estimate_memory", "check_resources",
           "memory_limit", "machine_memory", "format_bytes", "BYTES_PER_CELL", "BYTES_PER_ATTRIBUTE_CELL",
           "EXPLICIT_BYTES_PER_NONZERO", "MATRIX_FREE_BYTES_PER_CELL", "DEFAULT_MEMORY_SHARE"]

#: Bytes per cell of every release that holds a table (plus :data:`BYTES_PER_ATTRIBUTE_CELL` per attribute).
BYTES_PER_CELL = 120
BYTES_PER_ATTRIBUTE_CELL = 16
#: Bytes per answer of a released workload: its label, value and standard error as built and written
#: (3.6 million box labels of 45 characters peaked at about 215 bytes each).
BYTES_PER_ANSWER = 250
#: Bytes per non-zero (and per row) of a measurement's matrix in an explicit interior-point solve.
EXPLICIT_BYTES_PER_NONZERO = 1500
#: Bytes per non-zero of an explicit LP (HiGHS simplex) of the L1/L-infinity objectives.
LP_BYTES_PER_NONZERO = 400
#: Bytes per non-zero (and per row) of an explicit bounded least-squares solve by scipy.
LSQ_BYTES_PER_NONZERO = 250
#: Bytes per cell of the matrix-free L-BFGS-B solve: its 20 correction pairs and work vectors
#: (measured: 449,280 cells, three 3-way marginals, about 250 MiB above the interpreter's).
MATRIX_FREE_BYTES_PER_CELL = 400
#: The default memory limit, as a share of the machine's memory (physical, or its cgroup limit).
DEFAULT_MEMORY_SHARE = 0.75
#: The engine options of the matrix-free path (:func:`dpopt.estimate.engines.least_squares.solve_l2`).
MATRIX_FREE_OPTIONS = {"matrix_free": True, "working_set": False}
_ENV = "DPOPT_MEMORY_LIMIT"


class ResourceLimitError(SpecError):
    """A planned release would need more memory than the limit (named in the message)."""


@dataclass(frozen=True)
class MemoryItem:
    """One part of the estimate: what needs it, the spec key it comes from, bytes, and how."""

    what: str
    path: tuple
    bytes: float
    engine: str
    detail: str
    advice: str


@dataclass
class MemoryEstimate:
    """The memory a release needs: its parts, their sum, the solve it assumes and the limit.

    ``solve`` names the consistency solve the plan takes (``dpopt check`` prints it);
    ``engine_options`` are what the algorithm passes to the engine to take it; ``note`` says
    why the plan chose a path other than the default.
    """

    items: list[MemoryItem] = field(default_factory=list)
    limit: float | None = None
    limit_source: str = ""
    solve: str = "no consistency solve"
    engine_options: dict = field(default_factory=dict)
    note: str = ""

    @property
    def total(self) -> float:
        return float(sum(item.bytes for item in self.items))

    @property
    def largest(self) -> MemoryItem | None:
        return max(self.items, key=lambda item: item.bytes, default=None)

    def describe(self) -> str:
        """Two lines for ``dpopt check``: the solve the plan takes, and the memory."""
        text = f"solve: {self.solve}" + (f" ({self.note})" if self.note else "")
        if self.total <= 0:
            return text + "\nmemory: not estimated: this algorithm holds no table over the full domain"
        text += f"\nmemory: about {format_bytes(self.total)}"
        if self.largest is not None and self.largest.bytes > 0.5 * self.total:
            text += f" (mostly {self.largest.what}: {self.largest.detail})"
        if self.limit is not None:
            text += f"; limit {format_bytes(self.limit)} ({self.limit_source})"
        return text


def format_bytes(value: float) -> str:
    """``1.8 TiB``-style sizes."""
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover - the loop always returns


def memory_limit() -> tuple[float | None, str]:
    """``(bytes, where it comes from)``: ``DPOPT_MEMORY_LIMIT`` when set, else
    :data:`DEFAULT_MEMORY_SHARE` of :func:`machine_memory` (never the memory available now)."""
    text = os.environ.get(_ENV)
    if text and text.strip().lower() == "none":
        return None, f"{_ENV}=none"
    if text:
        match = re.fullmatch(r"\s*([0-9.]+(?:[eE][0-9]+)?)\s*([KMGTP]?)(?:i?B)?\s*", text, re.IGNORECASE)
        if not match:
            raise SpecError(f"{_ENV}={text!r}: give a number of bytes, optionally with K, M, G or T (e.g. 8G), "
                            "or none")
        scale = 1024 ** "KMGTP".find(match.group(2).upper()) * 1024 if match.group(2) else 1
        return float(match.group(1)) * scale, f"{_ENV}"
    total, what = machine_memory()
    if total is None:
        return None, f"the machine's memory is unknown: no limit (set {_ENV})"
    return DEFAULT_MEMORY_SHARE * total, f"3/4 of the {format_bytes(total)} of {what}; {_ENV} overrides"


def machine_memory() -> tuple[float | None, str]:
    """``(bytes, what)``: the physical memory, or the control group's (container's) memory limit when
    lower. Fixed for a machine: it does not change with what else is running."""
    try:
        physical = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        physical = None
    group = _cgroup_limit()
    if group is not None and (physical is None or group < physical):
        return group, "the container's memory limit"
    return physical, "physical memory"


def _cgroup_limit() -> float | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            return float(text)
    return None


def memory_available_now() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` (only ever a warning, never a decision)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def estimate_memory(p, *, matrix_free: bool = False) -> MemoryEstimate:
    """The memory a planned release (:class:`~dpopt.release.plan.ReleasePlan`) will need, and the
    solve it assumes: the engine's default for the plan, or with ``matrix_free`` the matrix-free
    path (:data:`MATRIX_FREE_OPTIONS`; see :func:`matrix_free_applies`)."""
    domain = p.domain
    n = float(domain.size)
    k = len(domain)
    estimate = MemoryEstimate()
    algorithm = getattr(p, "algorithm", None)
    if algorithm is not None and not algorithm.holds_dense_table(domain):
        # Records or answers without the full table (DualQuery, the polynomial release, top-down's
        # level tables, marginal space, factored MWEM): charged what the algorithm says it holds.
        estimate.solve = "the algorithm's own (no table over the whole domain)"
        held = getattr(algorithm, "memory", None)
        for what, path, size, detail, advice in (held(p.algorithm_plan) if callable(held) else []):
            estimate.items.append(MemoryItem(what, tuple(path), float(size), "table", detail, advice))
        return estimate
    estimate.items.append(MemoryItem(
        "the released table", ("domain",), n * (BYTES_PER_CELL + BYTES_PER_ATTRIBUTE_CELL * k), "table",
        f"{domain.size:,} cells x {k} attributes",
        "use fewer or coarser attributes: a release holds its full table"))
    details = getattr(getattr(p, "algorithm_plan", None), "details", None)
    for item in getattr(details, "memory_items", lambda: [])():
        # What the algorithm's own plan says its run holds (e.g. the matrix mechanism's workload
        # answers and their standard errors).
        estimate.items.append(MemoryItem(**item))
    uses_reconstruct = algorithm is None or "reconstruct" in getattr(algorithm, "sections", {"reconstruct": ()})
    rc = getattr(p.spec, "reconstruct", None) if uses_reconstruct else None
    measured = [_Measured.of(step, domain) for step in p.steps if step.query is not None and step.law is not None]
    if rc is None or not measured:
        estimate.solve = "the algorithm's own" if rc is None else "no measurement to fit"
        return estimate
    if matrix_free:
        rows = sum(m.rows for m in measured)
        culprit = max(measured, key=lambda m: m.rows)
        estimate.items.append(MemoryItem(
            "the matrix-free solve", culprit.path, MATRIX_FREE_BYTES_PER_CELL * n + 32.0 * rows, "matrix-free",
            f"L-BFGS-B vectors over {domain.size:,} cells and {rows:,} measured rows",
            "use fewer or coarser attributes: even the matrix-free solve holds vectors over every cell"))
        estimate.solve = "matrix-free L-BFGS-B (scipy) on the measurements' operators, bounds only"
        estimate.engine_options = dict(MATRIX_FREE_OPTIONS)
        return estimate
    engine = _engine(p, rc, measured)
    if engine in ("interior point", "lp", "least squares"):
        per = {"interior point": EXPLICIT_BYTES_PER_NONZERO, "lp": LP_BYTES_PER_NONZERO,
               "least squares": LSQ_BYTES_PER_NONZERO}[engine]
        name = {"interior point": f"{rc.backend or 'cvxpy'} interior-point", "lp": "HiGHS LP",
                "least squares": "scipy least-squares"}[engine]
        if rc.objective == "l2" and rc.backend not in (None, "scipy") and matrix_free_applies(p, any_backend=True):
            advice = ("drop [reconstruct] backend (or use \"scipy\"): the plan then solves this fit matrix-free "
                      "when the explicit solve does not fit")
        elif rc.objective == "l2" and (_general(p) or p.data_invariants):
            advice = ("measure queries with fewer cells per row, or drop the invariants and inequalities that "
                      "need the explicit solver (a fit with bounds only can be solved matrix-free)")
        else:
            advice = "measure queries with fewer cells per row, or coarser attributes"
        for m in measured:
            estimate.items.append(MemoryItem(
                f"measurement {m.label!r}", m.path, per * (m.nnz + m.rows), name,
                f"{m.nnz:,.0f} non-zeros and {m.rows:,} rows in an explicit {name} solve", advice))
        estimate.solve = f"explicit {name} solve ({rc.objective})"
        return estimate
    if all(m.diagonal for m in measured):
        estimate.solve = f"cell by cell ({rc.objective}; every measurement is one row per cell)"
        return estimate  # a diagonal Gram is a vector: matrix-free, within the per-cell figure
    rows = sum(m.rows for m in measured)
    width = min(n, 1.55 * rows + 50)
    dense = 8.0 * width * (3.0 * width + rows)
    culprit = max(measured, key=lambda m: m.rows)
    if culprit.diagonal:
        advice = (f"drop the measurement {culprit.label!r} (one row per cell) or measure marginals instead: "
                  "measured with others it makes the working set as wide as the domain (alone it is solved "
                  "matrix-free)")
    else:
        advice = "measure lower-order marginals (fewer rows), or coarser attributes"
    estimate.items.append(MemoryItem(
        f"measurement {culprit.label!r}", culprit.path, dense, "working-set",
        f"{rows:,} measured rows make a dense working set of up to {width:,.0f} cells", advice))
    estimate.solve = f"working set of cells ({rc.objective}; column generation on dense blocks)"
    return estimate


def matrix_free_applies(p, *, any_backend: bool = False) -> bool:
    """Whether the plan's fit can take the matrix-free path: a least-squares fit with bounds only
    (no invariant, from the data or public, and no inequality), the default or scipy backend (any,
    with ``any_backend``), and an algorithm that passes the plan's engine options on
    (``takes_engine_options``)."""
    rc = getattr(p.spec, "reconstruct", None)
    cs = p.constraints
    return bool(getattr(p.algorithm, "takes_engine_options", False) and rc is not None and rc.objective == "l2"
                and (any_backend or rc.backend in (None, "scipy")) and not cs.invariants and not cs.inequalities
                and not p.data_invariants)


def check_resources(p) -> MemoryEstimate:
    """:func:`estimate_memory` against :func:`memory_limit`: the default solve when it fits, else the
    matrix-free path when it applies, needs less and fits, else a :class:`ResourceLimitError` naming
    what needs the memory. Warns (:class:`~dpopt.errors.MemoryWarning`), without changing the decision, when the
    memory available at the moment is below the estimate."""
    estimate = estimate_memory(p)
    limit, source = memory_limit()
    estimate.limit, estimate.limit_source = limit, source
    if limit is not None and estimate.total > limit and matrix_free_applies(p):
        lean = estimate_memory(p, matrix_free=True)
        if lean.total < estimate.total:  # (not when the table itself is what does not fit)
            lean.limit, lean.limit_source = limit, source
            lean.note = (f"the default {estimate.solve} would need about {format_bytes(estimate.total)}, above the "
                         f"limit of {format_bytes(limit)}")
            estimate = lean  # refused below, naming the leaner solve, when even it does not fit
    if limit is not None and estimate.total > limit:
        item = estimate.largest
        head = (f"{item.what} needs about {format_bytes(item.bytes)} ({item.detail}"
                + (f", {item.engine} engine" if item.engine != "table" else "") + ")")
        raise p.spec.error(item.path, f"{head}; the release about {format_bytes(estimate.total)}, above the memory "
                                      f"limit of {format_bytes(limit)} ({source}); {item.advice} "
                                      f"(or set {_ENV})", ResourceLimitError)
    available = memory_available_now()
    if available is not None and estimate.total > available:
        warnings.warn(f"the release needs about {format_bytes(estimate.total)} ({estimate.solve}) but only "
                      f"{format_bytes(available)} is available at the moment: other jobs hold the rest, and the run "
                      "may fail with out of memory (the plan is accepted by the machine's memory, not by the "
                      "moment's)", MemoryWarning, stacklevel=3)
    return estimate


# ---- what each measurement weighs -------------------------------------------------------------------
@dataclass(frozen=True)
class _Measured:
    label: str
    path: tuple
    rows: int
    nnz: float
    diagonal: bool

    @classmethod
    def of(cls, step, domain) -> "_Measured":
        query = step.query
        n = domain.size
        powers = query.column_norm_powers(1)
        per_column = float(np.mean(powers)) if np.ndim(powers) else float(powers)
        rows = int(query.num_rows)
        squares = query.column_norm_powers(2)
        unit = (np.all(np.asarray(powers) == 1) and np.all(np.asarray(squares) == 1))
        return cls(step.label, tuple(step.path) or ("measure",), rows, per_column * n, bool(unit and rows == n))


def _general(p) -> bool:
    """Invariants other than one fixed total, or inequalities: the L2 engine lifts them to a QP."""
    cs = p.constraints
    invariant_rows = [inv.query.num_rows for inv in cs.invariants] + [q.num_rows for _, q, _ in p.data_invariants]
    return bool(cs.inequalities) or any(r != 1 for r in invariant_rows)


def _engine(p, rc, measured) -> str:
    """Which kind of solve the plan's ``[reconstruct]`` settings lead to (see the module notes)."""
    try:
        from dpopt.estimate.engines.least_squares import MATRIX_FREE_NNZ
    except ImportError:  # pragma: no cover - the engines keep this name
        MATRIX_FREE_NNZ = 3_000_000
    try:
        from dpopt.estimate.engines.linear import FULL_LP_CELLS, FULL_LP_NNZ
    except ImportError:  # pragma: no cover
        FULL_LP_CELLS, FULL_LP_NNZ = 20_000, 2_000_000
    nnz = sum(m.nnz + m.rows for m in measured)
    if rc.objective == "l2":
        if _general(p) or rc.backend in ("clarabel", "cvxpy", "highs") or (rc.backend is None and nnz <= MATRIX_FREE_NNZ):
            return "interior point"
        return "least squares" if nnz <= MATRIX_FREE_NNZ else "working set"
    if rc.objective == "entropy":
        return "interior point" if nnz <= MATRIX_FREE_NNZ else "working set"
    if p.domain.size <= FULL_LP_CELLS and nnz <= FULL_LP_NNZ:
        return "lp"
    return "working set"
