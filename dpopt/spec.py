"""Release specifications: a TOML file (or a dict) describing one release, fully validated.

A spec says what to release and how: the domain, where the data come from, the privacy
budget and how it is split over the measured queries, the public constraints, the
reconstruction objective and backend, and the outputs. :func:`load_spec` parses and checks
its *structure* (known keys, types, ranges, budget shares summing exactly to 1, installed
backend, data file present) without reading any data; :func:`dpopt.release.plan` then
builds the public objects (domain, queries, constraints) and checks that the constraints
are consistent, still before any data is read.

Every error is a :class:`~dpopt.errors.SpecError` (or the relevant
:class:`~dpopt.errors.DpoptError`) whose one-line message names the spec file, the line
(when the spec came from a file) and the key, e.g.
``spec quickstart.toml, line 31, key 'measure[2].share': ...``. Entries of arrays are
numbered from 1 in messages. The reference of every key is ``docs/pages/reference/spec.md``.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping

from dpopt.errors import DpoptError, PrivacyParameterError, SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# ---- vocabulary -----------------------------------------------------------------------------

#: Query kinds a spec can name, with the keys each one takes.
QUERY_KINDS: dict[str, tuple[str, ...]] = {
    "marginal": ("attrs",),
    "total": (),
    "identity": (),
    "all_marginals": ("k",),
    "prefix": ("attr",),
}
QUERY_PARAMS = ("attrs", "k", "attr")
MECHANISMS = ("laplace", "gaussian")
ACCOUNTING = ("pure", "approx", "zcdp")
OBJECTIVES = ("l2", "l1", "linf", "entropy")
BUILTIN_DOMAINS = ("census",)
DATA_SOURCES = ("example", "file")
OUTPUT_FORMATS = ("csv", "parquet")
SUMMARY_FORMATS = ("md", "html")
CELL_CHOICES = ("all", "nonzero")
#: Release algorithms: the default measure-and-reconstruct pipeline, or one of the landed algorithms.
ALGORITHMS = ("measure-and-reconstruct", "barak", "mwem")
#: Barak et al. consistency methods a release can use (the Theorem 6 "shift" releases marginals
#: only, without a table, so it is refused here; see dpopt.algorithms.barak).
BARAK_METHODS = ("linf", "l1", "l2", "entropy")
MWEM_SELECT = ("query", "block")

#: Allowed keys of every table of a spec (arrays of tables are named by their key).
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "": ("name", "description", "algorithm", "domain", "data", "privacy", "measure", "barak", "mwem",
         "constraints", "reconstruct", "output"),
    "domain": ("builtin", "states", "counties_per_state", "attributes", "json"),
    "data": ("source", "rows", "seed", "path", "format", "count_column"),
    "privacy": ("accounting", "epsilon", "delta", "rho", "seed"),
    "measure": ("label", "query", *QUERY_PARAMS, "mechanism", "share"),
    "constraints": ("nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities"),
    "constraints.structural_zeros": ("where", "reason", "name", "builtin"),
    "constraints.hierarchy": ("parent", "child", "parent_of", "name"),
    "constraints.invariants": ("name", "query", *QUERY_PARAMS, "values", "from_data"),
    "constraints.inequalities": ("name", "query", *QUERY_PARAMS, "lower", "upper"),
    "reconstruct": ("objective", "backend", "time_limit"),
    "barak": ("marginals", "method"),
    "mwem": ("marginals", "rounds", "select", "repeat_passes"),
    "output": ("dir", "formats", "synthetic", "summary", "plots", "marginals", "cells"),
}


def models_dir() -> Path:
    """The ``models/`` directory of built-in specs (at the repository root, next to ``dpopt/``)."""
    import dpopt

    return Path(dpopt.__file__).resolve().parents[1] / "models"


def list_models() -> list[Path]:
    """The built-in spec files, sorted by name (empty when ``models/`` is absent)."""
    d = models_dir()
    return sorted(d.glob("*.toml")) if d.is_dir() else []


def resolve_spec_path(name: str | Path) -> Path:
    """A spec path as given, or the built-in spec of that name (``quickstart`` → ``models/quickstart.toml``)."""
    path = Path(name)
    if path.is_file():
        return path
    builtin = models_dir() / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if path.parent == Path(".") and builtin.is_file():
        return builtin
    known = ", ".join(p.stem for p in list_models()) or "none"
    raise SpecError(f"spec file {str(name)!r} does not exist (built-in specs: {known})")


# ---- the parsed spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class QuerySpec:
    """A query named in a spec: its kind and parameters (``attrs``, ``k`` or ``attr``)."""

    kind: str
    attrs: tuple[str, ...] = ()
    k: int | None = None
    attr: str | None = None
    path: tuple = ()

    def describe(self) -> str:
        if self.kind == "marginal":
            return f"marginal({', '.join(self.attrs)})"
        if self.kind == "all_marginals":
            return f"all_marginals(k={self.k})"
        if self.kind == "prefix":
            return f"prefix({self.attr})"
        return self.kind


@dataclass(frozen=True)
class DomainSpec:
    builtin: str | None = None
    states: int = 4
    counties_per_state: int = 3
    attributes: Mapping[str, Any] | None = None
    json: Path | None = None


@dataclass(frozen=True)
class DataSpec:
    source: str
    rows: int = 10_000
    seed: int = 0
    path: Path | None = None
    format: str | None = None
    count_column: str | None = None


@dataclass(frozen=True)
class PrivacySpec:
    accounting: str
    epsilon: Fraction | None = None
    delta: Fraction | None = None
    rho: Fraction | None = None
    seed: int | None = None


@dataclass(frozen=True)
class MeasureSpec:
    label: str
    query: QuerySpec
    mechanism: str
    share: Fraction
    path: tuple = ()


@dataclass(frozen=True)
class ZeroSpec:
    where: str | None = None
    reason: str = ""
    name: str | None = None
    builtin: bool = False
    path: tuple = ()


@dataclass(frozen=True)
class HierarchySpec:
    parent: str
    child: str
    parent_of: Mapping[str, Any] | None  # None: the built-in geography of the census domain
    name: str
    path: tuple = ()


@dataclass(frozen=True)
class InvariantSpec:
    name: str
    query: QuerySpec
    values: tuple[float, ...] | None
    from_data: bool
    path: tuple = ()


@dataclass(frozen=True)
class InequalitySpec:
    name: str
    query: QuerySpec
    lower: Any
    upper: Any
    path: tuple = ()


@dataclass(frozen=True)
class ConstraintsSpec:
    nonnegative: bool = False
    integer: bool = False
    structural_zeros: tuple[ZeroSpec, ...] = ()
    hierarchy: tuple[HierarchySpec, ...] = ()
    invariants: tuple[InvariantSpec, ...] = ()
    inequalities: tuple[InequalitySpec, ...] = ()


@dataclass(frozen=True)
class ReconstructSpec:
    objective: str = "l2"
    backend: str | None = None
    time_limit: float | None = None


@dataclass(frozen=True)
class AlgorithmSpec:
    """The release algorithm and its parameters.

    ``marginals`` is an order ``k`` (every ``k``-way marginal) or a tuple of attribute
    tuples: the marginals Barak et al. release, or MWEM's workload.
    """

    name: str = "measure-and-reconstruct"
    marginals: int | tuple[tuple[str, ...], ...] | None = None
    method: str = "linf"
    rounds: int = 10
    select: str = "query"
    repeat_passes: int = 0

    @property
    def section(self) -> str:
        """The spec table holding the parameters (``"barak"`` or ``"mwem"``)."""
        return self.name

    def describe(self) -> str:
        marg = (f"every {self.marginals}-way marginal" if isinstance(self.marginals, int)
                else f"{len(self.marginals or ())} marginals")
        if self.name == "barak":
            return f"barak (Fourier coefficients of {marg}; consistency {self.method})"
        if self.name == "mwem":
            return (f"mwem (workload: {marg}; {self.rounds} rounds, select {self.select}, "
                    f"{self.repeat_passes} repeat passes)")
        return self.name


@dataclass(frozen=True)
class OutputSpec:
    dir: Path | None = None
    formats: tuple[str, ...] = OUTPUT_FORMATS
    synthetic: bool = True
    summary: tuple[str, ...] = SUMMARY_FORMATS
    plots: bool = True
    marginals: bool = True
    cells: str = "all"


@dataclass(frozen=True, eq=False)
class ReleaseSpec:
    """A validated release specification.

    Attributes
    ----------
    name, description : str
    domain, data, privacy, measures, constraints, reconstruct, output
        The parsed sections (see the module notes and the spec reference).
    raw : dict
        The spec as written (echoed into the release report).
    source : Path or None
        The TOML file it came from.
    base_dir : Path
        Relative paths in the spec are resolved against it (the spec file's directory, or
        the working directory for a dict).
    """

    name: str
    description: str
    domain: DomainSpec
    data: DataSpec
    privacy: PrivacySpec
    measures: tuple[MeasureSpec, ...]
    constraints: ConstraintsSpec
    reconstruct: ReconstructSpec
    output: OutputSpec
    raw: dict = field(repr=False)
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec)
    source: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    lines: Mapping[tuple, int] = field(default_factory=dict, repr=False)

    def where(self, path: tuple) -> str:
        """``spec FILE, line N, key 'a.b[2].c'`` for a key path (line when known)."""
        return _where(self.source, self.lines, path)

    def error(self, path: tuple, message: str, cls: type[DpoptError] = SpecError) -> DpoptError:
        """An error of class ``cls`` whose message starts with :meth:`where`."""
        return cls(f"{self.where(path)}: {message}")

    @property
    def data_invariants(self) -> tuple[InvariantSpec, ...]:
        """Invariants whose values are taken from the data (published exactly, not private)."""
        return tuple(i for i in self.constraints.invariants if i.from_data)


def format_path(path: Iterable) -> str:
    """``("measure", 1, "share")`` → ``"measure[2].share"`` (array entries counted from 1)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _where(source: Path | None, lines: Mapping[tuple, int], path: tuple) -> str:
    parts = [f"spec {source}" if source is not None else "spec"]
    line = _line_of(lines, path)
    if line is not None:
        parts.append(f"line {line}")
    if path:
        parts.append(f"key {format_path(path)!r}")
    return ", ".join(parts)


