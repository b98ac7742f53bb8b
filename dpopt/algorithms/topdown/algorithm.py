"""The registered ``topdown`` algorithm: its parameters, spec tables, plan and run.

A spec names the geography and the queries of each level::

    algorithm = "topdown"

    [geography]
    levels = ["state", "county"]        # domain attributes, coarsest first, below the root
    root = "nation"
    parents = "separator"               # "S01-C1" lies in "S01"

    [[measure]]
    level = "county"
    query = "identity"                  # the detailed table of every county
    share = 0.3

    [topdown]
    executor = "pool"                   # "serial", "pool" or "spark"

The plan (``dpopt check``) lists every level's units and every query's noise before any data
is read; the run measures and solves level by level (:mod:`~dpopt.algorithms.topdown.engine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure, Release, make_release, register
from dpopt.algorithms.topdown.constraints import UnitInvariant, invariants_by_unit, sum_up, zero_rules
from dpopt.algorithms.topdown.engine import LevelQuery, run_levels
from dpopt.algorithms.topdown.executors import EXECUTORS, Executor, make_executor
from dpopt.algorithms.topdown.split import SplitChoice, SplitEntry, choose_split
from dpopt.algorithms.topdown.upward import identity_key, query_key
from dpopt.algorithms.topdown.solve import SolveOptions
from dpopt.errors import DpoptError, InconsistentConstraintsError, ParameterError, at_key
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Hierarchy
from dpopt.model.domain import MAX_DENSE_CELLS, Domain
from dpopt.model.geography import Geography
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.budget import MECHANISMS
from dpopt.privacy.mechanisms import calibrate
from dpopt.spec.queries import QuerySpec, build_query

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.spec.table import SpecReader

__all__ = ["TopDown", "TopDownParams", "GeographySpec", "LevelMeasure", "TopDownRelease", "TopDownPlan",
           "PARENT_RULES", "LEVEL_QUERY_KINDS"]

#: How ``[geography] parents`` finds each unit's parent.
PARENT_RULES = ("separator", "nested", "hierarchy", "table", "code")
#: How each parent's L2 solution is rounded (``[topdown] rounding``).
ROUNDINGS = ("controlled", "cellwise")
#: Query kinds a level's ``[[measure]]`` may ask (over the characteristics).
LEVEL_QUERY_KINDS = ("identity", "marginal", "total")
#: Level tables with more rows than this are given with their non-zero cells only in ``answers``.
ANSWER_ROWS = 2_000_000
#: Full-domain measurements (for the release report's fit table) are built up to this many non-zeros.
FULL_DOMAIN_NNZ = 20_000_000
_L2_BACKENDS = ("clarabel", "cvxpy", "scipy", "highs")


# ---- parameters -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GeographySpec:
    """How the hierarchy is read from the domain (see :class:`~dpopt.model.geography.Geography`).

    Attributes
    ----------
    levels : tuple of str
        Below the root, coarsest first: domain attributes (one per level), or with ``code``
        the level names.
    root : str
        The name of the top level (one unit).
    parents : str
        ``"separator"`` (a label's parent is its text before the last ``separator``),
        ``"nested"`` (every combination of codes is a unit), ``"hierarchy"`` (the spec's
        ``[[constraints.hierarchy]]`` tables), ``"table"`` (a crosswalk file with one column
        per level), ``"code"`` (prefixes of the ``code`` attribute, of lengths ``widths``).
    geography : Geography, optional
        A ready geography (Python only); the other fields are then ignored.
    """

    levels: tuple[str, ...] = ()
    root: str = "nation"
    parents: str = "separator"
    separator: str = "-"
    code: str | None = None
    widths: tuple[int, ...] = ()
    table: Path | None = None
    geography: Geography | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        """Every level name, root first."""
        if self.geography is not None:
            return self.geography.names
        return (self.root, *self.levels)

    def check(self) -> None:
        if self.geography is not None:
            return
        if not self.levels or not all(isinstance(v, str) and v for v in self.levels):
            raise ParameterError(f"geography.levels must be a non-empty list of level names, got {list(self.levels)}")
        if len(set(self.names)) != len(self.names):
            raise ParameterError(f"geography: a level name is used twice in {list(self.names)}")
        if self.parents not in PARENT_RULES:
            raise ParameterError(f"geography.parents must be one of {list(PARENT_RULES)}, got {self.parents!r}")
        if (self.parents == "code") != (self.code is not None):
            raise ParameterError("geography: give code (and widths) exactly when parents = \"code\"")
        if self.parents == "code" and len(self.widths) != len(self.levels):
            raise ParameterError(f"geography.widths: {len(self.levels)} levels need {len(self.levels)} code widths, "
                                 f"got {list(self.widths)}")
        if (self.parents == "table") != (self.table is not None):
            raise ParameterError("geography: give table (a crosswalk file) exactly when parents = \"table\"")

    def build(self, domain: Domain, constraints: ConstraintSet) -> Geography:
        """The geography over ``domain`` (reads the crosswalk file for ``parents = "table"``; no data)."""
        if self.geography is not None:
            geo = self.geography
            if not geo.attrs:
                geo = geo.bind(domain)
            missing = [a for a in geo.attrs if a not in domain.attrs]
            if missing:
                raise ParameterError(f"geography: attributes {missing} are not in the domain {domain}")
            return geo
        try:
            if self.parents == "code":
                return Geography.from_code(domain, self.code, self.widths, self.levels, root=self.root)
            if self.parents == "table":
                frame = pd.read_csv(self.table, dtype=str) if self.table.suffix.lower() != ".parquet" \
                    else pd.read_parquet(self.table).astype(str)
                return Geography.from_table(frame, self.levels, root=self.root, domain=domain)
            if self.parents == "hierarchy":
                return Geography.from_columns(domain, self.levels, parents=_hierarchy_tables(self.levels, constraints),
                                              root=self.root)
            return Geography.from_columns(domain, self.levels, parents=self.parents, separator=self.separator,
                                          root=self.root)
        except (OSError, ValueError) as exc:
            raise ParameterError(str(exc).strip() or type(exc).__name__) from None


@dataclass(frozen=True)
class LevelMeasure:
    """One query asked of every unit of a level.

    Attributes
    ----------
    label : str
        Unique within its level.
    level : str
        A level name (the root included).
    query : QuerySpec or LinearQuery
        Over the characteristics (the domain without the geography attributes).
    mechanism : str or None
        ``"laplace"``, ``"gaussian"`` or None (the accounting's natural noise).
    share : Fraction or None
        Its exact share of the whole budget; None (in every measure) to have the split chosen
        by expected error (:mod:`~dpopt.algorithms.topdown.split`).
    weight : float
        The table's weight in the expected error that chooses the split (only without shares).
    """

    label: str
    level: str
    query: Any
    mechanism: str | None
    share: Fraction | None
    path: tuple = ()
    weight: float = 1.0


@dataclass(frozen=True)
class TopDownParams(AlgorithmParams):
    """The ``[geography]``, ``[[measure]]`` and ``[topdown]`` tables.

    Attributes
    ----------
    geography : GeographySpec
    measures : tuple of LevelMeasure
        At least one on the last level (on every level with ``upward=False``); shares sum to
        exactly 1, or are all None: then the split is chosen, before any data, to minimise the
        measured tables' expected errors (each by its relative error, to the power of its
        ``weight``; :func:`~dpopt.algorithms.topdown.split.choose_split`).
    executor : {"serial", "pool", "spark"} or Executor
    workers : int or None
        Processes of the pool (default: the cores), or Spark's ``local[workers]``.
    spark : str
        The Spark master URL (``executor = "spark"``).
    backend : str or None
        The L2 engine's backend (``"clarabel"``, ``"cvxpy"``, ``"scipy"``, ``"highs"``; default: the engine's).
    time_limit : float or None
        Seconds per parent's solve.
    failsafe : bool
        Relax an infeasible parent constraint by the smallest L1 slack (and report it), rather
        than stop the release.
    invariants : tuple of UnitInvariant
        Extra invariants given per unit (Python only; the spec's ``[constraints] invariants``
        are read from the constraint set).
    progress : bool
        A progress bar per level (tqdm, stderr).
    upward : bool
        Before the top-down fit, estimate every unit from its own answers and its subtree's
        (:mod:`~dpopt.algorithms.topdown.upward`; Hay et al. 2010). False: every unit's fit uses
        its own level's answers only (the release before this pass, for comparisons).
    rounding : {"controlled", "cellwise"}
        ``"controlled"``: parents' problems of up to
        :data:`~dpopt.algorithms.topdown.solve.CONTROLLED_MAX_VARIABLES` variables keep every
        measured marginal of every child at the floor or ceiling of its fitted value (a MIP),
        larger ones are rounded cell by cell; ``"cellwise"``: every problem cell by cell (an LP,
        faster).
    """

    geography: GeographySpec = field(default_factory=GeographySpec)
    measures: tuple[LevelMeasure, ...] = ()
    executor: str = "pool"
    workers: int | None = None
    spark: str = "local[*]"
    backend: str | None = None
    time_limit: float | None = None
    failsafe: bool = True
    invariants: tuple = ()
    progress: bool = False
    upward: bool = True
    rounding: str = "controlled"

    def validate(self) -> None:
        if not isinstance(self.geography, GeographySpec):
            raise ParameterError(f"geography must be a GeographySpec, got {type(self.geography).__name__}")
        self.geography.check()
        if not self.measures:
            raise ParameterError("measures: give at least one measurement per level")
        names = self.geography.names
        seen = set()
        for i, m in enumerate(self.measures):
            where = f"measures[{i + 1}]"
            if not isinstance(m, LevelMeasure):
                raise ParameterError(f"{where} must be a LevelMeasure, got {type(m).__name__}")
            if m.level not in names:
                raise at_key(ParameterError(f"{where}.level {m.level!r} is not a level of the geography "
                                            f"{list(names)}"), m.path + ("level",))
            if (m.level, m.label) in seen:
                raise at_key(ParameterError(f"{where}: label {m.label!r} is used twice in level {m.level!r}"),
                             m.path + ("label",))
            seen.add((m.level, m.label))
            if m.mechanism is not None and m.mechanism not in MECHANISMS:
                raise ParameterError(f"{where}.mechanism must be one of {list(MECHANISMS)} or None, got {m.mechanism!r}")
            if m.share is not None and not (isinstance(m.share, Fraction) and m.share > 0):
                raise ParameterError(f"{where}.share must be a positive Fraction or None, got {m.share!r}")
            if isinstance(m.weight, bool) or not isinstance(m.weight, (int, float)) or not (
                    np.isfinite(m.weight) and m.weight >= 0):
                raise at_key(ParameterError(f"{where}.weight must be a finite number >= 0, got {m.weight!r}"),
                             m.path + ("weight",))
        given = [m.share is not None for m in self.measures]
        if any(given) and not all(given):
            m = self.measures[given.index(False) if given[0] else given.index(True)]
            raise at_key(ParameterError(f"measures: give a share to every measurement or to none (then the split is "
                                        f"chosen by expected error); {m.level!r} {m.label!r} differs"), m.path + ("share",))
        if self.chosen_split:
            if not self.upward:
                raise ParameterError("a budget split chosen by expected error assumes the upward pass; give every "
                                     "measurement a share, or set upward = true")
            if not any(m.weight > 0 for m in self.measures):
                raise ParameterError("measures: every weight is 0; the split by expected error needs a table to serve")
        else:
            weighted = [m for m in self.measures if m.weight != 1.0]
            if weighted:
                raise at_key(ParameterError(f"measure {weighted[0].label!r} of level {weighted[0].level!r}: weight "
                                            "only applies when the split is chosen (no share in any measurement)"),
                             weighted[0].path + ("weight",))
            total = sum((m.share for m in self.measures), Fraction(0))
            if total != 1:
                raise ParameterError(f"measures: the shares sum to {total}, not exactly 1")
        missing = [n for n in _needs_measure(names, self.upward) if n not in {m.level for m in self.measures}]
        if missing:
            raise ParameterError(f"measures: level {missing[0]!r} has no measurement; "
                                 + ("the last level needs at least one (the levels above are estimated from it)"
                                    if self.upward else "without the upward pass every level needs at least one "
                                    "(its units' tables are fitted to them)"))
        if not (isinstance(self.executor, Executor) or self.executor in EXECUTORS):
            raise ParameterError(f"executor must be one of {list(EXECUTORS)} or an Executor, got {self.executor!r}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ParameterError(f"workers must be an integer >= 1, got {self.workers!r}")
        if self.backend is not None and self.backend not in _L2_BACKENDS:
            raise ParameterError(f"backend must be one of {list(_L2_BACKENDS)} (the L2 engine's), got {self.backend!r}")
        if self.rounding not in ROUNDINGS:
            raise ParameterError(f"rounding must be one of {list(ROUNDINGS)}, got {self.rounding!r}")
        if self.time_limit is not None and not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0):
            raise ParameterError(f"time_limit must be a number of seconds > 0, got {self.time_limit!r}")
        for inv in self.invariants:
            if not isinstance(inv, UnitInvariant):
                raise ParameterError(f"invariants must be UnitInvariant objects, got {type(inv).__name__}")

    @property
    def chosen_split(self) -> bool:
        """True when no measurement has a share: the split is chosen by expected error."""
        return bool(self.measures) and all(m.share is None for m in self.measures)

    def describe(self) -> str:
        names = self.geography.names
        executor = self.executor if isinstance(self.executor, str) else self.executor.describe()
        return (f"{' → '.join(names)}, {len(self.measures)} measurements, executor {executor}"
                + (f", backend {self.backend}" if self.backend else ""))

    def to_dict(self) -> dict:
        g = self.geography
        return {"geography": {"levels": list(g.names), "parents": g.parents if g.geography is None else "given"},
                "measures": [{"label": m.label, "level": m.level, "query": _query_name(m.query),
                              "mechanism": m.mechanism, "share": None if m.share is None else str(m.share),
                              "weight": m.weight} for m in self.measures],
                "executor": self.executor if isinstance(self.executor, str) else self.executor.describe(),
                "workers": self.workers, "spark": self.spark, "backend": self.backend,
                "time_limit": self.time_limit, "failsafe": self.failsafe, "upward": self.upward,
                "rounding": self.rounding,
                "invariants": [inv.name for inv in self.invariants]}

    @classmethod
    def from_spec(cls, reader: "SpecReader") -> "TopDownParams":
        g = reader.table("geography", required=True)
        code = g.str("code", default=None)
        parents = g.str("parents", default="code" if code is not None else "separator", choices=PARENT_RULES)
        levels = tuple(g.str_list("levels", required=True))
        widths = ()
        if "widths" in g.raw:
            raw = g.raw["widths"]
            if not isinstance(raw, list) or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0
                                                    for w in raw):
                raise g.error(("widths",), f"must be a list of positive integers, got {raw!r}")
            widths = tuple(raw)
        table = g.path("table", must_exist=True) if "table" in g.raw else None
        geography = GeographySpec(levels, g.str("root", default="nation"), parents, g.str("separator", default="-"),
                                  code, widths, table)
        try:
            geography.check()
        except ParameterError as exc:
            raise g.error((), str(exc)) from None
        names = geography.names
        measures = []
        for t in reader.tables("measure", required=True):
            level = t.str("level", required=True, choices=list(names))
            query = reader.query(t, LEVEL_QUERY_KINDS)
            mechanism = t.str("mechanism", default=None, choices=MECHANISMS)
            try:
                reader.budget.noise(mechanism)
            except DpoptError as exc:
                raise t.error(("mechanism",), str(exc)) from None
            label = t.str("label", default=query.describe())
            if not label.strip():
                raise t.error(("label",), "must not be empty")
            if any(m.level == level and m.label == label for m in measures):
                raise t.error(("label",), f"label {label!r} is already used by another [[measure]] of level "
                              f"{level!r}; give each a distinct label")
            share = t.budget("share")
            weight = t.float("weight", default=None)
            if weight is not None and not weight >= 0:
                raise t.error(("weight",), f"must be a number >= 0, got {weight}")
            if weight is not None and share is not None:
                raise t.error(("weight",), "weight only applies when the split is chosen by expected error: give no "
                              "share in any [[measure]], or drop weight")
            measures.append(LevelMeasure(label, level, query, mechanism, share, t.path_,
                                         1.0 if weight is None else weight))
        given = [m.share is not None for m in measures]
        if any(given) and not all(given):
            odd = measures[given.index(False)] if given[0] else measures[given.index(True)]
            raise reader.error(odd.path + ("share",), "give a share in every [[measure]] or in none (then dpopt "
                               "chooses the split by expected error; `dpopt check` prints it)")
        if all(given):
            shares = sum((m.share for m in measures), Fraction(0))
            if shares != 1:
                raise reader.error(measures[-1].path + ("share",), f"the budget shares of the [[measure]] tables sum "
                                   f"to {shares} ({float(shares):.6g}), not exactly 1")
        t = reader.table("topdown")
        upward = t.bool("upward", default=True)
        missing = [n for n in _needs_measure(names, upward) if n not in {m.level for m in measures}]
        if missing:
            raise reader.error(measures[0].path + ("level",), f"level {missing[0]!r} has no [[measure]]; " + (
                "the last level needs at least one (the levels above are estimated from it)" if upward else
                f"with upward = false every level of {list(names)} needs at least one"))
        from dpopt.spec.sections import parse_reconstruct  # the installed-backend check of [reconstruct]

        backend = parse_reconstruct(t, "l2").backend if "backend" in t.raw else None
        return cls(geography, tuple(measures), executor=t.str("executor", default="pool", choices=EXECUTORS),
                   workers=t.int("workers", default=None, minimum=1), spark=t.str("spark", default="local[*]"),
                   backend=backend, time_limit=t.float("time_limit", default=None, positive=True),
                   failsafe=t.bool("failsafe", default=True), upward=upward,
                   rounding=t.str("rounding", default="controlled", choices=ROUNDINGS))


def _needs_measure(names, upward: bool) -> tuple:
    """The levels that must have a measurement: with the upward pass the last one (the others are
    estimated from the levels below), else every level."""
    return tuple(names[-1:]) if upward else tuple(names)


def _query_name(query) -> str:
    return query.name if isinstance(query, LinearQuery) else query.describe()


def _hierarchy_tables(levels, constraints: ConstraintSet) -> list[dict]:
    """``{child: parent}`` per level below the first, from the hierarchy constraints."""
    domain = constraints.domain
    tables = []
    for parent, child in zip(levels, levels[1:]):
        found = [h for h in constraints.of_kind(Hierarchy) if (h.parent, h.child) == (parent, child)]
        if not found:
            raise ParameterError(f"geography.parents = \"hierarchy\" needs a [[constraints.hierarchy]] with parent "
                                 f"{parent!r} and child {child!r}")
        tables.append({str(domain.labels_of(child)[domain.code_of(child, c)]):
                       str(domain.labels_of(parent)[domain.code_of(parent, p)]) for c, p in found[0].parent_of.items()})
    return tables


# ---- plan -------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TopDownPlan:
    """The public plan: the geography, the characteristics and every level's queries with their noise."""

    geography: Geography
    characteristics: Domain
    queries: tuple[LevelQuery, ...]
    split: SplitChoice | None = None


