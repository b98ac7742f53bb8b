"""The release pipeline behind ``dpopt run``: plan → load → constrain → measure → reconstruct → report.

Each step is a function that can be called on its own::

    spec = load_spec("models/quickstart.toml")      # parse + validate the structure
    p = plan(spec)                                   # public objects; constraints checked; no data
    data = load_data(p)                              # the confidential records
    constraints = build_constraints(p, data)         # + invariants published from the data; checked
    measurements, accountant, rng = measure(p, data) # budget charged, exact noise drawn
    result = reconstruct_table(p, measurements, constraints)   # consistency solve + rounding
    table = released_table(p, result.x)              # labelled cells + count
    people = synthesize(p.domain, counts)            # one row per person

or all at once with :func:`run`, which also builds the report and, given ``out``, writes
everything atomically (a failed run leaves nothing behind).

Order matters for privacy and for the "nothing written" promise: the whole spec is
validated and the public constraints are checked before any data is read; constraints
that take values from the data are checked right after computing them and still before
any noise is drawn; each mechanism charges the accountant before it samples; outputs are
written to a temporary directory that replaces the target only when everything succeeded.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from dpopt.atomic import atomic_directory, check_output_dir
from dpopt.errors import DataError, DpoptError, InconsistentConstraintsError, SolverError, SpecError
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset, cells_frame, decode_codes
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.spec import QuerySpec, ReleaseSpec, data_format, load_spec

__all__ = [
    "ReleasePlan", "PlannedMeasure", "ReleaseResult", "load_spec", "plan", "load_data",
    "build_constraints", "measure", "reconstruct_table", "released_table", "released_marginals",
    "synthesize", "evaluate_release", "write_release", "run",
]


# ---- plan -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PlannedMeasure:
    """One measurement to take: its query, mechanism, budget and the noise it will get.

    ``budget`` is the measurement's exact part of the total, in the accountant's currency;
    ``sensitivity`` the L1 sensitivity (Laplace) or the squared L2 sensitivity (Gaussian);
    ``stddev`` the standard deviation of the noise on each answer (exact discrete law),
    known before any data is read.
    """

    label: str
    query: LinearQuery
    mechanism: str
    share: Fraction
    budget: PrivacyCost
    sensitivity: float
    noise: str
    scale: float
    variance: float
    path: tuple = ()

    @property
    def stddev(self) -> float:
        return float(np.sqrt(self.variance))


@dataclass(eq=False)
class ReleasePlan:
    """Everything public about a release, built and checked before any data is read.

    Attributes
    ----------
    spec : ReleaseSpec
    domain : Domain
    measures : list of PlannedMeasure
    constraints : ConstraintSet
        The public constraints (invariants from the data are added by
        :func:`build_constraints` once the data are read).
    data_invariants : list of (name, LinearQuery, spec path)
        Invariants whose values will be published exactly from the data (not private).
    data_source : str
        ``"example"``, ``"file"`` or ``"given"`` (a DataFrame or Dataset passed in).
    data_path : Path or None
    seed : int or None
        Seed of the noise (``None``: a cryptographically secure source). Seeded runs are NOT private.
    out : Path or None
    """

    spec: ReleaseSpec
    domain: Domain
    measures: list[PlannedMeasure]
    constraints: ConstraintSet
    data_invariants: list[tuple[str, LinearQuery, tuple]]
    data_source: str
    data_path: Path | None
    data_format: str | None
    data_given: Any = field(default=None, repr=False)
    seed: int | None = None
    out: Path | None = None
    overwrite: bool = False
    algorithm_plan: Any = field(default=None, repr=False)

    def new_accountant(self) -> Accountant:
        """A fresh accountant holding the spec's total budget."""
        return _accountant(self.spec)

    def budget_frame(self) -> pd.DataFrame:
        """The budget split: one row per measurement, exact shares and noise per answer."""
        kind = self.spec.privacy.accounting
        comps = ("rho",) if kind == "zcdp" else ("epsilon", "delta") if kind == "approx" else ("epsilon",)
        rows = []
        for m in self.measures:
            row = {"label": m.label, "query": m.query.name, "answers": m.query.num_rows,
                   "mechanism": m.mechanism, "share": str(m.share)}
            for c in comps:
                row[c] = str(getattr(m.budget, c))
            row.update({"sensitivity": m.sensitivity, "noise": m.noise, "noise_stddev": m.stddev})
            rows.append(row)
        return pd.DataFrame(rows)

    def describe(self) -> str:
        """The plan as text (what ``dpopt check`` prints)."""
        spec = self.spec
        lines = [f"release {spec.name!r}" + (f" ({spec.source})" if spec.source else "")]
        if spec.description:
            lines.append(f"  {spec.description}")
        dom = self.domain
        lines.append(f"domain: {len(dom)} attributes, {dom.size:,} cells")
        for a in dom.attrs:
            labels = dom.labels_of(a)
            shown = ", ".join(map(str, labels[:6])) + (", ..." if len(labels) > 6 else "")
            lines.append(f"  {a} ({dom.size_of(a)}): {shown}")
        if self.data_source == "example":
            lines.append(f"data: generated example ({spec.data.rows:,} rows, data seed {spec.data.seed})")
        elif self.data_source == "given":
            lines.append("data: given in Python")
        else:
            lines.append(f"data: {self.data_path} ({self.data_format}"
                         + (f", count column {spec.data.count_column!r}" if spec.data.count_column else "") + ")")
        lines.append(f"privacy: {_budget_text(spec)}")
        if self.seed is not None:
            lines.append(f"  noise seed {self.seed}: seeded, NOT private (for testing only)")
        if self.measures:
            frame = self.budget_frame().drop(columns=["query", "sensitivity", "noise"])
            frame["noise_stddev"] = frame["noise_stddev"].map(lambda v: f"{v:.2f}")
            lines.append("budget split (noise_stddev: standard deviation of the noise on each answer):")
            lines.extend("  " + line for line in _text_table(frame))
        else:
            lines.append(f"algorithm: {spec.algorithm.describe()}")
            lines.extend("  " + line for line in _describe_algorithm_plan(self))
        lines.append("constraints:")
        for row in self.constraints.describe():
            lines.append(f"  {row['constraint']}: {row['detail']}")
        for name, query, _ in self.data_invariants:
            lines.append(f"  invariant:{name}: {query.name} with {query.num_rows} rows "
                         "(to be published exactly from the data, not private)")
        rc = spec.reconstruct
        if spec.algorithm.name == "mwem":
            lines.append("reconstruct: multiplicative weights within MWEM"
                         + (", then exact integer rounding keeping the total" if spec.constraints.integer else ""))
        else:
            lines.append(f"reconstruct: objective {rc.objective}, backend {rc.backend or 'default'}"
                         + (f", time limit {rc.time_limit:g} s" if rc.time_limit else "")
                         + (", then exact integer rounding" if spec.constraints.integer else ""))
        out = spec.output
        parts = [f"tables as {', '.join(out.formats) or 'no files'}"]
        if out.synthetic:
            parts.append("synthetic microdata")
        if out.summary:
            parts.append(f"summary as {', '.join(out.summary)}")
        if out.plots:
            parts.append("plots")
        lines.append("outputs: " + "; ".join(parts) + (f" into {self.out}" if self.out else ""))
        return "\n".join(lines)


