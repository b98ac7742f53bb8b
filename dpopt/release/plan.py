"""The public half of a release: the spec's objects built and checked before any data is read.

:func:`plan` builds the domain, the public constraints (checked for consistency), the
algorithm's own plan (what it will measure and with which noise: the same
:func:`~dpopt.privacy.mechanisms.calibrate` the draw uses) and where the data will come from.
Nothing here branches on an algorithm's name: the spec's algorithm is a registered
:class:`~dpopt.algorithms.base.Algorithm`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Algorithm, AlgorithmPlan, PlannedMeasure
from dpopt.atomic import check_output_dir
from dpopt.errors import DomainError, DpoptError, InconsistentConstraintsError, SpecError
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset
from dpopt.model.domain import MAX_DENSE_CELLS, Domain
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.budget import Budget
from dpopt.spec import ReleaseSpec, build_query, data_format, load_spec

__all__ = ["ReleasePlan", "PlannedMeasure", "plan", "declared_constraints", "describe_heading"]

#: The error (at key ``data.path``) of a run whose spec names no data file and no ``--data`` was given.
NO_DATA = "no data file given: set data.path in the spec or pass --data PATH"


@dataclass(eq=False)
class ReleasePlan:
    """Everything public about a release, built and checked before any data is read.

    Attributes
    ----------
    spec : ReleaseSpec
    domain : Domain
    algorithm : Algorithm
        The spec's registered algorithm with its parameters.
    algorithm_plan : AlgorithmPlan
        What the algorithm will measure and with which noise (``steps``); its own public plan
        is ``algorithm_plan.details``.
    constraints : ConstraintSet
        The public constraints (invariants from the data are added by
        :func:`~dpopt.release.pipeline.build_constraints` once the data are read).
    data_invariants : list of (name, LinearQuery, spec path)
        Invariants whose values will be published exactly from the data (not private).
    data_source : str
        ``"example"``, ``"file"``, ``"given"`` (a DataFrame or Dataset passed in) or ``"none"``
        (no file named yet: enough for ``dpopt check``, not for a run).
    data_path : Path or None
    seed : int or None
        Seed of the noise (``None``: a cryptographically secure source). Seeded runs are NOT private.
    out : Path or None
    show_confidential : bool
        Whether errors about the data may quote its offending values (never their row counts);
        off by default (:mod:`dpopt.errors`).
    """

    spec: ReleaseSpec
    domain: Domain
    algorithm: Algorithm
    algorithm_plan: AlgorithmPlan
    constraints: ConstraintSet
    data_invariants: list[tuple[str, LinearQuery, tuple]]
    data_source: str
    data_path: Path | None
    data_format: str | None
    data_given: Any = field(default=None, repr=False)
    seed: int | None = None
    out: Path | None = None
    overwrite: bool = False
    protected: dict = field(default_factory=dict, repr=False)
    resources: Any = field(default=None, repr=False)
    show_confidential: bool = False

    @property
    def budget(self) -> Budget:
        return self.algorithm_plan.budget

    @property
    def measures(self) -> list[PlannedMeasure]:
        """The measurements the spec's ``[[measure]]`` tables declare (empty for algorithms that choose their own)."""
        return self.algorithm_plan.measures

    @property
    def steps(self) -> list[PlannedMeasure]:
        """Every budget-spending step known in advance, with its noise."""
        return self.algorithm_plan.steps

    def new_accountant(self) -> Accountant:
        """A fresh accountant holding the spec's total budget."""
        return self.budget.accountant()

    def budget_frame(self) -> pd.DataFrame:
        """The budget split: one row per step, exact shares and noise per answer."""
        return self.algorithm_plan.steps_frame()

    def describe(self, *, heading: bool = True) -> str:
        """The plan as text (what ``dpopt check`` prints); ``heading=False`` leaves out the lines of
        :func:`describe_heading` (``dpopt check`` prints them before planning)."""
        spec = self.spec
        lines = describe_heading(spec) if heading else []
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
        elif self.data_source == "none":
            lines.append(f"data: a {spec.data.format or 'CSV or Parquet'} file, not named yet "
                         "(`dpopt run` needs data.path in the spec or --data PATH)")
        elif self.data_format is None:
            lines.append(f"data: {self.data_path}, not found here (`dpopt run` needs it, or --data PATH)")
        else:
            lines.append(f"data: {self.data_path} ({self.data_format}"
                         + (f", count column {spec.data.count_column!r}" if spec.data.count_column else "") + ")")
        lines.append(f"privacy: {self.budget.describe()}")
        if self.seed is not None:
            lines.append(f"  noise seed {self.seed}: seeded, NOT private (for testing only)")
        alg = self.algorithm
        lines.append(f"algorithm: {alg.describe()}")
        lines.append(f"  {alg.title}; {alg.reference}")
        if self.steps:
            frame = self.budget_frame().drop(columns=["query", "sensitivity", "noise"])
            frame["noise_stddev"] = frame["noise_stddev"].map(lambda v: "-" if np.isnan(v) else f"{v:.2f}")
            frame["answers"] = frame["answers"].map(lambda v: "-" if v is None or v != v else str(int(v)))
            lines.append("budget split (noise_stddev: standard deviation of the noise on each answer):")
            lines.extend("  " + line for line in _text_table(frame))
        lines.extend(_accuracy_lines(self))
        lines.extend(alg.describe_plan(self.algorithm_plan))
        lines.append("constraints:")
        for row in self.constraints.describe():
            lines.append(f"  {row['constraint']}: {row['detail']}")
        for name, query, _ in self.data_invariants:
            lines.append(f"  invariant:{name}: {query.name} with {query.num_rows} rows "
                         "(to be published exactly from the data, not private)")
        out = spec.output
        parts = [f"tables as {', '.join(out.formats) or 'no files'}"]
        if out.synthetic:
            parts.append("synthetic microdata")
        if out.summary:
            parts.append(f"summary as {', '.join(out.summary)}")
        if out.plots:
            parts.append("plots")
        lines.append("outputs: " + "; ".join(parts) + (f" into {self.out}" if self.out else ""))
        if self.resources is not None:
            lines.append(self.resources.describe())
        return "\n".join(lines)