class TopDownRelease(Release):
    """A top-down release (a :class:`~dpopt.algorithms.base.Release`) with every level's tables.

    Attributes (besides those of Release)
    -------------------------------------
    geography : Geography
    characteristics : Domain
    level_tables : dict of str to ndarray
        Released counts per level, shape (units, cells), int64; consistent across levels.
    noisy : dict of str to dict of str to ndarray
        Per level and query label, the noisy answers (units × rows).
    failsafe : list of dict
        Every relaxed parent: level, parent, constraint, cells moved and by how much.
    solve_times : dict of str to ndarray
        Seconds per parent's solve, per level.
    """

    def level_frame(self, level: str, cells: str = "all") -> pd.DataFrame:
        """One row per unit × cell of a level: the unit, the characteristics labels and ``count``
        (and ``noisy`` when the level measured its detailed table)."""
        return level_frame(self.geography, self.characteristics, level, self.level_tables[level],
                           self.noisy.get(level, {}), cells)


def level_frame(geography: Geography, chars: Domain, level: str, table: np.ndarray, noisy: dict,
                cells: str = "all") -> pd.DataFrame:
    """See :meth:`TopDownRelease.level_frame`."""
    k = geography.level(level)
    units, n = table.shape
    if cells == "all":
        unit, cell = np.divmod(np.arange(units * n, dtype=np.int64), n)
        frame = dict(_label_columns(geography, chars, level, k, unit, cell, keep=units * n <= CACHED_LABEL_ROWS))
    else:
        unit, cell = np.nonzero(table)
        frame = _label_columns(geography, chars, level, k, unit, cell, keep=False)
    frame["count"] = table[unit, cell]
    detailed = _detailed_label(noisy, table)
    if detailed is not None:
        frame["noisy"] = noisy[detailed][unit, cell]
    return pd.DataFrame(frame)


