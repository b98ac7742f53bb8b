"""The parsed form of a release spec: one frozen dataclass per section."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from dpopt.errors import DpoptError, SpecError
from dpopt.privacy.budget import Budget
from dpopt.spec.queries import QuerySpec
from dpopt.spec.table import where

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.algorithms.base import Algorithm

__all__ = [
    "DomainSpec", "DataSpec", "PrivacySpec", "MeasureSpec", "ZeroSpec", "HierarchySpec", "InvariantSpec",
    "InequalitySpec", "ConstraintsSpec", "ReconstructSpec", "OutputSpec", "ReleaseSpec",
    "OUTPUT_FORMATS", "SUMMARY_FORMATS",
]

OUTPUT_FORMATS = ("csv", "parquet")
SUMMARY_FORMATS = ("md", "html")

@dataclass(frozen=True)
class DomainSpec:
    builtin: str | None = None
    states: int = 4
    counties_per_state: int = 3
    attributes: Mapping[str, Any] | None = None
    json: Path | None = None
    codes: tuple[str, ...] = ()  # labelled attributes whose data hold codes 0..size-1


@dataclass(frozen=True)
class DataSpec:
    source: str
    rows: int = 10_000
    seed: int = 0
    path: Path | None = None
    format: str | None = None
    count_column: str | None = None
    missing_values: tuple[str, ...] = ()  # CSV markers of a missing value besides an empty cell


@dataclass(frozen=True)
class PrivacySpec:
    accounting: str
    epsilon: Fraction | None = None
    delta: Fraction | None = None
    rho: Fraction | None = None
    seed: int | None = None

    def budget(self) -> Budget:
        """The declared budget (zCDP declared as (epsilon, delta) keeps both)."""
        if self.accounting == "pure":
            return Budget.pure(self.epsilon)
        if self.accounting == "approx":
            return Budget.approx(self.epsilon, self.delta)
        if self.rho is not None:
            return Budget.zcdp(self.rho)
        return Budget.zcdp_from_approx(self.epsilon, self.delta)


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
    #: Records falling in a structural-zero cell: "error" (default) or "drop" (said in the report).
    structural_zero_records: str = "error"

    def kinds(self) -> list[str]:
        """The constraint kinds declared (names as in ``[constraints]``)."""
        return [k for k in ("nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities")
                if getattr(self, k)]


@dataclass(frozen=True)
class ReconstructSpec:
    objective: str = "l2"
    backend: str | None = None
    time_limit: float | None = None


@dataclass(frozen=True)
class OutputSpec:
    dir: Path | None = None
    formats: tuple[str, ...] = OUTPUT_FORMATS
    synthetic: bool = True
    summary: tuple[str, ...] = SUMMARY_FORMATS
    plots: bool = True
    marginals: bool = True
    marginals_layout: str = "auto"
    cells: str = "all"


@dataclass(frozen=True, eq=False)
class ReleaseSpec:
    """A validated release specification.

    Attributes
    ----------
    name, description : str
    domain, data, privacy, constraints, output
        The parsed common sections (see the spec reference).
    algorithm : Algorithm
        The registered algorithm with the parameters its own tables give
        (``algorithm.params``).
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
    constraints: ConstraintsSpec
    output: OutputSpec
    raw: dict = field(repr=False)
    algorithm: "Algorithm" = field(default=None)
    source: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    lines: Mapping[tuple, int] = field(default_factory=dict, repr=False)

    def where(self, path: tuple) -> str:
        """``spec FILE, line N, key 'a.b[2].c'`` for a key path (line when known)."""
        return where(self.source, self.lines, path)

    def error(self, path: tuple, message: str, cls: type[DpoptError] = SpecError) -> DpoptError:
        """An error of class ``cls`` whose message starts with :meth:`where`."""
        return cls(f"{self.where(path)}: {message}")

    @property
    def budget(self) -> Budget:
        """The declared budget as one value."""
        return self.privacy.budget()

    @property
    def measures(self) -> tuple[MeasureSpec, ...]:
        """The ``[[measure]]`` tables, for algorithms that take them (else empty)."""
        return tuple(getattr(self.algorithm.params, "measures", ()))

    @property
    def reconstruct(self) -> "ReconstructSpec | None":
        """The reconstruction settings, for algorithms that solve a consistency problem (else None)."""
        return getattr(self.algorithm.params, "reconstruct", None)

    @property
    def data_invariants(self) -> tuple[InvariantSpec, ...]:
        """Invariants whose values are taken from the data (published exactly, not private)."""
        return tuple(i for i in self.constraints.invariants if i.from_data)