def _line_of(lines: Mapping[tuple, int], path: tuple) -> int | None:
    path = tuple(path)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None


# ---- loading --------------------------------------------------------------------------------


def load_spec(spec: "str | Path | Mapping | ReleaseSpec") -> ReleaseSpec:
    """Parse and validate a release spec given as a TOML path, a built-in name or a dict.

    Parameters
    ----------
    spec
        A path to a TOML file, the name of a built-in spec (``"quickstart"``), a mapping
        with the same structure as the TOML, or an already loaded :class:`ReleaseSpec`.

    Returns
    -------
    ReleaseSpec

    Raises
    ------
    SpecError
        Naming the file, line and key of the first problem found. No data is read.
    """
    if isinstance(spec, ReleaseSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_spec(dict(spec))
    if not isinstance(spec, (str, Path)):
        raise SpecError(f"a spec must be a TOML path or a dict, got {type(spec).__name__}")
    path = resolve_spec_path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec {path}: cannot be read ({exc})") from None
    return parse_spec_text(text, source=path)


def parse_spec_text(text: str, source: Path | None = None) -> ReleaseSpec:
    """Parse TOML text (``source`` names the file in messages and anchors relative paths)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"spec {source or '(text)'}: invalid TOML: {exc}") from None
    lines = key_lines(text)
    base = source.resolve().parent if source is not None else Path.cwd()
    return parse_spec(raw, source=source, base_dir=base, lines=lines)


def parse_spec(raw: dict, *, source: Path | None = None, base_dir: Path | None = None,
               lines: Mapping[tuple, int] | None = None) -> ReleaseSpec:
    """Validate the structure of a spec given as a dict (what ``tomllib`` returns)."""
    ctx = _Context(source, dict(lines or {}), base_dir or Path.cwd())
    top = _Table(ctx, raw, (), "")
    name = top.str("name", default=source.stem if source is not None else "release")
    if not name.strip() or any(c in name for c in "/\\"):
        raise ctx.error(("name",), f"must be a non-empty name without slashes, got {name!r}")
    description = top.str("description", default="")
    domain = _parse_domain(top.table("domain", required=True))
    data = _parse_data(top.table("data"), domain)
    privacy = _parse_privacy(top.table("privacy", required=True))
    algorithm = _parse_algorithm(top, privacy)
    if algorithm.name == "measure-and-reconstruct":
        measures = _parse_measures(top.tables("measure", required=True), privacy)
    else:
        measures = ()
    constraints = _parse_constraints(top.table("constraints"), domain)
    _check_algorithm_constraints(top, algorithm, constraints)
    reconstruct = _parse_reconstruct(top.table("reconstruct"), algorithm)
    output = _parse_output(top.table("output"), constraints)
    return ReleaseSpec(
        name=name, description=description, domain=domain, data=data, privacy=privacy,
        measures=measures, constraints=constraints, reconstruct=reconstruct, output=output,
        raw=raw, algorithm=algorithm, source=source, base_dir=ctx.base_dir, lines=ctx.lines,
    )


# ---- sections ---------------------------------------------------------------------------------


def _parse_domain(t: "_Table") -> DomainSpec:
    given = [k for k in ("builtin", "attributes", "json") if k in t.raw]
    if len(given) != 1:
        raise t.error(
            (), "give exactly one of 'builtin' (\"census\"), 'attributes' (a table name -> size "
            f"or labels) or 'json' (a Private-PGM domain file); got {given or 'none'}"
        )
    if "builtin" in t.raw:
        builtin = t.str("builtin", choices=BUILTIN_DOMAINS)
        return DomainSpec(
            builtin=builtin,
            states=t.int("states", default=4, minimum=1),
            counties_per_state=t.int("counties_per_state", default=3, minimum=1),
        )
    for key in ("states", "counties_per_state"):
        if key in t.raw:
            raise t.error((key,), "applies only to the built-in census domain (builtin = \"census\")")
    if "json" in t.raw:
        path = t.path("json", must_exist=True)
        return DomainSpec(json=path)
    attrs_table = t.table("attributes")
    attributes = {}
    for attr, value in attrs_table.raw.items():
        ok_size = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        ok_labels = (
            isinstance(value, list) and len(value) > 0
            and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value)
        )
        if not (ok_size or ok_labels):
            raise attrs_table.error(
                (attr,), f"must be a size (integer >= 1) or a non-empty list of labels, got {value!r}"
            )
        attributes[attr] = value
    if not attributes:
        raise attrs_table.error((), "declares no attribute")
    return DomainSpec(attributes=attributes)


def _parse_data(t: "_Table", domain: DomainSpec) -> DataSpec:
    default_source = "example" if domain.builtin and "path" not in t.raw else "file"
    source = t.str("source", default=default_source, choices=DATA_SOURCES)
    if source == "example":
        if domain.builtin != "census":
            raise t.error(("source",), "the example data need the built-in census domain "
                          "([domain] builtin = \"census\")")
        for key in ("path", "format", "count_column"):
            if key in t.raw:
                raise t.error((key,), "does not apply to source = \"example\" (use source = \"file\")")
        return DataSpec(source, rows=t.int("rows", default=10_000, minimum=1), seed=t.int("seed", default=0, minimum=0))
    for key in ("rows", "seed"):
        if key in t.raw:
            raise t.error((key,), "applies only to source = \"example\"")
    path = t.path("path", must_exist=True) if "path" in t.raw else None
    fmt = t.str("format", default=None, choices=("csv", "parquet"))
    if path is not None and fmt is None:
        fmt = data_format(path, t.where(("path",)))
    return DataSpec(source, path=path, format=fmt, count_column=t.str("count_column", default=None))


def data_format(path: Path, where: str) -> str:
    """``"csv"`` or ``"parquet"`` from a file's extension, else a SpecError at ``where``."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        return "parquet"
    if suffixes and (suffixes[-1] in (".csv", ".txt") or suffixes[-2:] == [".csv", ".gz"]):
        return "csv"
    raise SpecError(f"{where}: cannot tell the format of {str(path)!r} from its extension; "
                    "use .csv or .parquet, or set data.format")


def _parse_privacy(t: "_Table") -> PrivacySpec:
    accounting = t.str("accounting", required=True, choices=ACCOUNTING)
    allowed = {"pure": ("epsilon",), "approx": ("epsilon", "delta"), "zcdp": ("rho", "epsilon", "delta")}[accounting]
    for key in ("epsilon", "delta", "rho"):
        if key in t.raw and key not in allowed:
            raise t.error((key,), f"does not apply to accounting = {accounting!r} (it takes {' and '.join(allowed)})")
    seed = t.int("seed", default=None, minimum=0)
    if accounting == "zcdp":
        if "rho" in t.raw:
            if "epsilon" in t.raw or "delta" in t.raw:
                raise t.error(("rho",), "give either rho, or epsilon and delta (converted to rho), not both")
            return PrivacySpec(accounting, rho=t.budget("rho"), seed=seed)
        if not ("epsilon" in t.raw and "delta" in t.raw):
            raise t.error((), "accounting = \"zcdp\" needs rho, or epsilon and delta")
    eps = t.budget("epsilon", required=True)
    delta = t.budget("delta", required=True, unit=True) if accounting != "pure" else None
    return PrivacySpec(accounting, epsilon=eps, delta=delta, seed=seed)


def _parse_query(t: "_Table", kinds: Iterable[str]) -> QuerySpec:
    kinds = tuple(kinds)
    kind = t.str("query", required=True, choices=kinds)
    needs = QUERY_KINDS[kind]
    for key in QUERY_PARAMS:
        if key in t.raw and key not in needs:
            takes = f"takes {', '.join(needs)}" if needs else "takes no parameter"
            raise t.error((key,), f"does not apply to query = {kind!r} (it {takes})")
    if kind == "marginal":
        return QuerySpec(kind, attrs=tuple(t.str_list("attrs", required=True)), path=t.path_)
    if kind == "all_marginals":
        return QuerySpec(kind, k=t.int("k", required=True, minimum=1), path=t.path_)
    if kind == "prefix":
        return QuerySpec(kind, attr=t.str("attr", required=True), path=t.path_)
    return QuerySpec(kind, path=t.path_)


def _parse_measures(tables: list["_Table"], privacy: PrivacySpec) -> tuple[MeasureSpec, ...]:
    measures, labels = [], {}
    for t in tables:
        query = _parse_query(t, QUERY_KINDS)
        mechanism = t.str("mechanism", required=True, choices=MECHANISMS)
        if mechanism == "gaussian" and privacy.accounting == "pure":
            raise t.error(("mechanism",), "the Gaussian mechanism is not pure-DP; use accounting = "
                          "\"approx\" or \"zcdp\", or mechanism = \"laplace\"")
        if mechanism == "laplace" and privacy.accounting == "zcdp":
            raise t.error(("mechanism",), "a Laplace measurement under zCDP accounting would be paid "
                          "epsilon^2/2, which cannot spend an exact share of rho; use mechanism = "
                          "\"gaussian\" or accounting = \"pure\"")
        share = t.budget("share", required=True)
        label = t.str("label", default=query.describe())
        if not label.strip():
            raise t.error(("label",), "must not be empty")
        if label in labels:
            raise t.error(("label",), f"label {label!r} is already used by measure[{labels[label] + 1}]; "
                          "give each [[measure]] a distinct label")
        labels[label] = len(measures)
        measures.append(MeasureSpec(label, query, mechanism, share, t.path_))
    total = sum((m.share for m in measures), Fraction(0))
    if total != 1:
        ctx = tables[0].ctx
        shares = ", ".join(str(m.share) for m in measures)
        lines = [ctx.lines.get(m.path + ("share",)) for m in measures]
        at = f", lines {', '.join(map(str, lines))}" if all(lines) else ""
        raise SpecError(
            f"spec{f' {ctx.source}' if ctx.source else ''}{at}, key 'measure[*].share': the budget "
            f"shares of the [[measure]] tables ({shares}) sum to {total} ({float(total):.6g}), not exactly 1"
        )
    return tuple(measures)


def _parse_constraints(t: "_Table", domain: DomainSpec) -> ConstraintsSpec:
    zeros = []
    for z in t.tables("structural_zeros"):
        if z.bool("builtin", default=False):
            for key in ("where", "reason", "name"):
                if key in z.raw:
                    raise z.error((key,), "does not apply to an entry with builtin = true")
            if domain.builtin != "census":
                raise z.error(("builtin",), "the built-in structural zeros belong to the census domain "
                              "([domain] builtin = \"census\")")
            zeros.append(ZeroSpec(builtin=True, path=z.path_))
        else:
            zeros.append(ZeroSpec(where=z.str("where", required=True), reason=z.str("reason", default=""),
                                  name=z.str("name", default=None), path=z.path_))
    hierarchy = []
    for h in t.tables("hierarchy"):
        parent, child = h.str("parent", required=True), h.str("child", required=True)
        raw = h.raw.get("parent_of", "builtin")
        if raw == "builtin":
            if domain.builtin != "census":
                raise h.error(("parent_of",), "give parent_of as a table {child value = parent value}; "
                              "the built-in geography exists only for the census domain")
            parent_of = None
        elif isinstance(raw, dict) and raw:
            parent_of = dict(raw)
        else:
            raise h.error(("parent_of",), f"must be a table {{child value = parent value}} or \"builtin\", got {raw!r}")
        hierarchy.append(HierarchySpec(parent, child, parent_of, h.str("name", default=f"{child} in {parent}"), h.path_))
    invariants = []
    for i in t.tables("invariants"):
        query = _parse_query(i, ("marginal", "total", "identity", "prefix"))
        from_data = i.bool("from_data", default=False)
        if from_data == ("values" in i.raw):
            raise i.error((), "give either values = [...] (public numbers) or from_data = true "
                          "(published exactly from the data, not private)")
        values = None if from_data else tuple(i.number_list("values"))
        invariants.append(InvariantSpec(i.str("name", default=query.describe()), query, values, from_data, i.path_))
    inequalities = []
    for q in t.tables("inequalities"):
        query = _parse_query(q, ("marginal", "total", "identity", "prefix"))
        if "lower" not in q.raw and "upper" not in q.raw:
            raise q.error((), "give lower, upper or both")
        inequalities.append(InequalitySpec(q.str("name", default=query.describe()), query,
                                           q.bound("lower"), q.bound("upper"), q.path_))
    return ConstraintsSpec(
        nonnegative=t.bool("nonnegative", default=False),
        integer=t.bool("integer", default=False),
        structural_zeros=tuple(zeros), hierarchy=tuple(hierarchy),
        invariants=tuple(invariants), inequalities=tuple(inequalities),
    )


def _parse_algorithm(top: "_Table", privacy: PrivacySpec) -> AlgorithmSpec:
    """The ``algorithm`` key and its ``[barak]`` / ``[mwem]`` table (the other one must be absent)."""
    name = top.str("algorithm", default="measure-and-reconstruct", choices=ALGORITHMS)
    for section in ("barak", "mwem"):
        if section in top.raw and section != name:
            raise top.error((section,), f"[{section}] applies only to algorithm = {section!r} "
                            f"(this spec runs algorithm = {name!r})")
    if name == "measure-and-reconstruct":
        return AlgorithmSpec()
    if "measure" in top.raw:
        raise top.error(("measure",), f"[[measure]] does not apply to algorithm = {name!r}: it chooses its own "
                        f"measurements of the [{name}] marginals with the whole budget; remove the [[measure]] tables")
    t = top.table(name, required=True)
    marginals = _parse_marginals(t)
    if name == "barak":
        raw_method = t.raw.get("method")
        if raw_method == "shift":
            raise t.error(("method",), "method 'shift' (Barak et al. Theorem 6) releases marginals without a "
                          f"table, which a release publishes; choose one of {list(BARAK_METHODS)}, or call "
                          "dpopt.algorithms.barak.barak_release(method='shift') from Python")
        return AlgorithmSpec(name, marginals, method=t.str("method", default="linf", choices=BARAK_METHODS))
    if privacy.accounting == "approx":
        raise top.error(("algorithm",), "algorithm = 'mwem' runs under pure DP (accounting = \"pure\") or "
                        "zCDP (accounting = \"zcdp\"), not accounting = \"approx\"")
    return AlgorithmSpec(
        name, marginals,
        rounds=t.int("rounds", default=10, minimum=1),
        select=t.str("select", default="query", choices=MWEM_SELECT),
        repeat_passes=t.int("repeat_passes", default=0, minimum=0),
    )


def _parse_marginals(t: "_Table") -> int | tuple[tuple[str, ...], ...]:
    """``marginals``: an order k >= 1, or a non-empty list of non-empty attribute lists."""
    value = t._get("marginals", True, None)
    if isinstance(value, int) and not isinstance(value, bool):
        return t.int("marginals", minimum=1)
    if not isinstance(value, list) or not value:
        raise t.error(("marginals",), "must be an order k (integer >= 1) or a non-empty list of attribute "
                      f"lists such as [[\"a\", \"b\"], [\"c\"]], got {_type_name(value)} {value!r}")
    out = []
    for i, attrs in enumerate(value):
        if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) for a in attrs):
            raise t.error(("marginals", i), f"must be a non-empty list of attribute names, got {attrs!r}")
        if len(set(attrs)) != len(attrs):
            raise t.error(("marginals", i), f"names an attribute twice: {attrs}")
        out.append(tuple(attrs))
    return tuple(out)