#: Level frames of up to this many rows (every unit x cell) keep their label columns on the
#: geography: they depend on the geography and the characteristics only, and an audit releases the
#: same levels hundreds of times (the label columns were 7% of a top-down audit run's time).
#: Frames share them safely: pandas copies on write.
CACHED_LABEL_ROWS = 1_000_000


def _label_columns(geography: Geography, chars: Domain, level: str, k: int, unit: np.ndarray, cell: np.ndarray,
                   keep: bool) -> dict:
    """The unit and characteristics columns (Categorical) of a level frame's rows ``(unit, cell)``;
    with ``keep`` (a frame of every unit x cell) kept on the geography and read from it."""
    def build() -> dict:
        columns = {level: pd.Categorical.from_codes(unit, categories=list(geography.units[k]))}
        codes = chars.unravel(cell)
        for j, attr in enumerate(chars.attrs):
            columns[attr] = pd.Categorical.from_codes(codes[:, j], categories=list(chars.labels_of(attr)))
        return columns

    if not keep:
        return build()
    key = ("level frame labels", k, unit.size, chars.attrs, chars.sizes,
           tuple(tuple(chars.labels_of(a)) for a in chars.attrs))
    return geography.memo(key, build)


def _detailed_label(noisy: dict, table: np.ndarray) -> str | None:
    """The label of the level's measurement with one answer per cell (its detailed table), if any."""
    return next((label for label, v in noisy.items() if v.shape == table.shape), None)