def plan(
    spec: "str | Path | Mapping | ReleaseSpec",
    *,
    data: Any = None,
    seed: int | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
) -> ReleasePlan:
    """Build and check every public part of a release. Reads no data.

    Parameters
    ----------
    spec
        A spec (path, built-in name, dict or :class:`ReleaseSpec`).
    data
        Overrides the spec's data source: a CSV/Parquet path (must exist), a DataFrame or a
        :class:`~dpopt.model.data.Dataset`.
    seed
        Seed of the privacy noise (overrides ``privacy.seed``). Seeded runs are NOT private.
    out, overwrite
        Output directory, checked now (it must be absent or empty unless ``overwrite``).

    Raises
    ------
    SpecError, InconsistentConstraintsError, OutputExistsError
        Naming the spec key (or option) at fault.
    """
    spec = load_spec(spec)
    domain = _build_domain(spec)
    default = spec.algorithm.name == "measure-and-reconstruct"
    measures = _plan_measures(spec, domain) if default else []
    algorithm_plan = None if default else _plan_algorithm(spec, domain)
    constraints, data_invariants = _public_constraints(spec, domain)
    _check_constraints(spec, constraints, when="before reading any data")
    source, path, fmt, given = _plan_data(spec, data, domain)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise SpecError(f"--seed: must be a non-negative integer, got {seed!r}")
    seed = spec.privacy.seed if seed is None else int(seed)
    out_path = None
    if out is not None:
        out_path = check_output_dir(out, overwrite=overwrite)
    return ReleasePlan(spec, domain, measures, constraints, data_invariants, source, path, fmt,
                       given, seed, out_path, overwrite, algorithm_plan)


def _build_domain(spec: ReleaseSpec) -> Domain:
    d = spec.domain
    try:
        if d.builtin == "census":
            from dpopt.datasets.census import census_domain

            domain = census_domain(d.states, d.counties_per_state)
        elif d.json is not None:
            domain = Domain.from_json(d.json)
        else:
            domain = Domain.from_dict(dict(d.attributes))
        domain.require_dense("a release over the full domain")
    except (DpoptError, OSError, ValueError) as exc:
        raise spec.error(("domain",), _plain(exc)) from None
    return domain


def build_query(spec: ReleaseSpec, q: QuerySpec, domain: Domain) -> list[tuple[str, LinearQuery]]:
    """The query (or, for ``all_marginals``, the queries) a spec entry names, with name suffixes."""
    from dpopt.model.queries.basic import Identity, Total
    from dpopt.model.queries.marginal import Marginal, all_marginals

    key = {"marginal": "attrs", "all_marginals": "k", "prefix": "attr"}.get(q.kind, "query")
    try:
        if q.kind == "marginal":
            return [("", Marginal(domain, q.attrs))]
        if q.kind == "total":
            return [("", Total(domain))]
        if q.kind == "identity":
            return [("", Identity(domain))]
        if q.kind == "all_marginals":
            return [(f": {', '.join(m.attrs)}", m) for m in all_marginals(domain, q.k)]
        if q.kind == "prefix":
            from dpopt.model.queries.ranges import Prefix

            return [("", Prefix(domain, q.attr))]
    except (DpoptError, ValueError) as exc:
        raise spec.error(q.path + (key,), _plain(exc)) from None
    raise spec.error(q.path + ("query",), f"unknown query kind {q.kind!r}")  # pragma: no cover


def _accountant(spec: ReleaseSpec) -> Accountant:
    p = spec.privacy
    try:
        if p.accounting == "pure":
            return Accountant.pure(p.epsilon)
        if p.accounting == "approx":
            return Accountant.approx(p.epsilon, p.delta)
        if p.rho is not None:
            return Accountant.zcdp(p.rho)
        return Accountant.zcdp_from_approx(p.epsilon, p.delta)
    except DpoptError as exc:
        raise spec.error(("privacy",), _plain(exc)) from None