def _check_algorithm_constraints(top: "_Table", algorithm: AlgorithmSpec, constraints: ConstraintsSpec) -> None:
    """MWEM keeps structural zeros, hierarchies and invariants, but has no way to impose inequalities."""
    if algorithm.name == "mwem" and constraints.inequalities:
        raise top.error(("constraints", "inequalities"), "algorithm = 'mwem' keeps structural zeros, hierarchies "
                        "and invariants but cannot impose inequalities; remove them or use another algorithm")


def _parse_reconstruct(t: "_Table", algorithm: AlgorithmSpec | None = None) -> ReconstructSpec:
    from dpopt.estimate import BACKENDS_FOR, installed_backends

    name = algorithm.name if algorithm is not None else "measure-and-reconstruct"
    if name == "mwem" and t.raw:
        key = next(iter(t.raw))
        raise t.error((key,), "[reconstruct] does not apply to algorithm = 'mwem' (multiplicative weights "
                      "reconstruct as they measure); set its parameters under [mwem]")
    if name == "barak":
        if "objective" in t.raw:
            raise t.error(("objective",), "does not apply to algorithm = 'barak'; set [barak] method instead")
        objective = algorithm.method
    else:
        objective = t.str("objective", default="l2", choices=OBJECTIVES)
    backend = t.str("backend", default=None)
    if backend is not None:
        fits = BACKENDS_FOR[objective]
        installed = [b for b in fits if b in ("exact", "mw") or b in installed_backends()]
        if backend not in installed:
            why = "is not installed" if backend in fits else f"is not a backend for objective {objective!r}"
            raise t.error(("backend",), f"backend {backend!r} {why}; installed backends for {objective!r}: "
                          f"{installed} (all installed: {installed_backends()})")
    time_limit = t.float("time_limit", default=None, positive=True)
    return ReconstructSpec(objective, backend, time_limit)