def query_frame(geography: Geography, level: str, query: LinearQuery, table: np.ndarray,
                noisy: np.ndarray) -> pd.DataFrame:
    """One row per unit × answer of a query measured on a level: the unit, the answer's cell (a
    marginal's attributes, else ``row``), the ``count`` read off the released table and the ``noisy``
    measurement (as :func:`~dpopt.algorithms.base.measured_answers` writes a flat release's).
    Beyond :data:`ANSWER_ROWS` rows, the rows with a non-zero released count only."""
    from dpopt.model.queries.marginal import Marginal

    k = geography.level(level)
    released = np.asarray(query.to_sparse() @ table.T).T
    units, rows = released.shape
    if released.size <= ANSWER_ROWS:
        unit, row = np.divmod(np.arange(units * rows, dtype=np.int64), rows)
    else:
        unit, row = np.nonzero(released)
    frame = {level: pd.Categorical.from_codes(unit, categories=list(geography.units[k]))}
    if isinstance(query, Marginal) and query.attrs:
        marginal = query.marginal_domain
        codes = marginal.unravel(row)
        for j, attr in enumerate(marginal.attrs):
            frame[attr] = pd.Categorical.from_codes(codes[:, j], categories=list(marginal.labels_of(attr)))
    else:
        frame["row"] = pd.Categorical.from_codes(row, categories=list(dict.fromkeys(query.row_labels())))
    frame["count"] = np.rint(released[unit, row]).astype(np.int64)
    values = noisy[unit, row]
    frame["noisy"] = values.astype(np.int64) if np.array_equal(values, np.round(values)) else values
    out = pd.DataFrame(frame)
    out.attrs["nonzero_only"] = released.size > ANSWER_ROWS
    return out


