"""The common sections of a spec: domain, data, privacy, constraints, output (and the shared
``[reconstruct]`` reader). The algorithm's own tables are parsed by its ``Params.from_spec``."""

from __future__ import annotations

from pathlib import Path

from dpopt.errors import SpecError
from dpopt.spec.model import (
    OUTPUT_FORMATS,
    SUMMARY_FORMATS,
    ConstraintsSpec,
    DataSpec,
    DomainSpec,
    HierarchySpec,
    InequalitySpec,
    InvariantSpec,
    OutputSpec,
    PrivacySpec,
    ReconstructSpec,
    ZeroSpec,
)
from dpopt.spec.queries import QUERY_PARAMS, parse_query
from dpopt.spec.table import SpecTable

__all__ = ["COMMON_KEYS", "ACCOUNTING", "parse_domain", "parse_data", "data_format",
           "parse_privacy", "parse_constraints", "parse_output", "parse_reconstruct"]

ACCOUNTING = ("pure", "approx", "zcdp")
BUILTIN_DOMAINS = ("census",)
DATA_SOURCES = ("example", "file")
CELL_CHOICES = ("all", "nonzero")
MARGINALS_LAYOUTS = ("auto", "long", "files")
ZERO_RECORD_CHOICES = ("error", "drop")
#: Keys of every reconstruction setting (an algorithm declares the ones it reads).
RECONSTRUCT_KEYS = ("objective", "backend", "time_limit")

#: Allowed keys of the common tables (the algorithms declare their own).
COMMON_KEYS: dict[str, tuple[str, ...]] = {
    "": ("name", "description", "algorithm", "domain", "data", "privacy", "constraints", "output"),
    "domain": ("builtin", "states", "counties_per_state", "attributes", "json", "codes"),
    "data": ("source", "rows", "seed", "path", "format", "count_column", "missing_values"),
    "privacy": ("accounting", "epsilon", "delta", "rho", "seed"),
    "constraints": ("nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities",
                    "structural_zero_records"),
    "constraints.structural_zeros": ("where", "reason", "name", "builtin"),
    "constraints.hierarchy": ("parent", "child", "parent_of", "name"),
    "constraints.invariants": ("name", "query", *QUERY_PARAMS, "values", "from_data"),
    "constraints.inequalities": ("name", "query", *QUERY_PARAMS, "lower", "upper"),
    "output": ("dir", "formats", "synthetic", "summary", "plots", "marginals", "marginals_layout", "cells"),
}


def parse_domain(t: SpecTable) -> DomainSpec:
    spec = _parse_domain(t)
    if "codes" not in t.raw:
        return spec
    from dataclasses import replace

    codes = t.str_list("codes")
    if spec.attributes is not None:
        for i, attr in enumerate(codes):
            value = spec.attributes.get(attr)
            if value is None:
                raise t.error(("codes", i), f"unknown attribute {attr!r}; the domain has {list(spec.attributes)}")
            if not isinstance(value, list):
                raise t.error(("codes", i), f"attribute {attr!r} has no labels, so its values are codes already")
    return replace(spec, codes=tuple(codes))


def _parse_domain(t: SpecTable) -> DomainSpec:
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


def parse_data(t: SpecTable, domain: DomainSpec) -> DataSpec:
    default_source = "example" if domain.builtin and "path" not in t.raw else "file"
    source = t.str("source", default=default_source, choices=DATA_SOURCES)
    if source == "example":
        if domain.builtin != "census":
            raise t.error(("source",), "the example data need the built-in census domain "
                          "([domain] builtin = \"census\")")
        for key in ("path", "format", "count_column", "missing_values"):
            if key in t.raw:
                raise t.error((key,), "does not apply to source = \"example\" (use source = \"file\")")
        return DataSpec(source, rows=t.int("rows", default=10_000, minimum=1), seed=t.int("seed", default=0, minimum=0))
    for key in ("rows", "seed"):
        if key in t.raw:
            raise t.error((key,), "applies only to source = \"example\"")
    # Whether the file is there is the run's business (dpopt.release.plan): `dpopt check` needs no data.
    path = t.path("path", must_exist=False) if "path" in t.raw else None
    fmt = t.str("format", default=None, choices=("csv", "parquet"))
    if path is not None and fmt is None and path.is_file():
        fmt = data_format(path, t.where(("path",)))
    missing = tuple(t.str_list("missing_values", default=[], allow_empty=True)) if "missing_values" in t.raw else ()
    if "" in missing:
        raise t.error(("missing_values",), "an empty cell is always missing; list other markers only")
    return DataSpec(source, path=path, format=fmt, count_column=t.str("count_column", default=None),
                    missing_values=missing)


def data_format(path: Path, where: str) -> str:
    """``"csv"`` or ``"parquet"`` from a file's content (Parquet's magic bytes) or extension,
    else a SpecError at ``where`` (see :func:`dpopt.model.data.file_format`)."""
    from dpopt.errors import DataError
    from dpopt.model.data import file_format

    try:
        fmt = file_format(path)
    except DataError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if fmt is None:
        raise SpecError(f"{where}: cannot tell the format of {str(path)!r} from its content or extension; "
                        "use .csv or .parquet, or set data.format")
    return fmt