def _parse_output(t: "_Table", constraints: ConstraintsSpec) -> OutputSpec:
    formats = tuple(t.str_list("formats", default=list(OUTPUT_FORMATS), choices=OUTPUT_FORMATS, allow_empty=True))
    summary_raw = t.raw.get("summary", list(SUMMARY_FORMATS))
    if isinstance(summary_raw, str):
        summary = (t.str("summary", choices=SUMMARY_FORMATS),)
    else:
        summary = tuple(t.str_list("summary", default=list(SUMMARY_FORMATS), choices=SUMMARY_FORMATS, allow_empty=True))
    synthetic = t.bool("synthetic", default=constraints.integer)
    if synthetic and not constraints.integer:
        raise t.error(("synthetic",), "synthetic microdata need integer counts: set "
                      "[constraints] integer = true, or synthetic = false")
    out_dir = t.path("dir", must_exist=False) if "dir" in t.raw else None
    return OutputSpec(
        dir=out_dir, formats=formats, synthetic=synthetic, summary=summary,
        plots=t.bool("plots", default=True), marginals=t.bool("marginals", default=True),
        cells=t.str("cells", default="all", choices=CELL_CHOICES),
    )


# ---- typed access to one table ----------------------------------------------------------------


@dataclass
class _Context:
    source: Path | None
    lines: dict
    base_dir: Path

    def where(self, path: tuple) -> str:
        return _where(self.source, self.lines, path)

    def error(self, path: tuple, message: str) -> SpecError:
        return SpecError(f"{self.where(path)}: {message}")