def noise_warnings(outcome, geography: Geography, chars: Domain, constraints) -> list[str]:
    """Levels whose detailed cells are known to a noise s.d. above their average count per cell.

    The average comes from the released root table's total (the release itself: post-processing,
    no confidential value) over the level's units and the cells no structural zero forbids; the
    noise is that of the level's detailed estimate after the upward pass (the median over its
    units). Each such level is logged as a warning and noted in the release.
    """
    import logging

    root = next((lv.table for lv in outcome.levels if lv.level == 0 and lv.table is not None), None)
    if root is None:
        return []
    try:
        allowed = int((~zero_rules(constraints, geography, chars).shared).sum())
    except DpoptError:  # pragma: no cover - the run has built them already
        allowed = chars.size
    total = float(root.sum())
    notes = []
    for lv in outcome.levels:
        sd = lv.report.get("detailed_noise_stddev")
        if sd is None:
            continue
        average = total / max(geography.sizes[lv.level] * allowed, 1)
        if sd > average:
            notes.append(f"level {lv.name!r}: its detailed cells are known to noise s.d. {sd:.3g}, above their average "
                         f"released count per cell ({average:.3g}): the non-negative fit biases its small cells upward "
                         "and large ones downward; give that level's tables less weight or the levels below more budget "
                         "(docs: when top-down wins)")
            logging.getLogger(__name__).warning("top-down: %s", notes[-1])
    return notes