def _plan_measures(spec: ReleaseSpec, domain: Domain) -> list[PlannedMeasure]:
    from dpopt.privacy.conversions import approx_dp_to_zcdp
    from dpopt.privacy.samplers import discrete_gaussian_variance, discrete_laplace_variance

    entries = []  # (label, query, mechanism, share, path)
    for m in spec.measures:
        queries = build_query(spec, m.query, domain)
        for suffix, query in queries:
            entries.append((m.label + suffix, query, m.mechanism, m.share / len(queries), m.path))
    labels = [e[0] for e in entries]
    if len(set(labels)) != len(labels):
        dup = next(lab for lab in labels if labels.count(lab) > 1)
        raise spec.error(("measure",), f"two measurements are labelled {dup!r}; give distinct labels")
    budgets = _accountant(spec).split({e[0]: e[3] for e in entries}, of="total")
    planned = []
    for label, query, mechanism, share, path in entries:
        budget = budgets[label]
        if not query.is_integer:  # the preview below assumes integer answers (no rounding grid)
            raise spec.error(path + ("query",), f"{query.name} is not an integer query")  # pragma: no cover
        if mechanism == "laplace":
            sens = Fraction(query.sensitivity(1))
            scale = sens / budget.epsilon
            variance = discrete_laplace_variance(scale)
            noise = "discrete_laplace"
        else:
            rho = budget.rho if spec.privacy.accounting == "zcdp" else approx_dp_to_zcdp(budget.epsilon, budget.delta)
            sens = Fraction(query.squared_l2_sensitivity())
            sigma2 = sens / (2 * rho)
            scale = Fraction(np.sqrt(float(sigma2)))
            variance = discrete_gaussian_variance(sigma2)
            noise = "discrete_gaussian"
        planned.append(PlannedMeasure(label, query, mechanism, share, budget, float(sens), noise,
                                      float(scale), float(variance), path))
    return planned


def _public_constraints(spec: ReleaseSpec, domain: Domain):
    cs = ConstraintSet(domain)
    c = spec.constraints
    if c.nonnegative:
        cs.add(NonNegativity())
    if c.integer:
        cs.add(Integrality())
    for i, z in enumerate(c.structural_zeros):
        try:
            if z.builtin:
                from dpopt.datasets.census import structural_zero_rules

                for j, (predicate, reason) in enumerate(structural_zero_rules(domain)):
                    cs.add(StructuralZeros(predicate, name=f"census rule {j + 1}", reason=reason))
            else:
                cs.add(StructuralZeros(z.where, name=z.name or f"rule {i + 1}", reason=z.reason))
        except (DpoptError, ValueError, SyntaxError) as exc:
            raise spec.error(z.path + (() if z.builtin else ("where",)), _plain(exc), _error_class(exc)) from None
    for h in c.hierarchy:
        try:
            parent_of = h.parent_of
            if parent_of is None:
                from dpopt.datasets.census import county_parent

                if (h.parent, h.child) != ("state", "county"):
                    raise SpecError("the built-in geography links parent 'state' and child 'county'")
                parent_of = county_parent(domain)
            else:
                parent_of = {_value(domain, h.child, k): _value(domain, h.parent, v) for k, v in parent_of.items()}
            cs.add(Hierarchy(h.parent, h.child, parent_of, name=h.name))
        except (DpoptError, ValueError) as exc:
            raise spec.error(h.path, _plain(exc), _error_class(exc)) from None
    data_invariants = []
    for inv in c.invariants:
        (_, query), = build_query(spec, inv.query, domain)
        if inv.from_data:
            data_invariants.append((inv.name, query, inv.path))
            continue
        try:
            cs.add(Invariant(query, np.asarray(inv.values, dtype=float), name=inv.name))
        except (DpoptError, ValueError) as exc:
            raise spec.error(inv.path + ("values",), _plain(exc), _error_class(exc)) from None
    for q in c.inequalities:
        (_, query), = build_query(spec, q.query, domain)
        lower = -np.inf if q.lower is None else np.asarray(q.lower, dtype=float)
        upper = np.inf if q.upper is None else np.asarray(q.upper, dtype=float)
        try:
            cs.add(LinearInequality(query, lower, upper, name=q.name))
        except (DpoptError, ValueError) as exc:
            raise spec.error(q.path, _plain(exc), _error_class(exc)) from None
    return cs, data_invariants


def _check_constraints(spec: ReleaseSpec, constraints: ConstraintSet, when: str) -> None:
    try:
        constraints.check()
    except InconsistentConstraintsError as exc:
        raise spec.error(("constraints",), f"{_plain(exc)} ({when})", InconsistentConstraintsError) from None


def _plan_data(spec: ReleaseSpec, data: Any, domain: Domain):
    if data is None:
        if spec.data.source == "example":
            return "example", None, None, None
        if spec.data.path is None:
            raise spec.error(("data", "path"), "no data file given: set data.path in the spec or pass --data PATH")
        return "file", spec.data.path, spec.data.format, None
    if isinstance(data, (pd.DataFrame, Dataset)):
        if isinstance(data, Dataset) and data.domain != domain:
            raise SpecError(f"data: the given Dataset is over {data.domain}, not the spec's domain {domain}")
        return "given", None, None, data
    if isinstance(data, (str, Path)):
        path = Path(data).expanduser()
        if not path.is_file():
            raise SpecError(f"--data: file {str(data)!r} does not exist")
        fmt = spec.data.format if spec.data.source == "file" and spec.data.format else data_format(path, "--data")
        return "file", path.absolute(), fmt, None
    raise SpecError(f"--data: expected a file path, a DataFrame or a Dataset, got {type(data).__name__}")


# ---- data and constraints -----------------------------------------------------------------------


def load_data(p: ReleasePlan) -> Dataset:
    """Read (or generate) the confidential records of a planned release."""
    spec, domain = p.spec, p.domain
    if p.data_source == "given":
        d = p.data_given
        return d if isinstance(d, Dataset) else _wrap_data(spec, lambda: Dataset.from_frame(d, domain), "data")
    if p.data_source == "example":
        from dpopt.datasets.census import generate_census

        df = generate_census(spec.data.rows, num_states=spec.domain.states,
                             counties_per_state=spec.domain.counties_per_state, seed=spec.data.seed)
        return Dataset.from_frame(df, domain)
    kwargs = {"weight_column": spec.data.count_column} if spec.data.count_column else {}
    reader = Dataset.from_csv if p.data_format == "csv" else Dataset.from_parquet
    return _wrap_data(spec, lambda: reader(p.data_path, domain, **kwargs), str(p.data_path))