_MISSING = object()


class _Table:
    """One table of the spec: typed getters whose errors name the key, and unknown-key checks."""

    def __init__(self, ctx: _Context, raw: object, path: tuple, section: str | None, array: bool = False) -> None:
        self.ctx, self.path_, self.section = ctx, path, section or ""
        if not isinstance(raw, dict):
            raise ctx.error(path, f"must be a table, got {_type_name(raw)} {raw!r}")
        self.raw = raw
        allowed = SECTION_KEYS.get(section) if section is not None else None
        if allowed is not None:
            for key in raw:
                if key not in allowed:
                    hint = _close(key, allowed)
                    where = (f"[[{section}]]" if array else f"[{section}]") if section else "the top level"
                    raise ctx.error(
                        path + (key,),
                        f"unknown key{hint}; allowed keys in {where}: {', '.join(allowed)}",
                    )

    # errors
    def where(self, sub: tuple) -> str:
        return self.ctx.where(self.path_ + sub)

    def error(self, sub: tuple, message: str) -> SpecError:
        return self.ctx.error(self.path_ + sub, message)

    def _get(self, key: str, required: bool, default):
        if key in self.raw:
            return self.raw[key]
        if required:
            raise self.error((key,), "missing required key")
        return _MISSING if default is _MISSING else default

    # sub-tables
    def table(self, key: str, required: bool = False) -> "_Table":
        value = self._get(key, required, {})
        sub = f"{self.section}.{key}" if self.section else key
        return _Table(self.ctx, value, self.path_ + (key,), sub if sub in SECTION_KEYS else None)

    def tables(self, key: str, required: bool = False) -> list["_Table"]:
        value = self._get(key, required, [])
        if isinstance(value, dict):
            value = [value]  # a single inline table is accepted for an array of one
        if not isinstance(value, list):
            raise self.error((key,), f"must be an array of tables, got {_type_name(value)}")
        sub = f"{self.section}.{key}" if self.section else key
        section = sub if sub in SECTION_KEYS else None
        out = [_Table(self.ctx, item, self.path_ + (key, i), section, array=True) for i, item in enumerate(value)]
        if required and not out:
            raise self.error((key,), "must hold at least one table")
        return out

    # scalars
    def str(self, key: str, *, required: bool = False, default=None, choices=None):
        value = self._get(key, required, default)
        if value is default and key not in self.raw:
            return default
        if not isinstance(value, str):
            raise self.error((key,), f"must be a string, got {_type_name(value)} {value!r}")
        if choices is not None and value not in choices:
            raise self.error((key,), f"unknown value {value!r}{_close(value, choices)}; choose one of {list(choices)}")
        return value

    def bool(self, key: str, *, default: bool | None = None) -> bool:
        value = self._get(key, default is None, default)
        if not isinstance(value, bool):
            raise self.error((key,), f"must be true or false, got {_type_name(value)} {value!r}")
        return value

    def int(self, key: str, *, required: bool = False, default=None, minimum: int | None = None):
        value = self._get(key, required, default)
        if value is default and key not in self.raw:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error((key,), f"must be an integer, got {_type_name(value)} {value!r}")
        if minimum is not None and value < minimum:
            raise self.error((key,), f"must be an integer >= {minimum}, got {value}")
        return value

    def float(self, key: str, *, default=None, positive: bool = False):
        value = self._get(key, False, default)
        if value is default and key not in self.raw:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error((key,), f"must be a number, got {_type_name(value)} {value!r}")
        if positive and not value > 0:
            raise self.error((key,), f"must be > 0, got {value}")
        return float(value)

    def budget(self, key: str, *, required: bool = False, unit: bool = False) -> Fraction | None:
        """An exact positive rational (``0.1`` is 1/10; strings such as ``"1/3"`` accepted)."""
        from dpopt.privacy.conversions import as_fraction

        value = self._get(key, required, None)
        if value is None:
            return None
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            raise self.error((key,), f"must be a number or a fraction string such as \"1/3\", got {_type_name(value)} {value!r}")
        try:
            q = as_fraction(value, key)
        except PrivacyParameterError:
            raise self.error((key,), f"must be a number or a fraction string such as \"1/3\", got {value!r}") from None
        if q <= 0 or (unit and q >= 1):
            raise self.error((key,), f"must be {'in (0, 1)' if unit else '> 0'}, got {value!r}")
        return q

    def str_list(self, key: str, *, required: bool = False, default=None, choices=None, allow_empty: bool = False):
        value = self._get(key, required, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error((key,), f"must be a list of strings, got {_type_name(value)} {value!r}")
        if not value and not allow_empty:
            raise self.error((key,), "must not be empty")
        if len(set(value)) != len(value):
            raise self.error((key,), f"names a value twice: {value}")
        for i, v in enumerate(value):
            if choices is not None and v not in choices:
                raise self.error((key, i), f"unknown value {v!r}; choose from {list(choices)}")
        return value

    def number_list(self, key: str) -> list[float]:
        value = self._get(key, True, None)
        if not isinstance(value, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            raise self.error((key,), f"must be a list of numbers, got {_type_name(value)} {value!r}")
        return [float(v) for v in value]

    def bound(self, key: str):
        if key not in self.raw:
            return None
        value = self.raw[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return tuple(self.number_list(key))

    def path(self, key: str, *, must_exist: bool) -> Path:
        value = self.str(key, required=True)
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.ctx.base_dir / path
        if must_exist and not path.is_file():
            raise self.error((key,), f"file {value!r} does not exist (looked for {str(path)!r})")
        return path


def _type_name(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a float"}.get(type(value), type(value).__name__)


def _close(word: str, choices: Iterable[str]) -> str:
    import difflib

    match = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# ---- line numbers of TOML keys ----------------------------------------------------------------
# tomllib forgets where each key was. This scanner walks the same (already valid) text and
# records the line of every key path, e.g. ("measure", 1, "share") for the share key of the
# second [[measure]] table. Best effort: on anything it does not follow it stops and keeps
# what it found (a missing line only makes a message less precise).


def key_lines(text: str) -> dict[tuple, int]:
    """Map every key path of a (valid) TOML document to its 1-based line number."""
    scanner = _Scanner(text)
    try:
        scanner.document()
    except (IndexError, ValueError):
        pass
    return scanner.found


_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.t = text
        self.n = len(text)
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.found: dict[tuple, int] = {}

    # ---- helpers ------------------------------------------------------------------------
    def record(self, path: tuple, pos: int) -> None:
        self.found.setdefault(path, bisect_right(self.starts, pos))

    def skip(self, pos: int, newlines: bool = True) -> int:
        """Skip blanks (and newlines and comments when ``newlines``)."""
        t, n = self.t, self.n
        while pos < n:
            c = t[pos]
            if c in " \t\r" or (newlines and c == "\n"):
                pos += 1
            elif c == "#" and newlines:
                end = t.find("\n", pos)
                pos = n if end < 0 else end + 1
            else:
                break
        return pos

    def string(self, pos: int) -> tuple[str, int]:
        """Read a quoted string at ``pos``; return its raw content and the position after it."""
        t = self.t
        for quote in ('"""', "'''"):
            if t.startswith(quote, pos):
                end = pos + 3
                while True:
                    end = t.index(quote, end)
                    if quote == "'''" or not _escaped(t, end):
                        break
                    end += 1
                while t.startswith(quote[0], end + 3):  # up to two quotes may end the content
                    end += 1
                return t[pos + 3 : end], end + 3
        quote = t[pos]
        end = pos + 1
        while True:
            end = t.index(quote, end)
            if quote == "'" or not _escaped(t, end):
                break
            end += 1
        return t[pos + 1 : end], end + 1

    def key(self, pos: int) -> tuple[tuple[str, ...], int]:
        """Read a (dotted) key; return its parts and the position after it."""
        parts = []
        while True:
            pos = self.skip(pos, newlines=False)
            if self.t[pos] in "\"'":
                part, pos = self.string(pos)
            else:
                start = pos
                while pos < self.n and self.t[pos] in _BARE:
                    pos += 1
                if pos == start:
                    raise ValueError("no key")
                part = self.t[start:pos]
            parts.append(part)
            pos = self.skip(pos, newlines=False)
            if pos < self.n and self.t[pos] == ".":
                pos += 1
                continue
            return tuple(parts), pos

    # ---- grammar --------------------------------------------------------------------------
    def document(self) -> None:
        table: tuple = ()
        arrays: dict[tuple, int] = {}  # array-of-tables path -> number of tables so far
        pos = 0
        while True:
            pos = self.skip(pos)
            if pos >= self.n:
                return
            if self.t[pos] == "[":
                double = self.t.startswith("[[", pos)
                parts, end = self.key(pos + (2 if double else 1))
                resolved: list = []
                for i, part in enumerate(parts):
                    resolved.append(part)
                    last = i == len(parts) - 1
                    if tuple(resolved) in arrays and not (double and last):
                        resolved.append(arrays[tuple(resolved)] - 1)
                if double:
                    base = tuple(resolved)
                    index = arrays.get(base, 0)
                    arrays[base] = index + 1
                    table = base + (index,)
                else:
                    table = tuple(resolved)
                self.record(table, pos)
                pos = self.t.index("]", end) + (2 if double else 1)
            else:
                pos = self.keyval(pos, table)

    def keyval(self, pos: int, prefix: tuple) -> int:
        start = pos
        parts, pos = self.key(pos)
        if self.t[pos] != "=":
            raise ValueError("expected '='")
        path = prefix + parts
        self.record(path, start)
        return self.value(pos + 1, path)

    def value(self, pos: int, path: tuple) -> int:
        pos = self.skip(pos, newlines=False)
        c = self.t[pos]
        if c == "[":
            return self.array(pos, path)
        if c == "{":
            return self.inline(pos, path)
        if c in "\"'":
            return self.string(pos)[1]
        while pos < self.n and self.t[pos] not in ",]}\n#":
            pos += 1
        return pos

    def array(self, pos: int, path: tuple) -> int:
        pos += 1
        index = 0
        while True:
            pos = self.skip(pos)
            if self.t[pos] == "]":
                return pos + 1
            self.record(path + (index,), pos)
            pos = self.value(pos, path + (index,))
            pos = self.skip(pos)
            if self.t[pos] == ",":
                pos += 1
                index += 1

    def inline(self, pos: int, path: tuple) -> int:
        pos += 1
        while True:
            pos = self.skip(pos)
            if self.t[pos] == "}":
                return pos + 1
            pos = self.keyval(pos, path)
            pos = self.skip(pos)
            if self.t[pos] == ",":
                pos += 1


def _escaped(text: str, pos: int) -> bool:
    """True when the character at ``pos`` is preceded by an odd number of backslashes."""
    count = 0
    while pos - count - 1 >= 0 and text[pos - count - 1] == "\\":
        count += 1
    return count % 2 == 1