# ---- the algorithm ----------------------------------------------------------------------------------
@register
class TopDown(Algorithm):
    """Top-down release over a geography hierarchy (see the package notes)."""

    name = "topdown"
    aliases = ("top-down",)
    title = "top-down release over a geography hierarchy: per-parent L2 then exact rounding, level by level"
    reference = ("J. M. Abowd et al., The 2020 Census Disclosure Avoidance System TopDown Algorithm, Harvard Data "
                 "Science Review (2022), §5-6; design notes §2")
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants"})
    # The level tables are the release; the full domain's table is formed only when it fits.
    dense_domain = False
    sections = {
        "geography": ("levels", "root", "parents", "separator", "code", "widths", "table"),
        "measure": ("label", "level", "query", "attrs", "mechanism", "share", "weight"),
        "topdown": ("executor", "workers", "spark", "backend", "time_limit", "failsafe", "upward", "rounding"),
    }
    Params = TopDownParams

    def plan(self, domain, constraints, budget):
        p = self.params
        try:
            geography = p.geography.build(domain, constraints)
            chars = geography.characteristics(domain)
        except DpoptError as exc:
            raise at_key(ParameterError(str(exc)), ("geography",)) from None
        _check_hierarchies(constraints, geography)
        entries = []
        for m in p.measures:
            k = geography.level(m.level)
            if isinstance(m.query, LinearQuery):
                if m.query.domain != chars:
                    raise at_key(ParameterError(f"measure {m.label!r} of level {m.level!r}: its query is over "
                                                f"{m.query.domain}, not the characteristics {chars}"), m.path)
                query = m.query
            else:
                geo = [a for a in m.query.attrs if a in geography.attrs]
                if geo:
                    raise at_key(ParameterError(f"{geo[0]!r} is a geography attribute; a level's queries are over "
                                                f"the characteristics {list(chars.attrs)} of each unit"),
                                 m.path + ("attrs",))
                (_, query), = build_query(m.query, chars, lambda path, msg: at_key(ParameterError(msg), path))
            entries.append((k, m, query, budget.noise(m.mechanism), f"{m.level}: {m.label}"))
        shares, choice, lines = {e[4]: e[1].share for e in entries}, None, []
        if p.chosen_split:
            choice = _choose(geography, chars, entries, budget)
            shares = choice.shares
            lines += _split_lines(choice, entries)
        measured = [e for e in entries if shares[e[4]] > 0]
        if not any(e[0] == geography.depth - 1 for e in measured):
            raise at_key(ParameterError(f"the budget split leaves the last level {geography.names[-1]!r} unmeasured; "
                                        "give its tables a weight above 0"), ("measure",))
        costs = budget.shares({e[4]: shares[e[4]] for e in measured})
        steps, queries = [], []
        for k, m, query, mechanism, ledger in measured:
            try:
                law = calibrate(query, costs[ledger], mechanism)
            except DpoptError as exc:
                raise at_key(exc, m.path + ("mechanism",)) from None
            units = geography.sizes[k]
            steps.append(PlannedMeasure(ledger, query, mechanism, shares[ledger], costs[ledger], law,
                                        what=f"{_query_name(query)} of each of the {units:,} {m.level} units",
                                        answers=units * query.num_rows, path=m.path))
            queries.append(LevelQuery(k, m.label, query, law, shares[ledger], ledger))
        details = TopDownPlan(geography, chars, tuple(queries), choice)
        lines = [f"geography: {geography.describe()}",
                 f"each unit's table: {chars.size:,} cells over {', '.join(chars.attrs)}",
                 ("upward pass: every unit's answers combined with its subtree's (inverse variance, Hay et al. "
                  "2010), then " if p.upward else "no upward pass: every unit fitted to its own level's answers; ")
                 + "per parent: L2 fit of its children (weights 1/variance) with children summing to the parent, "
                 "invariants, zeros and x >= 0, then exact integer rounding"
                 + (" keeping the measured marginals (controlled, up to 20,000 variables)" if p.rounding == "controlled"
                    else " cell by cell")
                 + ("; failsafe on" if p.failsafe else "; failsafe off"),
                 *lines, *_noise_lines(geography, chars, queries, p.upward),
                 f"executor: {make_executor(p.executor, workers=p.workers, spark=p.spark).describe()}"]
        return self.new_plan(domain, constraints, budget, steps=steps, details=details, lines=lines)

    def run(self, plan, data, accountant, rng) -> Release:
        p = self.params
        details: TopDownPlan = plan.details
        geography, chars = details.geography, details.characteristics
        try:
            zeros = zero_rules(plan.constraints, geography, chars)
            invariants = invariants_by_unit(plan.constraints, geography, chars) + list(p.invariants)
            invariants = sum_up(invariants, geography)
        except (ParameterError, InconsistentConstraintsError) as exc:
            raise at_key(exc, ("constraints", "invariants")) from None
        leaf_counts = geography.leaf_histograms(data)
        options = SolveOptions(p.backend, p.time_limit, p.failsafe, controlled=p.rounding == "controlled")
        with make_executor(p.executor, workers=p.workers, spark=p.spark) as executor:
            outcome = run_levels(geography, chars, leaf_counts, list(details.queries), invariants, zeros, accountant,
                                 rng, executor=executor, options=options, progress=p.progress, upward=p.upward)
        return self._release(plan, outcome, accountant, invariants, executor.describe())

    def _release(self, plan, outcome, accountant, invariants, executor: str) -> Release:
        details: TopDownPlan = plan.details
        geography, chars = details.geography, details.characteristics
        tables = {lv.name: lv.table for lv in outcome.levels if lv.table is not None}
        noisy = {lv.name: lv.noisy for lv in outcome.levels}
        info = {"geography": geography.describe(), "executor": executor,
                "levels": [lv.report for lv in outcome.levels], "failsafe": outcome.failsafe,
                "invariants": [{"name": inv.name, "level": geography.names[inv.level], "units": int(inv.units.size),
                                "derived": inv.derived} for inv in invariants]}
        if details.split is not None:
            info["split"] = {"chosen_by": "expected error", "shares": {k: str(v) for k, v in details.split.shares.items()},
                             "expected_rmse": details.split.rmse, "expected_rmse_last_level_only": details.split.baseline}
        extra = {"geography": geography, "characteristics": chars, "level_tables": tables, "noisy": noisy,
                 "failsafe": outcome.failsafe,
                 "solve_times": {lv.name: np.array([s.times.get("total", 0.0) for s in lv.solutions])
                                 for lv in outcome.levels}}
        if outcome.status is not Status.OPTIMAL:
            info["spec_key"] = ("topdown",)
            release = make_release(self, plan, accountant, status=outcome.status, message=outcome.message, info=info,
                                   cls=TopDownRelease)
            release.update(extra)
            return release
        notes = [f"failsafe under {e['parent_level']} {e['parent']!r}: '{e['constraint']}' was relaxed in "
                 f"{e['cells_moved']} cells by {e['l1_slack']} in all (the smallest L1 slack); its {e['level_name']} "
                 "units do not add up to it in those cells" for e in outcome.failsafe if e.get("relaxed")]
        answers = {}
        for name, table in tables.items():
            cells = "all" if table.size <= ANSWER_ROWS else "nonzero"
            answers[f"level {name}"] = level_frame(geography, chars, name, table, noisy[name], cells)
            if cells == "nonzero":
                notes.append(f"level {name!r}: the answers table lists its {int(np.count_nonzero(table)):,} non-zero "
                             f"cells of {table.size:,}")
            in_level_frame = _detailed_label(noisy[name], table)
            for q in details.queries:
                if geography.names[q.level] != name or q.label == in_level_frame:
                    continue  # the detailed table's noisy answers are the level table's ``noisy`` column
                frame = query_frame(geography, name, q.query, table, noisy[name][q.label])
                answers[f"{name}: {q.label}"] = frame
                if frame.attrs.get("nonzero_only"):
                    notes.append(f"{name}: {q.label}: the answers table lists the {len(frame):,} rows with a non-zero "
                                 f"released count of {table.shape[0] * q.query.num_rows:,}")
        notes.extend(noise_warnings(outcome, geography, chars, plan.constraints))
        counts, measurements = None, []
        if plan.domain.size <= MAX_DENSE_CELLS:
            leaf_offset, cell_offset = geography.offsets(plan.domain)
            counts = np.zeros(plan.domain.size, dtype=np.int64)
            counts[(leaf_offset[:, None] + cell_offset[None, :]).ravel()] = tables[geography.names[-1]].ravel()
            measurements = _full_domain_measurements(plan, details, noisy, leaf_offset, cell_offset)
        else:
            notes.append(f"the full domain has {plan.domain.size:.3g} cells: the release is the level tables "
                         "(counts over the full domain are not formed)")
        release = make_release(self, plan, accountant, status=Status.OPTIMAL, message=outcome.message, counts=counts,
                               answers=answers, measurements=measurements, notes=notes, info=info, cls=TopDownRelease)
        release.update(extra)
        return release

    @classmethod
    def example(cls, domain):
        if len(domain) < 2:
            return None
        # Two nested levels when a characteristic is left over, else one (the audit's 2-attribute domain).
        levels = domain.attrs[:2] if len(domain) >= 3 else domain.attrs[:1]
        geography = GeographySpec(levels=tuple(levels), parents="nested")
        names = geography.names
        measures = tuple(LevelMeasure("detailed", name, QuerySpec("identity"), None, Fraction(1, len(names)))
                         for name in names)
        return cls.Params(geography, measures, executor="serial")