def _wrap_data(spec: ReleaseSpec, read, what: str) -> Dataset:
    try:
        return read()
    except DpoptError as exc:
        raise type(exc)(f"data {what}: {_plain(exc)}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"data {what}: cannot be read: {exc}") from None


def build_constraints(p: ReleasePlan, data: Dataset) -> ConstraintSet:
    """The plan's public constraints plus the invariants published from the data, checked.

    Runs before any noise is drawn: an inconsistency stops the release with nothing spent.
    """
    if not p.data_invariants:
        return p.constraints
    cs = ConstraintSet(p.domain, list(p.constraints.constraints))
    for name, query, path in p.data_invariants:
        try:
            cs.invariant_from_data(query, data, name)
        except DpoptError as exc:
            raise p.spec.error(path, _plain(exc), _error_class(exc)) from None
    _check_constraints(p.spec, cs, when="with the invariants computed from the data, before any noise")
    return cs


# ---- measurement ---------------------------------------------------------------------------------


def measure(
    p: ReleasePlan,
    data: Dataset,
    *,
    accountant: Accountant | None = None,
    rng=None,
    progress=None,
) -> tuple[list[Measurement], Accountant, Any]:
    """Take every planned measurement: charge the budget, then add exact noise.

    Returns the measurements, the accountant (its ledger sums exactly to what was spent)
    and the random source (``rng.is_private`` is False for seeded runs).
    """
    from dpopt.privacy.mechanisms import gaussian_mechanism, laplace_mechanism
    from dpopt.privacy.randomness import make_random

    accountant = accountant or p.new_accountant()
    rng = rng or make_random(p.seed)
    kind = p.spec.privacy.accounting
    out = []
    for m in p.measures:
        if progress is not None:
            progress.set_postfix_str(m.label[:40])
        if m.mechanism == "laplace":
            out.append(laplace_mechanism(m.query, data, m.budget.epsilon, accountant, rng, label=m.label))
        elif kind == "zcdp":
            out.append(gaussian_mechanism(m.query, data, accountant, rng, rho=m.budget.rho, label=m.label))
        else:
            out.append(gaussian_mechanism(m.query, data, accountant, rng, epsilon=m.budget.epsilon,
                                          delta=m.budget.delta, label=m.label))
        if progress is not None:
            progress.update(1)
    return out, accountant, rng


# ---- reconstruction and outputs --------------------------------------------------------------------


def reconstruct_table(p: ReleasePlan, measurements: list[Measurement], constraints: ConstraintSet):
    """Solve the consistency problem (and round to integers when declared).

    Returns the :class:`~dpopt.estimate.result.Result`; raises :class:`SolverError` naming
    the ``reconstruct`` section when the solve (or the rounding) does not succeed, since a
    release must not publish an unsolved estimate.
    """
    from dpopt.estimate import reconstruct

    rc = p.spec.reconstruct
    try:
        result = reconstruct(measurements, constraints, rc.objective, backend=rc.backend, time_limit=rc.time_limit)
    except DpoptError as exc:
        raise p.spec.error(("reconstruct",), _plain(exc), type(exc)) from None
    if not result.success or result.x is None:
        status = getattr(result.status, "name", result.status)
        raise p.spec.error(("reconstruct",), f"the {rc.objective} solve ({result.backend}) ended with status "
                           f"{status}: {result.message}", SolverError)
    return result


def released_counts(p: ReleasePlan, x: np.ndarray) -> np.ndarray:
    """The released cell values: int64 when the release is integral, else float."""
    if p.spec.constraints.integer:
        counts = np.rint(x)
        if np.abs(counts - x).max(initial=0.0) > 1e-6:
            raise SolverError("the rounded release is not integral")  # pragma: no cover - guarded by rounding
        return counts.astype(np.int64)
    return np.asarray(x, dtype=np.float64)


def released_table(p: ReleasePlan, counts: np.ndarray) -> pd.DataFrame:
    """Labelled cells with their released ``count`` (every cell, or the non-zero ones)."""
    frame = cells_frame(p.domain, counts)
    if p.spec.output.cells == "nonzero":
        frame = frame[frame["count"] != 0].reset_index(drop=True)
    return frame


def released_marginals(measurements: list[Measurement], counts: np.ndarray) -> dict[str, pd.DataFrame]:
    """For each measured query: its released answers (``count``) next to the noisy ones (``noisy``)."""
    from dpopt.model.queries.marginal import Marginal

    out = {}
    for m in measurements:
        released = m.query.matvec(counts)
        if isinstance(m.query, Marginal):
            frame = cells_frame(m.query.marginal_domain, released)
        else:
            frame = pd.DataFrame({"row": m.query.row_labels(), "count": released})
        noisy = m.values
        frame["noisy"] = noisy.astype(np.int64) if np.array_equal(noisy, np.round(noisy)) else noisy
        out[m.label] = frame
    return out


def synthesize(domain: Domain, counts: np.ndarray) -> pd.DataFrame:
    """Integer synthetic microdata: one row per person, ``counts[c]`` rows for cell ``c``.

    The number of rows equals ``counts.sum()``; every marginal of the rows equals the
    released table's. Built with ``np.repeat`` (no loop over cells).
    """
    counts = np.asarray(counts)
    if counts.dtype.kind not in "iu" or (counts < 0).any():
        raise DataError("synthetic microdata need non-negative integer counts")
    cells = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return decode_codes(domain.unravel(cells), domain)


def evaluate_release(p: ReleasePlan, data: Dataset, counts: np.ndarray, measurements: list[Measurement],
             constraints: ConstraintSet) -> tuple[pd.DataFrame, dict, dict[str, np.ndarray]]:
    """Errors of the release against the confidential data. NOT private: for testing only.

    Rows: every measured query (L1 error of the released answers and of the raw noisy
    answers), every invariant, and every 1- and 2-way marginal (held-out workload when not
    measured). Summary: total variation distance and L1 error of the full table.
    """
    from itertools import combinations

    from dpopt.model.queries.marginal import Marginal

    truth = data.histogram().astype(np.float64)
    x = np.asarray(counts, dtype=np.float64)
    n_true = float(truth.sum())
    rows = []
    truths = {}

    def add(kind, label, query, noisy=None):
        t = query.answer(data).astype(np.float64)
        if kind == "measured":
            truths[label] = t
        r = query.matvec(x)
        row = {"kind": kind, "query": label, "answers": query.num_rows,
               "l1_error": float(np.abs(r - t).sum()), "max_abs_error": float(np.abs(r - t).max()),
               "relative_l1": float(np.abs(r - t).sum() / max(n_true, 1.0)),
               "noisy_l1_error": float(np.abs(noisy - t).sum()) if noisy is not None else float("nan")}
        rows.append(row)

    measured = set()
    for m in measurements:
        add("measured", m.label, m.query, m.values)
        if isinstance(m.query, Marginal):
            measured.add(m.query.attrs)
    for inv in constraints.invariants:
        add("invariant", inv.name, inv.query)
    for k in (1, 2):
        if k > len(p.domain):
            continue
        for attrs in combinations(p.domain.attrs, k):
            if attrs not in measured:
                add(f"{k}-way marginal", ", ".join(attrs), Marginal(p.domain, attrs))
    frame = pd.DataFrame(rows)
    total_released = float(x.sum())
    tv = 0.5 * float(np.abs(x / max(total_released, 1.0) - truth / max(n_true, 1.0)).sum())
    summary = {
        "records": int(n_true),
        "released_total": total_released,
        "l1_full_table": float(np.abs(x - truth).sum()),
        "total_variation": tv,
        "mean_relative_l1_measured": float(frame.loc[frame["kind"] == "measured", "relative_l1"].mean()),
    }
    return frame, summary, truths


@dataclass(eq=False)
class ReleaseResult:
    """What :func:`run` returns.

    Attributes
    ----------
    plan : ReleasePlan
    measurements : list of Measurement
    accountant : Accountant
    constraints : ConstraintSet
        Every constraint, invariants from the data included.
    reconstruction : dpopt.estimate.Result
        The consistency solve (with ``info["rounding"]`` when rounded).
    counts : ndarray
        The released cell values, over ``plan.domain`` (int64 when integral).
    table : DataFrame
        Labelled cells and ``count``.
    marginals : dict of str to DataFrame
        Released (``count``) and noisy (``noisy``) answers of each measured query.
    synthetic : DataFrame or None
        One row per person when the release is integral and synthetic output is on.
    evaluation, evaluation_summary : DataFrame, dict or None
        Errors against the confidential data (``evaluate=True`` only; NOT private).
    evaluation_truth : dict of str to ndarray or None
        True answers of each measured query (``evaluate=True`` only; NOT private).
    report : dict
        The JSON report.
    out : Path or None
        Where the release was written.
    timings : dict of str to float
        Seconds per step.
    """

    plan: ReleasePlan
    measurements: list[Measurement]
    accountant: Accountant
    constraints: ConstraintSet
    reconstruction: Any
    counts: np.ndarray
    table: pd.DataFrame
    marginals: dict[str, pd.DataFrame]
    synthetic: pd.DataFrame | None
    evaluation: pd.DataFrame | None
    evaluation_summary: dict | None
    random_description: str
    random_is_private: bool
    timings: dict[str, float]
    evaluation_truth: dict[str, np.ndarray] | None = field(default=None, repr=False)
    report: dict = field(default_factory=dict)
    out: Path | None = None

    @property
    def spec(self) -> ReleaseSpec:
        return self.plan.spec

    @property
    def ledger(self) -> pd.DataFrame:
        """The privacy ledger (exact Fractions; each column sums to the amount spent)."""
        return self.accountant.ledger_frame()

    @property
    def constraint_residuals(self) -> pd.DataFrame:
        """Every constraint's largest violation by the released table."""
        rows = self.constraints.residuals(np.asarray(self.counts, dtype=np.float64))
        return pd.DataFrame(rows, columns=["constraint", "max_violation", "satisfied"])


def run(
    spec: "str | Path | Mapping | ReleaseSpec",
    data: Any = None,
    out: str | Path | None = None,
    seed: int | None = None,
    evaluate: bool = False,
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> ReleaseResult:
    """Run a whole release: validate, read, check, measure, reconstruct, report, write.

    Parameters
    ----------
    spec
        TOML path, built-in name (``"quickstart"``), dict or :class:`ReleaseSpec`.
    data
        Overrides the spec's data: a CSV/Parquet path, a DataFrame or a Dataset.
    out
        Directory to write the release to (atomically). None: write nothing.
    seed
        Seed of the privacy noise. A seeded run is reproducible and NOT private; the
        report says so.
    evaluate
        Also compare the release with the confidential data (NOT private; for testing).
    overwrite
        Replace an existing non-empty ``out``.
    progress
        Show a progress bar (tqdm) on stderr.

    Returns
    -------
    ReleaseResult
    """
    from tqdm import tqdm

    from dpopt.report import build_report

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    p = plan(spec, data=data, seed=seed, out=out, overwrite=overwrite)
    lap("plan")
    steps = 6 + len(p.measures) + (1 if evaluate else 0) + (1 if out is not None else 0)
    with tqdm(total=steps, desc="dpopt", unit="step", disable=not progress, file=sys.stderr, leave=False) as bar:
        def step(name: str) -> None:
            bar.set_description(name)

        step("reading data")
        data_set = load_data(p)
        bar.update(1)
        lap("load data")
        step("checking constraints")
        constraints = build_constraints(p, data_set)
        bar.update(1)
        lap("constraints")
        notes: dict | None = None
        if p.algorithm_plan is None:
            step("measuring")
            measurements, accountant, rng = measure(p, data_set, progress=bar)
            lap("measure")
            step("reconstructing")
            result = reconstruct_table(p, measurements, constraints)
            bar.update(1)
            lap("reconstruct")
            counts = released_counts(p, result.x)
            marginals = released_marginals(measurements, counts)
        else:
            step(f"running {p.spec.algorithm.name}")
            measurements, accountant, rng, result, counts, marginals, notes = run_algorithm(p, data_set, constraints)
            bar.update(1 + len(p.measures))
            lap(p.spec.algorithm.name)
        step("synthesizing")
        table = released_table(p, counts)
        synthetic = synthesize(p.domain, counts) if p.spec.output.synthetic else None
        bar.update(1)
        lap("tables")
        evaluation = evaluation_summary = truths = None
        if evaluate:
            step("evaluating")
            evaluation, evaluation_summary, truths = evaluate_release(p, data_set, counts, measurements, constraints)
            bar.update(1)
            lap("evaluate")
        release = ReleaseResult(
            p, measurements, accountant, constraints, result, counts, table, marginals, synthetic,
            evaluation, evaluation_summary, rng.description, rng.is_private, timings, truths,
        )
        step("reporting")
        release.report = build_report(release)
        if notes is not None:
            release.report["algorithm"] = notes
        bar.update(1)
        lap("report")
        if out is not None:
            step("writing")
            release.out = write_release(release, out, overwrite=overwrite)
            bar.update(1)
            lap("write")
        bar.update(1)
    release.report["timings"] = dict(timings)
    return release


def write_release(release: ReleaseResult, out: str | Path, *, overwrite: bool = False) -> Path:
    """Write a release into ``out`` atomically (all files or none).

    Layout: ``release.{csv,parquet}`` (the table), ``marginals/<label>.{csv,parquet}``,
    ``synthetic.{csv,parquet}``, ``plots/*.png``, ``report.json``, ``summary.{md,html}``.
    """
    from dpopt.report import render_html, render_markdown, write_json

    spec = release.spec
    formats = spec.output.formats
    with atomic_directory(out, overwrite=overwrite) as tmp:
        files = []

        def write_frame(frame: pd.DataFrame, stem: str) -> None:
            for fmt in formats:
                target = tmp / f"{stem}.{fmt}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if fmt == "csv":
                    frame.to_csv(target, index=False)
                else:
                    frame.to_parquet(target, index=False)
                files.append(f"{stem}.{fmt}")

        write_frame(release.table, "release")
        if spec.output.marginals:
            used: set[str] = set()
            for label, frame in release.marginals.items():
                name, k = slug(label), 2
                while name in used:  # labels that differ only in punctuation get distinct files
                    name, k = f"{slug(label)}_{k}", k + 1
                used.add(name)
                write_frame(frame, f"marginals/{name}")
        if release.synthetic is not None:
            write_frame(release.synthetic, "synthetic")
        plots = {}
        if spec.output.plots:
            from dpopt.plots import release_plots

            plots = release_plots(release, tmp / "plots")
            files.extend(f"plots/{name}" for name in plots.values())
        report = dict(release.report)
        report["files"] = files + ["report.json"] + [f"summary.{f}" for f in spec.output.summary]
        report["plots"] = {k: f"plots/{v}" for k, v in plots.items()}
        report["timings"] = dict(release.timings)
        release.report = report
        write_json(report, tmp / "report.json")
        notes = _algorithm_markdown(report)
        if "md" in spec.output.summary:
            (tmp / "summary.md").write_text(render_markdown(report) + notes, encoding="utf-8")
        if "html" in spec.output.summary:
            html = render_html(report)
            if notes:
                from html import escape

                section = "<h2>Algorithm</h2>\n<pre>" + escape(notes.split("\n", 2)[-1].strip()) + "</pre>\n"
                html = html.replace("</body>", section + "</body>", 1) if "</body>" in html else html + section
            (tmp / "summary.html").write_text(html, encoding="utf-8")
    return Path(out)


def slug(label: str) -> str:
    """A file-name-safe version of a label (``"county x sex"`` → ``"county_x_sex"``)."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in label.strip())
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "query"


# ---- the landed algorithms: Barak et al. (Fourier) and MWEM ---------------------------------------
# A spec with algorithm = "barak" or "mwem" replaces the measure and reconstruct steps: the
# algorithm spends the whole budget itself (one accountant, so the ledger still sums exactly
# to the budget) and returns a table over the spec's domain; tables, synthetic data, report
# and plots are then built as for the default pipeline.


def _plan_algorithm(spec: ReleaseSpec, domain: Domain):
    """The public plan of a landed algorithm: the Fourier plan (Barak) or the workload (MWEM)."""
    alg = spec.algorithm
    key = (alg.section, "marginals")
    if alg.name == "barak":
        from dpopt.algorithms.barak import fourier_plan

        try:
            return fourier_plan(domain, alg.marginals)
        except DpoptError as exc:
            raise spec.error(key, _plain(exc).removeprefix("fourier_plan: ")) from None
    from dpopt.model.queries.marginal import Marginal, all_marginals

    try:
        if isinstance(alg.marginals, int):
            if alg.marginals > len(domain):
                raise SpecError(f"order {alg.marginals} exceeds the {len(domain)} attributes of the domain")
            return list(all_marginals(domain, alg.marginals))
        return [Marginal(domain, attrs) for attrs in alg.marginals]
    except (DpoptError, ValueError) as exc:
        raise spec.error(key, _plain(exc)) from None


def _describe_algorithm_plan(p: ReleasePlan) -> list[str]:
    alg, ap = p.spec.algorithm, p.algorithm_plan
    if alg.name == "barak":
        noise = "discrete Laplace" if p.spec.privacy.accounting == "pure" else "discrete Gaussian"
        lines = [f"one measurement of the |B| = {ap.closure_size} unnormalised parities of the downward closure "
                 f"of {len(ap.marginals)} marginals, {noise} noise, the whole budget"]
        if ap.encoding is not None:
            lines.append(f"non-binary attributes binary-encoded: {len(ap.domain)} bits, {ap.domain.size:,} binary cells")
        return lines
    return [f"workload: {len(ap)} marginals, {sum(q.num_rows for q in ap):,} queries; {alg.rounds} rounds, "
            "each split equally between selection and measurement",
            "the record count is treated as public (Hardt, Ligett, McSherry 2012)"]


def run_algorithm(p: ReleasePlan, data: Dataset, constraints: ConstraintSet):
    """Run the spec's landed algorithm (``barak`` or ``mwem``) on the confidential data.

    Returns ``(measurements, accountant, rng, result, counts, marginals, notes)``: the
    measurements over ``p.domain``, the accountant (charged the whole budget), the random
    source, a :class:`~dpopt.estimate.result.Result` describing the solve for the report,
    the released counts (int64 when integral), the released marginals and the report's
    ``algorithm`` section.
    """
    from dpopt.privacy.randomness import make_random

    accountant = p.new_accountant()
    rng = make_random(p.seed)
    if p.spec.algorithm.name == "barak":
        return (*_run_barak(p, data, constraints, accountant, rng),)
    return (*_run_mwem(p, data, constraints, accountant, rng),)


def _privacy_arguments(p: ReleasePlan, accountant: Accountant) -> dict:
    """The whole budget as keyword arguments (zCDP from (epsilon, delta) as its rho)."""
    priv = p.spec.privacy
    if priv.accounting == "pure":
        return {"epsilon": priv.epsilon}
    if priv.accounting == "approx":
        return {"epsilon": priv.epsilon, "delta": priv.delta}
    return {"rho": accountant.total.rho}


def _run_barak(p: ReleasePlan, data: Dataset, constraints: ConstraintSet, accountant: Accountant, rng):
    from dpopt.algorithms.barak import fourier_consistency, measure_fourier
    from dpopt.estimate.result import Result
    from dpopt.model.queries.explicit import SparseQuery

    spec, fplan, alg = p.spec, p.algorithm_plan, p.spec.algorithm
    try:
        m = measure_fourier(fplan, data, accountant, rng, label="fourier parities", **_privacy_arguments(p, accountant))
        rel = fourier_consistency(fplan, m, alg.method, constraints, integer=spec.constraints.integer,
                                  accountant=accountant, backend=spec.reconstruct.backend,
                                  time_limit=spec.reconstruct.time_limit)
    except DpoptError as exc:
        raise spec.error(("barak",), _plain(exc), type(exc)) from None
    if not rel.success or rel.counts is None:
        raise spec.error(("barak", "method"), f"the {alg.method} consistency solve ended with status "
                         f"{rel.status}: {rel.message}", SolverError)
    counts = np.asarray(rel.counts)
    if not spec.constraints.integer:
        counts = counts.astype(np.float64)
    if fplan.encoding is not None:
        # The parities live on the binary encoding; as a query of the source cells they are
        # Q P (P maps each source cell to its code), so the report, plots and evaluation can
        # compare them with the released table over the spec's domain.
        lifted = SparseQuery(p.domain, fplan.query.to_sparse().tocsc()[:, fplan.encoding.cell_map()].tocsr())
        m = Measurement(lifted, m.values, m.noise, m.scale, m.variance, m.cost, m.label, dict(m.info))
    rec = rel.reconstruction
    info = {}
    if rel.rounding is not None:
        info["rounding"] = {"status": rel.rounding["status"], "message": rel.rounding["method"],
                            "fun": rel.rounding["l1_change"], "time": rel.rounding["time"],
                            "info": {"method": rel.rounding["method"]}}
    result = Result(x=counts.astype(np.float64), status=rec.status, success=True, message=rec.message,
                    fun=rec.fun, objective=alg.method, backend=rec.backend,
                    solver=f"{rec.solver}; Fourier release of Barak et al. (PODS 2007)", time=rec.time,
                    nit=rec.nit, info=info)
    marginals = {", ".join(attrs): frame for attrs, frame in rel.marginals.items()}
    notes = {
        "name": "barak",
        "reference": "Barak, Chaudhuri, Dwork, Kale, McSherry, Talwar, PODS 2007",
        "parameters": {"marginals": [list(a) for a in fplan.marginals], "method": alg.method},
        "closure_size": fplan.closure_size,
        "binary_domain": {"attributes": len(fplan.domain), "cells": fplan.domain.size,
                          "encoded": fplan.encoding is not None},
        "lp": rel.lp,
        "bounds": rel.bounds.to_dict(orient="records"),
        "notes": [
            f"The whole budget buys one measurement: the {fplan.closure_size} unnormalised Fourier parities of the "
            "downward closure of the requested marginals (no [[measure]] tables).",
            "The released marginals (marginals/) are read from the released table, so they are mutually "
            "consistent; they have no 'noisy' column because the marginals themselves were not measured.",
            "The released total is noisy (the empty parity), not the record count.",
        ] + ([f"Non-binary attributes were binary-encoded ({len(fplan.domain)} bits); the table was solved over "
              "the binary domain with the unused codes as structural zeros and decoded back to the spec's domain."]
             if fplan.encoding is not None else [])
          + ["Theorem 5 bounds are reported for pure DP only."
             if spec.privacy.accounting != "pure" else
             "Theorem 5 bounds (probability 0.95) on each marginal's L1 error are listed under 'bounds'."],
    }
    return [m], accountant, rng, result, counts, marginals, notes


def _run_mwem(p: ReleasePlan, data: Dataset, constraints: ConstraintSet, accountant: Accountant, rng):
    from dpopt.algorithms.mwem import mwem
    from dpopt.estimate import round_to_integers
    from dpopt.estimate.result import Result
    from dpopt.estimate.status import Status
    from dpopt.model.queries.basic import Total

    spec, workload, alg = p.spec, p.algorithm_plan, p.spec.algorithm
    start = time.perf_counter()
    try:
        res = mwem(data, workload, accountant=accountant, rng=rng, rounds=alg.rounds, select=alg.select,
                   repeat_passes=alg.repeat_passes, constraints=constraints, **_privacy_arguments(p, accountant))
    except DpoptError as exc:
        raise spec.error(("mwem",), _plain(exc), type(exc)) from None
    n = float(res.info["total"])
    x = np.asarray(res.x, dtype=np.float64)
    info: dict = {}
    if spec.constraints.integer:
        rounded, info["rounding"] = _round_keeping_total(x, n, constraints, round_to_integers, Total)
        if rounded is None:
            raise spec.error(("constraints", "integer"), f"integer rounding of the MWEM table failed: "
                             f"{info['rounding']['message']}", SolverError)
        counts = rounded.astype(np.int64)
    else:
        counts = x
    result = Result(x=np.asarray(counts, dtype=np.float64), status=Status.ITERATION_LIMIT, success=True,
                    message=f"MWEM ran its {res.rounds} rounds (no optimality claim: the last iterate is released)",
                    fun=None, objective="entropy", backend="mwem",
                    solver="MWEM of Hardt, Ligett, McSherry (NIPS 2012)", time=time.perf_counter() - start,
                    nit=res.rounds, info=info)
    from dpopt.model.queries.marginal import Marginal

    marginals = {", ".join(q.attrs): cells_frame(q.marginal_domain, q.matvec(counts))
                 for q in workload if isinstance(q, Marginal)}
    notes = {
        "name": "mwem",
        "reference": "Hardt, Ligett, McSherry, NIPS 2012, Fig. 1 and Section 3",
        "parameters": {"marginals": [list(q.attrs) for q in workload], "rounds": alg.rounds,
                       "select": alg.select, "repeat_passes": alg.repeat_passes},
        "selected": [{"block": ", ".join(workload[b].attrs), "row": r} for b, r in res.selected],
        "round_budgets": list(res.info.get("round_budgets", [])),
        "notes": [
            f"The record count n = {n:g} is treated as public, as in the paper; it is the released total and is "
            "NOT protected by the privacy budget.",
            "Each round spends half its budget selecting a badly fit query (exponential mechanism) and half "
            "measuring it; the ledger lists both (no [[measure]] tables).",
            "The released marginals (marginals/) are read from the released table and have no 'noisy' column; "
            "the noisy answers of the selected queries are in the report's measurements.",
        ] + (["The last iterate was rounded to the L1-closest non-negative integer table with the same total."]
             if spec.constraints.integer else []),
    }
    return res.measurements, accountant, rng, result, counts, marginals, notes


def _round_keeping_total(x: np.ndarray, n: float, constraints: ConstraintSet, round_to_integers, Total):
    """The L1-closest integer table to ``x >= 0`` with total ``n`` (and the constraints' invariants).

    Without invariants or inequalities this is largest-remainder rounding: every cell goes
    to its floor or ceiling, and the ``n - sum(floor)`` cells with the largest fractional
    parts go up (each such choice changes the L1 distance by ``1 - 2 f``, so the largest
    ``f`` are best). Otherwise the exact rounding of :func:`dpopt.estimate.round_to_integers`
    runs with the total added as an invariant.
    """
    if abs(n - round(n)) > 1e-9:
        return None, {"status": "INFEASIBLE", "message": f"the total {n!r} is not an integer", "fun": None, "time": 0.0}
    tick = time.perf_counter()
    if not (constraints.invariants or constraints.inequalities):
        x = np.maximum(x, 0.0)
        floor = np.floor(x)
        frac = x - floor
        up = int(round(n - floor.sum()))
        if not 0 <= up <= x.size:
            return None, {"status": "INFEASIBLE", "message": f"cannot reach the total {n:g}", "fun": None, "time": 0.0}
        out = floor
        if up:
            out[np.argpartition(-frac, up - 1)[:up]] += 1.0
        return out, {"status": "OPTIMAL", "message": "largest remainder", "fun": float(np.abs(out - x).sum()),
                     "time": time.perf_counter() - tick, "info": {"method": "largest remainder (total kept)"}}
    cs = ConstraintSet(constraints.domain, list(constraints.constraints))
    cs.add(Invariant(Total(constraints.domain), np.array([round(n)], dtype=float), name="total (public in MWEM)"))
    r = round_to_integers(x, cs)
    rounding = {"status": getattr(r.status, "name", str(r.status)), "message": r.message, "fun": r.fun,
                "time": r.time, "info": {"method": r.info.get("method")}}
    return (r.x if r.success else None), rounding


def _algorithm_markdown(report: dict) -> str:
    """The summary's section on the landed algorithm ("" for the default pipeline)."""
    alg = report.get("algorithm")
    if not alg:
        return ""
    params = ", ".join(f"{k} = {v}" for k, v in alg["parameters"].items() if k != "marginals")
    lines = ["", "## Algorithm", "",
             f"{alg['name']} ({alg['reference']}); {len(alg['parameters']['marginals'])} marginals; {params}.", ""]
    lines += [f"- {note}" for note in alg["notes"]]
    return "\n".join(lines) + "\n"


# ---- small helpers --------------------------------------------------------------------------------


def _budget_text(spec: ReleaseSpec) -> str:
    p = spec.privacy
    if p.accounting == "pure":
        return f"pure epsilon-DP, epsilon = {p.epsilon}"
    if p.accounting == "approx":
        return f"(epsilon, delta)-DP, epsilon = {p.epsilon}, delta = {p.delta}"
    if p.rho is not None:
        return f"rho-zCDP, rho = {p.rho}"
    return f"rho-zCDP with rho chosen so that the release is ({p.epsilon}, {p.delta})-DP"


def _text_table(frame: pd.DataFrame) -> list[str]:
    """Rows of a small frame as aligned text: the first column left-aligned, the others right."""
    cells = [list(map(str, frame.columns))] + [[str(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max(len(r[j]) for r in cells) for j in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]


def _value(domain: Domain, attr: str, value: Any) -> Any:
    """A TOML table key is a string: read ``"3"`` as the code 3 for an attribute without labels."""
    if attr in domain and attr not in domain.labels and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _plain(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


def _error_class(exc: BaseException) -> type[DpoptError]:
    """Spec content errors are SpecErrors, except contradictions, which keep their own class."""
    return InconsistentConstraintsError if isinstance(exc, InconsistentConstraintsError) else SpecError