def _accuracy_lines(p: "ReleasePlan") -> list[str]:
    """The plan's expected error per measured table (before data; :mod:`dpopt.release.accuracy`)."""
    from dpopt.release.accuracy import planned_accuracy

    rows = [r for r in planned_accuracy(p) if r["expected_rmse"] is not None]
    if not rows:
        return []
    frame = pd.DataFrame({"measurement": [r["table"] for r in rows],
                          "noisy_answers": [f"{r['noise_rmse']:.3g}" for r in rows],
                          "least_squares_fit": [f"{r['expected_rmse']:.3g}" for r in rows]})
    return (["expected error per answer before data (RMS, counts; the fit's figure ignores the constraints, "
             "which lower it):"] + ["  " + line for line in _text_table(frame)])


def describe_heading(spec: ReleaseSpec) -> list[str]:
    """The first lines of :meth:`ReleasePlan.describe`: the release's name, file and description."""
    lines = [f"release {spec.name!r}" + (f" ({spec.source})" if spec.source else "")]
    if spec.description:
        lines.append(f"  {spec.description}")
    return lines


def plan(
    spec: "str | Path | Mapping | ReleaseSpec",
    *,
    data: Any = None,
    seed: int | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    show_confidential: bool = False,
    require_data: bool = True,
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
        Output directory, checked now: absent or empty, or with ``overwrite`` a previous dpopt
        release and nothing else; never the working directory, the spec's or the data's
        directory, or an ancestor of one (:func:`~dpopt.atomic.check_output_dir`).
    show_confidential
        Let errors about the data quote its offending values (never how many rows hold them).
        Off by default: messages end up in shared logs.
    require_data
        Refuse a spec that names no data file when ``data`` gives none (the default: a plan to
        run). ``False`` plans without one (``data_source == "none"``), as ``dpopt check`` does.

    Raises
    ------
    SpecError, InconsistentConstraintsError, OutputExistsError, ResourceLimitError
        Naming the spec key (or option) at fault.
    """
    spec = load_spec(spec)
    domain = _build_domain(spec)
    source, path, fmt, given = _plan_data(spec, data, domain, require_data)  # cheap: before the algorithm's plan
    constraints, data_invariants = _public_constraints(spec, domain)
    algorithm = spec.algorithm
    try:
        algorithm_plan = algorithm.plan(domain, constraints, spec.budget)
    except DpoptError as exc:
        raise spec.error(getattr(exc, "spec_path", None) or _section_of(algorithm), plain(exc),
                         error_class(exc)) from None
    check_noise(spec, algorithm_plan)
    _check_constraints(spec, constraints, when="before reading any data")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise SpecError(f"--seed: must be a non-negative integer, got {seed!r}")
    seed = spec.privacy.seed if seed is None else int(seed)
    protected = protected_directories(spec, path)
    out_path = None
    if out is not None:
        out_path = check_output_dir(out, overwrite=overwrite, key="--out" if spec.output.dir is None or
                                    Path(out) != spec.output.dir else spec.where(("output", "dir")),
                                    protected=protected)
    p = ReleasePlan(spec, domain, algorithm, algorithm_plan, constraints, data_invariants, source, path, fmt,
                    given, seed, out_path, overwrite, protected, show_confidential=bool(show_confidential))
    from dpopt.release.checks import check_synthetic_total
    from dpopt.release.resources import check_resources
    from dpopt.workers import worker_threads

    check_synthetic_total(p)
    p.resources = check_resources(p)
    worker_threads()  # DPOPT_THREADS is read mid-solve: a bad value is refused here, before any draw
    if p.resources.engine_options:  # the solve the resource check chose (e.g. matrix-free)
        p.algorithm_plan = dataclasses.replace(p.algorithm_plan, engine_options=dict(p.resources.engine_options))
    return p


def protected_directories(spec: ReleaseSpec, data_path: Path | None) -> dict[str, Path | None]:
    """Directories a release may neither be written into nor contain: the working directory,
    the spec's and the data's."""
    return {"the working directory": Path.cwd(),
            "the spec's directory": spec.source.resolve().parent if spec.source is not None else None,
            "the data's directory": Path(data_path).resolve().parent if data_path is not None else None}


def check_noise(spec: ReleaseSpec, algorithm_plan: AlgorithmPlan) -> None:
    """Refuse, naming the measurement and the budget key, a step whose noise the exact samplers
    cannot draw (a share too small for its sensitivity)."""
    from dpopt.privacy.samplers import MAX_GAUSSIAN_SIGMA2, MAX_LAPLACE_SCALE

    key = ("privacy", "rho") if spec.privacy.rho is not None else ("privacy", "epsilon")
    for step in algorithm_plan.steps:
        law = step.law
        if law is None:
            continue
        laplace = law.family == "discrete_laplace"
        limit, what = (MAX_LAPLACE_SCALE, "scale") if laplace else (MAX_GAUSSIAN_SIGMA2, "sigma^2")
        if law.parameter <= limit:
            continue
        factor = law.parameter / limit
        if laplace or spec.privacy.rho is not None:  # scale ~ 1/epsilon, sigma^2 ~ 1/rho
            amount = spec.privacy.epsilon if laplace and spec.privacy.rho is None else spec.privacy.rho
            need = f"; {key[1]} >= {float(amount * factor):.3g} would do at this share"
        else:
            need = "; raise epsilon or delta"
        raise spec.error(key, f"measurement {step.label!r} (share {step.share} of the budget, sensitivity "
                              f"{float(law.sensitivity):g}) would need a {law.family.replace('_', ' ')} {what} of "
                              f"{float(law.parameter):.3g} (grid units), above the exact sampler's limit "
                              f"{float(limit):.3g}: raise its share or the budget{need}")


def _section_of(algorithm: Algorithm) -> tuple:
    return (next(iter(algorithm.sections), "algorithm"),)


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
        if d.codes:
            domain = domain.with_codes(d.codes)
        if spec.algorithm.holds_dense_table(domain) and domain.size > MAX_DENSE_CELLS:
            raise DomainError(f"the domain has {domain.size:.3g} cells, above the limit of {MAX_DENSE_CELLS:.0e} "
                              f"for algorithm = {spec.algorithm.name!r}, which releases a table over the full "
                              "domain; use fewer or coarser attributes, or algorithm = \"marginal_space\" (marginals "
                              "and records without the full table)")
    except (DpoptError, OSError, ValueError) as exc:
        raise spec.error(("domain",), plain(exc)) from None
    return domain


def _query(spec: ReleaseSpec, q, domain: Domain) -> LinearQuery:
    (_, query), = build_query(q, domain, lambda path, msg: spec.error(path, msg))
    return query


def declared_constraints(spec: "str | Path | Mapping | ReleaseSpec") -> tuple[Domain, ConstraintSet, list]:
    """The spec's domain, public constraints and data invariants, as :func:`plan` builds them,
    without planning its algorithm (which reads them and never changes them) and without data.

    A plan of the full domain can take seconds to minutes (the matrix mechanism's strategies on
    4,357 cells: about 15 CPU-s); what a spec *declares* needs none of it. Used by the audit,
    which plans the algorithm on its own small domain, and to check a report against the spec.
    """
    spec = load_spec(spec)
    domain = _build_domain(spec)
    constraints, invariants = _public_constraints(spec, domain)
    return domain, constraints, invariants


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
                from dpopt.datasets.census import structural_zero_constraints

                for zeros in structural_zero_constraints(domain, name="census rule {}"):
                    cs.add(zeros)
            else:
                cs.add(StructuralZeros(z.where, name=z.name or f"rule {i + 1}", reason=z.reason))
        except (DpoptError, ValueError, SyntaxError) as exc:
            raise spec.error(z.path + (() if z.builtin else ("where",)), plain(exc), error_class(exc)) from None
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
            raise spec.error(h.path, plain(exc), error_class(exc)) from None
    data_invariants = []
    for inv in c.invariants:
        query = _query(spec, inv.query, domain)
        if inv.from_data:
            data_invariants.append((inv.name, query, inv.path))
            continue
        try:
            cs.add(Invariant(query, np.asarray(inv.values, dtype=float), name=inv.name))
        except (DpoptError, ValueError) as exc:
            raise spec.error(inv.path + ("values",), plain(exc), error_class(exc)) from None
    for q in c.inequalities:
        query = _query(spec, q.query, domain)
        lower = -np.inf if q.lower is None else np.asarray(q.lower, dtype=float)
        upper = np.inf if q.upper is None else np.asarray(q.upper, dtype=float)
        try:
            cs.add(LinearInequality(query, lower, upper, name=q.name))
        except (DpoptError, ValueError) as exc:
            raise spec.error(q.path, plain(exc), error_class(exc)) from None
    return cs, data_invariants


def check_constraints(spec: ReleaseSpec, constraints: ConstraintSet, when: str) -> None:
    """Raise InconsistentConstraintsError naming the ``constraints`` key when they contradict each other."""
    try:
        constraints.check()
    except InconsistentConstraintsError as exc:
        raise spec.error(("constraints",), f"{plain(exc)} ({when})", InconsistentConstraintsError) from None


_check_constraints = check_constraints


def _plan_data(spec: ReleaseSpec, data: Any, domain: Domain, required: bool = True):
    if data is None:
        if spec.data.source == "example":
            return "example", None, None, None
        path = spec.data.path
        if path is None and not required:
            return "none", None, None, None
        if path is None:
            raise spec.error(("data", "path"), NO_DATA)
        if not path.is_file():
            if not required:  # named, but not on this machine: described as such
                return "file", path, None, None
            raise spec.error(("data", "path"), f"file {spec.raw['data']['path']!r} does not exist (looked for "
                                               f"{str(path)!r})")
        return "file", path, spec.data.format or data_format(path, spec.where(("data", "path"))), None
    if isinstance(data, (pd.DataFrame, Dataset)):
        if isinstance(data, Dataset) and data.domain != domain:
            raise SpecError(f"data: the given Dataset is over {data.domain}, not the spec's domain {domain}")
        return "given", None, None, data
    if isinstance(data, (str, Path)):
        path = Path(data).expanduser()
        if not path.is_file():
            raise SpecError(f"--data: file {str(data)!r} does not exist")
        # The file's own content or extension decides; the spec's format belongs to the spec's path.
        return "file", path.absolute(), data_format(path, "--data"), None
    raise SpecError(f"--data: expected a file path, a DataFrame or a Dataset, got {type(data).__name__}")


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


def plain(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


def error_class(exc: BaseException) -> type[DpoptError]:
    """Spec content errors are SpecErrors, except contradictions, which keep their own class."""
    return InconsistentConstraintsError if isinstance(exc, InconsistentConstraintsError) else SpecError