def _check_hierarchies(constraints: ConstraintSet, geography: Geography) -> None:
    """A declared hierarchy between two consecutive levels must be the geography's own."""
    domain = constraints.domain
    for h in constraints.of_kind(Hierarchy):
        if h.parent not in geography.names or h.child not in geography.names:
            continue
        k = geography.level(h.child)
        if geography.level(h.parent) != k - 1:
            continue
        units = {u: i for i, u in enumerate(geography.units[k])}
        parents = geography.units[k - 1]
        for child, parent in h.parent_of.items():
            c = str(domain.labels_of(h.child)[domain.code_of(h.child, child)])
            par = str(domain.labels_of(h.parent)[domain.code_of(h.parent, parent)])
            if c in units and parents[geography.parents[k][units[c]]] != par:
                raise at_key(ParameterError(f"hierarchy {h.name!r} puts {h.child} {c!r} in {h.parent} {par!r}, but the "
                                            f"geography puts it in {parents[geography.parents[k][units[c]]]!r}"),
                             ("geography", "parents"))


def _choose(geography: Geography, chars: Domain, entries: list, budget) -> SplitChoice:
    """The split by expected error (:func:`~dpopt.algorithms.topdown.split.choose_split`) of the plan's entries."""
    split_entries = []
    for k, m, query, mechanism, ledger in entries:
        law = calibrate(query, budget.total, mechanism)  # the whole budget: the model scales it by the share
        laplace = law.mechanism == "laplace"
        split_entries.append(SplitEntry(ledger, k, query, float(m.weight),
                                        2.0 * law.scale**2 if laplace else law.scale**2, 2 if laplace else 1))
    try:
        return choose_split(geography, chars, split_entries)
    except ParameterError as exc:
        raise at_key(exc, ("measure",)) from None