def parse_privacy(t: SpecTable) -> PrivacySpec:
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
            return PrivacySpec(accounting, rho=_in_range(t, "rho", t.budget("rho")), seed=seed)
        if not ("epsilon" in t.raw and "delta" in t.raw):
            raise t.error((), "accounting = \"zcdp\" needs rho, or epsilon and delta")
    eps = _in_range(t, "epsilon", t.budget("epsilon", required=True))
    delta = _in_range(t, "delta", t.budget("delta", required=True, unit=True)) if accounting != "pure" else None
    return PrivacySpec(accounting, epsilon=eps, delta=delta, seed=seed)


#: Why each budget key has the range it has (see :mod:`dpopt.privacy.conversions`).
_RANGE_REASONS = {
    "epsilon": "below 2^-56 not even a count measured with the whole budget fits the exact samplers "
               "(a Laplace scale 1/epsilon above 2^56); above 2^63 no noise would remain",
    "rho": "below 2^-113 not even a count measured with the whole budget fits the exact discrete Gaussian "
           "sampler (sigma^2 = 1/(2 rho) above 2^112); above 2^63 no noise would remain",
    "delta": "outside it log(1/delta) leaves the range the privacy conversions are computed in",
}


def _in_range(t: SpecTable, key: str, value):
    """The budget value, or an error naming the key when it lies outside the range dpopt can honour."""
    from dpopt.errors import PrivacyParameterError
    from dpopt.privacy.conversions import DELTA_RANGE, EPSILON_RANGE, RHO_RANGE, check_range

    bounds = {"epsilon": EPSILON_RANGE, "rho": RHO_RANGE, "delta": DELTA_RANGE}[key]
    try:
        return check_range(value, bounds, "", _RANGE_REASONS[key])
    except PrivacyParameterError as exc:
        raise t.error((key,), str(exc)) from None


def parse_constraints(t: SpecTable, domain: DomainSpec) -> ConstraintsSpec:
    zeros = []
    for z in t.tables("structural_zeros", COMMON_KEYS["constraints.structural_zeros"]):
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
    for h in t.tables("hierarchy", COMMON_KEYS["constraints.hierarchy"]):
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
    for i in t.tables("invariants", COMMON_KEYS["constraints.invariants"]):
        query = parse_query(i, ("marginal", "total", "identity", "prefix"))
        from_data = i.bool("from_data", default=False)
        if from_data == ("values" in i.raw):
            raise i.error((), "give either values = [...] (public numbers) or from_data = true "
                          "(published exactly from the data, not private)")
        values = None if from_data else tuple(i.number_list("values"))
        invariants.append(InvariantSpec(i.str("name", default=query.describe()), query, values, from_data, i.path_))
    inequalities = []
    for q in t.tables("inequalities", COMMON_KEYS["constraints.inequalities"]):
        query = parse_query(q, ("marginal", "total", "identity", "prefix"))
        if "lower" not in q.raw and "upper" not in q.raw:
            raise q.error((), "give lower, upper or both")
        inequalities.append(InequalitySpec(q.str("name", default=query.describe()), query,
                                           q.bound("lower"), q.bound("upper"), q.path_))
    zero_records = t.str("structural_zero_records", default="error", choices=ZERO_RECORD_CHOICES)
    if "structural_zero_records" in t.raw and not zeros:
        raise t.error(("structural_zero_records",), "applies only when structural_zeros are declared")
    return ConstraintsSpec(
        nonnegative=t.bool("nonnegative", default=False),
        integer=t.bool("integer", default=False),
        structural_zeros=tuple(zeros), hierarchy=tuple(hierarchy),
        invariants=tuple(invariants), inequalities=tuple(inequalities),
        structural_zero_records=zero_records,
    )


def parse_output(t: SpecTable, constraints: ConstraintsSpec) -> OutputSpec:
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
        marginals_layout=t.str("marginals_layout", default="auto", choices=MARGINALS_LAYOUTS),
        cells=t.str("cells", default="all", choices=CELL_CHOICES),
    )


def parse_reconstruct(t: SpecTable, objective: str | None = None) -> ReconstructSpec:
    """``[reconstruct]``: the objective (unless fixed by ``objective``), an installed backend for
    it (the estimate layer's one backend policy), and a time limit."""
    from dpopt.estimate import OBJECTIVES as ENGINE_OBJECTIVES
    from dpopt.estimate import backends_for, installed_backends, installed_backends_for

    if objective is None:
        objective = t.str("objective", default="l2", choices=ENGINE_OBJECTIVES)
    backend = t.str("backend", default=None)
    if backend is not None:
        installed = installed_backends_for(objective)
        if backend not in installed:
            why = "is not installed" if backend in backends_for(objective) else f"is not a backend for objective {objective!r}"
            raise t.error(("backend",), f"backend {backend!r} {why}; installed backends for {objective!r}: "
                          f"{installed} (all installed: {installed_backends()})")
    time_limit = t.float("time_limit", default=None, positive=True)
    return ReconstructSpec(objective, backend, time_limit)