def _split_lines(choice: SplitChoice, entries: list) -> list[str]:
    """The chosen split and each table's expected error, for ``dpopt check``."""
    lines = ["budget split chosen before any data by expected error (the product over the measured tables of their "
             "expected squared errors, each to the power of its weight: every table counts by its relative error; "
             "least squares on the hierarchy, NOT counting non-negativity, which lowers the error of sparse tables):"]
    for k, m, query, mechanism, ledger in entries:
        share = choice.shares[ledger]
        what = f"share {share}" if share > 0 else "not measured (share 0: estimated from the levels below)"
        base = choice.baseline[ledger]
        lines.append(f"  {ledger}: {what}; expected RMS error per answer {choice.rmse[ledger]:.3g}"
                     + (f" (all budget on the last level: {base:.3g})" if np.isfinite(base) else "")
                     + (f", weight {m.weight:g}" if m.weight != 1.0 else ""))
    return lines


def _noise_lines(geography: Geography, chars: Domain, queries: list, upward: bool) -> list[str]:
    """Per level, the noise of its detailed cells against the count that would match it (no data read).

    The fit of a parent whose cells hold fewer persons than the noise's standard deviation moves
    mass into its empty cells (non-negativity), and its children are held to it: a level is
    informative when its units' average count per cell is well above its noise. Without data
    the line gives the population per unit at which the two are equal.
    """
    key = identity_key(chars)
    identity = [q for q in queries if q.query.num_rows == chars.size and query_key(q.query) == key]
    if not identity:
        return []
    own = {q.level: q.law.variance for q in identity}
    sizes = geography.sizes
    combined, below = {}, None
    for k in range(geography.depth - 1, -1, -1):
        precision = (1.0 / own[k] if k in own else 0.0)
        if upward and below is not None:
            precision += 1.0 / (below * sizes[k + 1] / sizes[k])
        combined[k] = 1.0 / precision if precision > 0 else np.inf
        below = combined[k]
    lines = []
    for k, name in enumerate(geography.names):
        sd = float(np.sqrt(combined[k]))
        if not np.isfinite(sd):
            continue
        lines.append(f"level {name}: detailed cells known to noise s.d. {sd:.3g}; a unit of fewer than "
                     f"{sd * chars.size:,.0f} persons has an average count per cell below it (its non-negative fit then "
                     "biases small cells upward; the release warns when its own total says so)")
    return lines


def _full_domain_measurements(plan, details: TopDownPlan, noisy, leaf_offset, cell_offset) -> list:
    """Each level's noisy answers as a Measurement over the full domain (small domains only)."""
    import scipy.sparse as sp

    from dpopt.model.measurement import Measurement
    from dpopt.model.queries.explicit import SparseQuery

    geography = details.geography
    anc = geography.ancestors()
    out = []
    for q in details.queries:
        Q = q.query.to_sparse().tocoo()
        leaves, m = geography.sizes[-1], q.query.num_rows
        if leaves * Q.nnz > FULL_DOMAIN_NNZ:
            return []
        leaf = np.repeat(np.arange(leaves), Q.nnz)
        rows = anc[q.level][leaf] * m + np.tile(Q.row, leaves)
        cols = leaf_offset[leaf] + np.tile(cell_offset[Q.col], leaves)
        matrix = sp.csr_matrix((np.tile(Q.data, leaves), (rows, cols)), shape=(geography.sizes[q.level] * m,
                                                                               plan.domain.size))
        name = geography.names[q.level]
        labels = [f"{u} | {r}" for u in geography.units[q.level] for r in q.query.row_labels()]
        values = noisy[name][q.label].ravel()
        out.append(Measurement(SparseQuery(plan.domain, matrix, labels), values, q.law.family, q.law.scale,
                               q.law.variance, q.law.cost, q.ledger_label))
    return out
