"""The algorithm interface: every release is a registered :class:`Algorithm` returning one :class:`Release`.

An algorithm is a short plan over the shared layers (model → privacy → estimate). It declares

* ``name`` (the spec's ``algorithm = "..."``), ``title`` and ``reference`` (the paper it implements,
  cited by reports);
* ``accountings``: the privacy notions it is proved under (``"pure"``, ``"approx"``, ``"zcdp"``);
* ``supports``: the constraint kinds it keeps exactly (see :data:`CONSTRAINT_KINDS`); a spec that
  declares another kind is refused before any data is read;
* ``sections``: the spec tables it reads besides the common ones (``[domain]``, ``[data]``,
  ``[privacy]``, ``[constraints]``, ``[output]``), and a frozen ``Params`` dataclass
  (a subclass of :class:`AlgorithmParams`) whose :meth:`~AlgorithmParams.from_spec` parses and
  validates them, naming file, line and key in every error;

and implements two steps:

``plan(domain, constraints, budget) -> AlgorithmPlan``
    Public: what will be measured and the noise law of each measurement (computed by
    :func:`dpopt.privacy.mechanisms.calibrate`, the same function the draw uses). Reads no data;
    ``dpopt check`` prints it.
``run(plan, data, accountant, rng) -> Release``
    Private: spends the accountant (charging every cost before its draw) and returns the release.

Registering is one decorator, :func:`register`; :data:`REGISTRY` maps names to classes. The spec
parser and the release pipeline only ever talk to this interface, so adding an algorithm is one
module (plus its docs page, tests and a ``models/*.toml``).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import functools
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeResult

from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.domain import Domain
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.privacy.budget import ACCOUNTINGS, Budget
from dpopt.privacy.mechanisms import NoiseLaw

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import RandomSource
    from dpopt.spec.table import SpecReader

__all__ = [
    "Algorithm", "AlgorithmParams", "AlgorithmPlan", "PlannedMeasure", "Release", "REGISTRY",
    "CONSTRAINT_KINDS", "register", "get_algorithm", "registered_names",
]

#: Constraint kinds a spec can declare (``[constraints]`` keys), which an algorithm may support.
CONSTRAINT_KINDS = ("nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities")

#: Every registered algorithm, by name (aliases resolve through :func:`get_algorithm`).
REGISTRY: dict[str, type["Algorithm"]] = {}
_ALIASES: dict[str, str] = {}


# ---- parameters ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlgorithmParams:
    """Base of every algorithm's frozen ``Params`` dataclass.

    Subclasses add their fields (with defaults) and override :meth:`from_spec`, which reads the
    algorithm's spec tables through a :class:`~dpopt.spec.table.SpecReader` (its typed getters
    raise errors naming the file, line and key). :meth:`validate` runs on construction, so the
    Python API gets the same checks as a spec, as :class:`~dpopt.errors.ParameterError`.
    """

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ParameterError` naming the option at fault (default: nothing to check)."""

    @classmethod
    def from_spec(cls, reader: "SpecReader") -> "AlgorithmParams":
        """Parse the algorithm's spec tables (default: no parameters)."""
        return cls()

    def describe(self) -> str:
        """The parameters on one line (for ``dpopt check``)."""
        return ", ".join(f"{k} = {_short(v)}" for k, v in self.to_dict().items())

    def to_dict(self) -> dict[str, Any]:
        """The parameters as plain values (for reports)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.repr}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Fraction):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    return value


# ---- plan -----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PlannedMeasure:
    """One privacy-spending step known before any data is read.

    Attributes
    ----------
    label : str
        The ledger label the step will be charged under.
    query : LinearQuery or None
        The measured query; None when it is chosen during the run (MWEM's selected query) or the
        step is a selection.
    mechanism : str
        ``"laplace"``, ``"gaussian"``, ``"exponential"``, ... .
    share : Fraction
        The step's exact share of the whole budget.
    budget : PrivacyCost
        What the step will be charged, in the accountant's currency.
    law : NoiseLaw or None
        The noise of a measurement (:func:`~dpopt.privacy.mechanisms.calibrate`); None for a
        selection step.
    what : str
        What is measured, for plans whose query is not fixed (defaults to the query's name).
    answers : int or None
        Number of noisy answers.
    path : tuple
        The spec key path it came from (for messages).
    """

    label: str
    query: LinearQuery | None
    mechanism: str
    share: Fraction
    budget: PrivacyCost
    law: NoiseLaw | None = None
    what: str = ""
    answers: int | None = None
    path: tuple = ()

    @property
    def sensitivity(self) -> float:
        return float(self.law.sensitivity) if self.law is not None else float("nan")

    @property
    def noise(self) -> str:
        return self.law.family if self.law is not None else self.mechanism

    @property
    def scale(self) -> float:
        return self.law.scale if self.law is not None else float("nan")

    @property
    def variance(self) -> float:
        return self.law.variance if self.law is not None else float("nan")

    @property
    def stddev(self) -> float:
        return float(np.sqrt(self.variance))

    @property
    def description(self) -> str:
        return self.what or (self.query.name if self.query is not None else self.mechanism)

    @property
    def rows(self) -> int | None:
        if self.answers is not None:
            return self.answers
        return self.query.num_rows if self.query is not None else None


@dataclass(frozen=True, eq=False)
class AlgorithmPlan:
    """The public plan of one run: built by :meth:`Algorithm.plan`, read by :meth:`Algorithm.run`.

    Attributes
    ----------
    algorithm : Algorithm
    domain : Domain
    constraints : ConstraintSet
        The public constraints (the pipeline adds invariants taken from the data with
        :meth:`with_constraints` before running).
    budget : Budget
    steps : list of PlannedMeasure
        Every step that spends budget and is known in advance, with its noise (what
        ``dpopt check`` prints). Its shares sum to the budget.
    measures : list of PlannedMeasure
        The measurements declared by a spec's ``[[measure]]`` tables (the default pipeline);
        empty for algorithms that choose their own.
    details : object
        The algorithm's own public plan (e.g. Barak's Fourier plan, MWEM's workload).
    lines : list of str
        Extra lines for the printed plan.
    engine_options : dict
        Options of the consistency engine chosen by the release plan's resource check (e.g.
        ``{"matrix_free": True, "working_set": False}`` when the explicit solve would not fit the
        memory limit; :mod:`dpopt.release.resources`). Read by algorithms whose
        ``takes_engine_options`` is True.
    """

    algorithm: "Algorithm"
    domain: Domain
    constraints: ConstraintSet
    budget: Budget
    steps: list[PlannedMeasure] = field(default_factory=list)
    measures: list[PlannedMeasure] = field(default_factory=list)
    details: Any = None
    lines: list[str] = field(default_factory=list)
    engine_options: dict = field(default_factory=dict)

    def with_constraints(self, constraints: ConstraintSet) -> "AlgorithmPlan":
        """The same plan with ``constraints`` (e.g. with the invariants published from the data)."""
        if constraints.domain != self.domain:
            raise ParameterError(f"constraints are over {constraints.domain}, not the plan's {self.domain}")
        return replace(self, constraints=constraints)

    def steps_frame(self) -> pd.DataFrame:
        """One row per step: label, what, answers, mechanism, share, cost and noise."""
        comps = _components(self.budget)
        rows = []
        for m in self.steps:
            row = {"label": m.label, "query": m.description, "answers": m.rows, "mechanism": m.mechanism,
                   "share": str(m.share)}
            for c in comps:
                row[c] = str(getattr(m.budget, c))
            row.update({"sensitivity": m.sensitivity, "noise": m.noise, "noise_stddev": m.stddev})
            rows.append(row)
        return pd.DataFrame(rows)


def _components(budget: Budget) -> tuple[str, ...]:
    return {"pure": ("epsilon",), "approx": ("epsilon", "delta"), "zcdp": ("rho",)}[budget.accounting]


# ---- the result ----------------------------------------------------------------------------------
class Release(OptimizeResult):
    """What every algorithm returns, in the style of ``scipy.optimize.OptimizeResult``.

    Attributes
    ----------
    counts : ndarray or None
        The released table over the plan's domain (int64 when integral); None for algorithms
        that release answers or records only.
    records : DataFrame or None
        Released (synthetic) records, one row per record.
    answers : dict of str to DataFrame
        Released query answers by label (e.g. marginal tables read off the table, or an
        evaluator's answers), each with a ``count`` column.
    status : Status
        ``OPTIMAL`` when the reconstruction is a verified optimum, ``COMPLETED`` for an iterative
        algorithm without an optimality claim; anything else is not a release.
    success : bool
        ``status.releasable``.
    message : str
    measurements : list of Measurement
        Every noisy measurement, in the order taken.
    reconstruction : dpopt.estimate.Result or None
        The consistency solve.
    rounding : dpopt.estimate.Result or None
        The integer rounding.
    accountant : Accountant
        Its ledger sums exactly to what was spent.
    algorithm, reference : str
        The registered name and the paper it implements.
    parameters : dict
        The algorithm's parameters.
    notes : list of str
        What a reader of the release must know (printed in the report).
    info : dict
        Anything else the algorithm reports.
    """

    def __repr__(self) -> str:
        # scipy's OptimizeResult repr formats nested dicts in full (and fails on an empty one):
        # one line per key, with a short description of large values, reads better.
        if not self:
            return f"{type(self).__name__}()"
        width = max(map(len, self.keys()))
        return "\n".join(f"{key.rjust(width)}: {_describe_value(value)}" for key, value in self.items())

    @property
    def ledger(self) -> pd.DataFrame:
        """The privacy ledger (exact Fractions; each column sums to the amount spent)."""
        return self.accountant.ledger_frame()

    @property
    def x(self) -> np.ndarray | None:
        """The released table as floats (None when the algorithm releases no table)."""
        counts = self.get("counts")
        return None if counts is None else np.asarray(counts, dtype=np.float64)

    def errors(self, data) -> pd.DataFrame | None:
        """The algorithm's own accuracy statement on ``data``: its measured errors beside the bound
        its theorem gives (one row per workload), or None when it states none. NOT private:
        ``dpopt run --evaluate`` puts it in the report's evaluation section."""
        return None


def _describe_value(value: Any) -> str:
    """A one-line description of a result's value (shapes for arrays and frames, sizes for mappings)."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    if isinstance(value, pd.DataFrame):
        return f"DataFrame({len(value):,} rows x {value.shape[1]} columns)"
    if isinstance(value, dict):
        return f"dict({len(value)} keys)"
    if isinstance(value, (list, tuple)) and len(value) > 3:
        return f"{type(value).__name__}({len(value)} items)"
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def make_release(
    algorithm: "Algorithm",
    plan: AlgorithmPlan,
    accountant: Accountant,
    *,
    status: Status,
    message: str,
    counts: np.ndarray | None = None,
    records: pd.DataFrame | None = None,
    answers: dict[str, pd.DataFrame] | None = None,
    measurements: list | None = None,
    reconstruction=None,
    rounding=None,
    notes: list[str] | None = None,
    info: dict | None = None,
    cls: type[Release] = Release,
) -> Release:
    """A :class:`Release` filled with the algorithm's name, reference and parameters."""
    if not isinstance(status, Status):
        raise ParameterError(f"status must be a Status, got {status!r}")
    return cls(
        counts=counts, records=records, answers=dict(answers or {}), status=status, success=status.releasable,
        message=message, measurements=list(measurements or []), reconstruction=reconstruction,
        rounding=rounding, accountant=accountant, algorithm=algorithm.name, reference=algorithm.reference,
        title=algorithm.title, parameters=algorithm.params.to_dict(), notes=list(notes or []),
        info=dict(info or {}), domain=plan.domain,
    )


# ---- the interface --------------------------------------------------------------------------------
class Algorithm(abc.ABC):
    """Base class of every release algorithm (see the module notes).

    Parameters
    ----------
    params : AlgorithmParams, optional
        An instance of the class's ``Params``; or give its fields as keyword arguments.
    """

    #: Registered name (the spec's ``algorithm = "..."``).
    name: ClassVar[str]
    #: Other names a spec may use for it.
    aliases: ClassVar[tuple[str, ...]] = ()
    #: One line: what it releases.
    title: ClassVar[str]
    #: The paper it implements (cited by reports and ``dpopt check``).
    reference: ClassVar[str]
    #: Privacy notions it is proved under.
    accountings: ClassVar[tuple[str, ...]] = ACCOUNTINGS
    #: Constraint kinds it keeps exactly.
    supports: ClassVar[frozenset[str]] = frozenset()
    #: Spec tables it reads besides the common ones.
    sections: ClassVar[tuple[str, ...]] = ()
    #: Whether it needs the whole domain as a dense table (False: it works on domains far too
    #: large for one, releasing answers or records; the pipeline then never builds the table).
    dense_domain: ClassVar[bool] = True
    #: Whether its run passes :attr:`AlgorithmPlan.engine_options` to ``reconstruct`` (then the
    #: release plan may send its solve down the matrix-free path instead of refusing it).
    takes_engine_options: ClassVar[bool] = False
    def holds_dense_table(self, domain) -> bool:
        """Whether a release over ``domain`` holds the full table (planning and memory checks ask
        this; default :attr:`dense_domain`; ``auto`` answers by the domain's size)."""
        return self.dense_domain

    #: True when every planned measurement is fitted in one weighted least-squares problem over the
    #: whole table (the report's expected error before data then applies; dpopt.release.accuracy).
    fits_jointly: ClassVar[bool] = False
    #: Its frozen parameter dataclass.
    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__:
            cls.run = _affordable_first(cls.__dict__["run"])
        if "plan" in cls.__dict__:
            cls.plan = _checked_plan(cls.__dict__["plan"])

    def __init__(self, params: AlgorithmParams | None = None, **options: Any) -> None:
        if params is not None and options:
            raise ParameterError(f"{self.name}: give params or keyword options, not both")
        if params is None:
            names = {f.name for f in dataclasses.fields(self.Params)}
            unknown = sorted(set(options) - names)
            if unknown:
                raise ParameterError(f"{self.name}: unknown option {unknown[0]!r}{_close(unknown[0], names)}; "
                                     f"options: {sorted(names)}")
            params = self.Params(**options)
        if not isinstance(params, self.Params):
            raise ParameterError(f"{self.name}: params must be a {self.Params.__name__}, got {type(params).__name__}")
        self.params = params

    # ---- spec ----------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, reader: "SpecReader") -> "Algorithm":
        """The algorithm with the parameters its spec tables give."""
        return cls(cls.Params.from_spec(reader))

    # ---- the two steps -------------------------------------------------------------------------
    @abc.abstractmethod
    def plan(self, domain: Domain, constraints: ConstraintSet, budget: Budget) -> AlgorithmPlan:
        """What will be measured and with which noise. Reads no data."""

    @abc.abstractmethod
    def run(self, plan: AlgorithmPlan, data: "Dataset", accountant: Accountant, rng: "RandomSource") -> Release:
        """Spend ``accountant`` on ``data`` (every cost charged before its draw) and release."""

    # ---- helpers for subclasses and the pipeline -------------------------------------------------
    @classmethod
    def check_accounting(cls, accounting: str) -> None:
        """Refuse a privacy notion the algorithm is not proved under (ParameterError)."""
        if accounting not in cls.accountings:
            notions = " or ".join(_NOTIONS[a] for a in cls.accountings)
            raise ParameterError(f"algorithm = {cls.name!r} runs under {notions}, not accounting = \"{accounting}\"")

    @classmethod
    def check_constraint_kinds(cls, kinds) -> None:
        """Refuse constraint kinds (:data:`CONSTRAINT_KINDS`) the algorithm cannot keep exactly."""
        missing = [k for k in CONSTRAINT_KINDS if k in set(kinds) and k not in cls.supports]
        if missing:
            kept = [_KIND_WORDS[k] for k in CONSTRAINT_KINDS if k in cls.supports]
            keeps = (", ".join(kept[:-1]) + " and " + kept[-1]) if len(kept) > 1 else (kept[0] if kept else "nothing")
            raise ParameterError(f"algorithm = {cls.name!r} keeps {keeps} but cannot impose "
                                 f"{_KIND_WORDS[missing[0]]}; remove them or use another algorithm")

    def check_budget(self, budget: Budget) -> None:
        """:meth:`check_accounting` for a budget."""
        self.check_accounting(budget.accounting)

    def check_constraints(self, constraints: ConstraintSet) -> None:
        """:meth:`check_constraint_kinds` for a constraint set."""
        self.check_constraint_kinds(constraint_kinds(constraints))

    def describe(self) -> str:
        """One line: the name and the parameters."""
        params = self.params.describe()
        return f"{self.name} ({params})" if params else self.name

    def describe_plan(self, plan: AlgorithmPlan) -> list[str]:
        """Lines for the printed plan (default: the plan's own lines)."""
        return list(plan.lines)

    def new_plan(self, domain: Domain, constraints: ConstraintSet, budget: Budget, **fields: Any) -> AlgorithmPlan:
        """An :class:`AlgorithmPlan` of this algorithm (``plan`` has already refused what it cannot honour)."""
        return AlgorithmPlan(self, domain, constraints, budget, **fields)

    def resized(self, records: int, budget: Budget) -> tuple["Algorithm", str | None]:
        """This algorithm sized for datasets of at most ``records`` records (the privacy audit's),
        and a sentence saying what changed (None: nothing changed).

        Parameters sized for the data's number of records (DualQuery's samples per round) may
        not run at all on a few records; an algorithm with such parameters overrides this with
        a documented rule. The default changes nothing.
        """
        return self, None

    def without_attributes(self, attrs) -> "Algorithm":
        """This algorithm for a domain without ``attrs`` (the privacy audit drops attributes left
        with a single value). Parameters naming attributes override this; the default is itself."""
        return self

    @classmethod
    def example(cls, domain: Domain) -> AlgorithmParams | None:
        """Small, fast parameters for ``domain`` (the conformance suite and the audit run them);
        None when the algorithm does not apply to such a domain."""
        return cls.Params()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


_NOTIONS = {"pure": "pure DP (accounting = \"pure\")", "approx": "(epsilon, delta)-DP (accounting = \"approx\")",
            "zcdp": "zCDP (accounting = \"zcdp\")"}
_KIND_WORDS = {"nonnegative": "non-negativity", "integer": "integrality", "structural_zeros": "structural zeros",
               "hierarchy": "hierarchies", "invariants": "invariants", "inequalities": "inequalities"}


def _checked_plan(plan):
    """Wrap an algorithm's ``plan``: refuse an accounting or a constraint kind it cannot honour, first."""
    @functools.wraps(plan)
    def checked(self, domain, constraints, budget):
        if not isinstance(budget, Budget):
            raise ParameterError(f"{self.name}.plan needs a Budget, got {type(budget).__name__}")
        if not isinstance(constraints, ConstraintSet) or constraints.domain != domain:
            raise ParameterError(f"{self.name}.plan needs a ConstraintSet over {domain}")
        self.check_budget(budget)
        self.check_constraints(constraints)
        return plan(self, domain, constraints, budget)

    return checked


def _affordable_first(run):
    """Wrap an algorithm's ``run``: refuse a plan the accountant cannot pay in full, before any draw.

    Each mechanism also charges before it samples, but a multi-step algorithm could otherwise
    draw for its first steps and only then run out; checking the plan's whole budget first
    means an over-budget run draws nothing at all.
    """
    @functools.wraps(run)
    def checked(self, plan, data, accountant, rng):
        if not isinstance(plan, AlgorithmPlan):
            raise ParameterError(f"{self.name}.run needs the AlgorithmPlan of {self.name}.plan, got {type(plan).__name__}")
        if not isinstance(accountant, Accountant):
            raise ParameterError(f"{self.name}.run needs an Accountant, got {type(accountant).__name__}")
        needed = plan.budget.total
        if not accountant.can_afford(needed):
            raise BudgetExceededError(
                f"{self.name}: the plan spends {plan.budget.describe()}, which the accountant cannot afford "
                f"(remaining {accountant.remaining}); nothing was drawn")
        return run(self, plan, data, accountant, rng)

    return checked


def constraint_kinds(constraints: ConstraintSet) -> set[str]:
    """The :data:`CONSTRAINT_KINDS` a constraint set declares."""
    kinds = {"nonnegative": "nonnegative", "integer": "integer", "structural_zero": "structural_zeros",
             "hierarchy": "hierarchy", "invariant": "invariants", "inequality": "inequalities"}
    return {kinds[c.kind] for c in constraints if c.kind in kinds}


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _close(word: str, choices) -> str:
    match = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# ---- the registry ----------------------------------------------------------------------------------
def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: add an :class:`Algorithm` subclass to :data:`REGISTRY` under its name and aliases."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ParameterError(f"register: {cls!r} is not an Algorithm subclass")
    for attr in ("name", "title", "reference"):
        if not isinstance(getattr(cls, attr, None), str) or not getattr(cls, attr):
            raise ParameterError(f"register: {cls.__name__}.{attr} must be a non-empty string")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, AlgorithmParams)):
        raise ParameterError(f"register: {cls.__name__}.Params must subclass AlgorithmParams")
    bad = [a for a in cls.accountings if a not in ACCOUNTINGS]
    if bad or not cls.accountings:
        raise ParameterError(f"register: {cls.__name__}.accountings must be drawn from {list(ACCOUNTINGS)}")
    bad = sorted(set(cls.supports) - set(CONSTRAINT_KINDS))
    if bad:
        raise ParameterError(f"register: {cls.__name__}.supports names unknown kinds {bad}")
    for name in (cls.name, *cls.aliases):
        owner = REGISTRY.get(name) or REGISTRY.get(_ALIASES.get(name, ""))
        if owner is not None and owner.__qualname__ != cls.__qualname__:
            raise ParameterError(f"register: the name {name!r} is already taken by {owner.__name__}")
    REGISTRY[cls.name] = cls
    for alias in cls.aliases:
        _ALIASES[alias] = cls.name
    return cls


def unregister(name: str) -> None:
    """Remove an algorithm (for tests that register a toy one)."""
    cls = REGISTRY.pop(name, None)
    if cls is not None:
        for alias in cls.aliases:
            _ALIASES.pop(alias, None)


#: The module of every built-in algorithm, by registered name, in the registry's listing order.
#: A module is imported (and registers its class) when its algorithm is first asked for
#: (:func:`get_algorithm`); :func:`registered_names` imports them all. Importing all of them for
#: every run cost the quickstart 0.05-0.1 CPU-s with bytecode caches, ~0.4 s without (issue #30).
BUILTIN_MODULES: dict[str, str] = {
    "auto": "dpopt.algorithms.auto",
    "barak": "dpopt.algorithms.barak",
    "dualquery": "dpopt.algorithms.dualquery",
    "measure_reconstruct": "dpopt.algorithms.measure_reconstruct",
    "marginal_space": "dpopt.algorithms.marginal_space",
    "matrix_mechanism": "dpopt.algorithms.matrix_mechanism",
    "mwem": "dpopt.algorithms.mwem",
    "mwem_factored": "dpopt.algorithms.mwem_factored",
    "polynomial": "dpopt.algorithms.polynomial",
    "topdown": "dpopt.algorithms.topdown",
}
#: The built-in algorithms' aliases (their classes' ``aliases``), known before their modules load.
BUILTIN_ALIASES: dict[str, str] = {
    "workload": "auto", "measure-and-reconstruct": "measure_reconstruct", "matrix-mechanism": "matrix_mechanism",
    "top-down": "topdown",
}


def registered_names() -> list[str]:
    """Every registered name (built-in algorithms loaded first, listed in :data:`BUILTIN_MODULES`'
    order, then the others in their order of registration)."""
    _load_builtin()
    return [n for n in BUILTIN_MODULES if n in REGISTRY] + [n for n in REGISTRY if n not in BUILTIN_MODULES]


def algorithm_names() -> list[str]:
    """Every name and alias :func:`get_algorithm` accepts, without importing any algorithm."""
    names = list(BUILTIN_MODULES) + [n for n in REGISTRY if n not in BUILTIN_MODULES]
    return names + list(dict.fromkeys([*BUILTIN_ALIASES, *_ALIASES]))


def get_algorithm(name: str) -> type[Algorithm]:
    """The registered class of ``name`` (or of an alias); ParameterError listing the registered ones.

    A built-in algorithm's module is imported here, at its first use, and no other."""
    key = name
    if isinstance(name, str):
        key = _ALIASES.get(name) or BUILTIN_ALIASES.get(name, name)
        if key not in REGISTRY and key in BUILTIN_MODULES:
            _load_builtin(key)
    if key in REGISTRY:
        return REGISTRY[key]
    _load_builtin()
    known = list(REGISTRY) + list(_ALIASES)
    raise ParameterError(f"unknown algorithm {name!r}{_close(name, known)}; registered: {', '.join(sorted(REGISTRY))}")


def _load_builtin(name: str | None = None) -> None:
    """Import the module of the built-in algorithm ``name`` (None: of every one), which registers it."""
    import importlib

    for key in (BUILTIN_MODULES if name is None else (name,)):
        importlib.import_module(BUILTIN_MODULES[key])


# ---- shared steps of the algorithms ---------------------------------------------------------------
def measured_answers(measurements, counts: np.ndarray) -> dict[str, pd.DataFrame]:
    """For each measurement: its answers on the released table (``count``) next to the noisy ones (``noisy``)."""
    from dpopt.model.data import cells_frame
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


def marginal_answers(domain: Domain, counts: np.ndarray, marginals) -> dict[str, pd.DataFrame]:
    """Marginal tables read off a released table, keyed ``"a, b"`` (no ``noisy`` column: not measured)."""
    from dpopt.model.data import cells_frame
    from dpopt.model.queries import marginalize

    out = {}
    for attrs in marginals:
        attrs = domain.canonical(attrs)
        out[", ".join(attrs)] = cells_frame(domain.project(attrs), marginalize(counts, domain, attrs))
    return out


def round_release(x: np.ndarray, constraints: ConstraintSet, measurements=(), time_limit: float | None = None,
                  method: str = "auto"):
    """Round a fitted table when the constraints declare integrality: ``(counts, rounding, failure)``.

    By default controlled rounding (:func:`~dpopt.estimate.round_to_integers`): every measured
    answer stays at the floor or ceiling of its fitted value, so the release keeps the accuracy
    of the fit on the marginals people read (``method="cellwise"``: the per-cell L1 optimum).
    ``counts`` is int64 when rounded (float otherwise); ``rounding`` the rounding's result (None
    when not integral); ``failure`` a message when no integer table keeps the constraints (then
    ``counts`` is None).
    """
    from dpopt.estimate import round_to_integers

    if not constraints.integral:
        return np.asarray(x, dtype=np.float64), None, None
    measured = [m for m in measurements if m.query.is_integer] or None
    rounding = round_to_integers(x, constraints, measured=measured, method=method, time_limit=time_limit)
    if rounding.x is not None and rounding.incumbent and rounding.max_violation == 0.0:
        # Stopped short of its certified gap (time limit, local search): every constraint is
        # checked exactly, the gap and the reason are in the rounding's message and report.
        return np.rint(rounding.x).astype(np.int64), rounding, None
    if not rounding.success or rounding.x is None:
        status = getattr(rounding.status, "name", rounding.status)
        return None, rounding, f"integer rounding ended with status {status}: {rounding.message}"
    counts = np.rint(rounding.x)
    return counts.astype(np.int64), rounding, None


def check_marginals(value, name: str = "marginals"):
    """An order ``k >= 1`` or a non-empty tuple of non-empty attribute tuples (ParameterError otherwise)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 1:
            raise ParameterError(f"{name} must be an order k >= 1, got {value}")
        return int(value)
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not value:
        raise ParameterError(f"{name} must be an order k (integer >= 1) or a non-empty list of attribute "
                             f"lists, got {value!r}")
    for i, attrs in enumerate(value):
        if isinstance(attrs, str) or not isinstance(attrs, (tuple, list)) or not attrs:
            raise ParameterError(f"{name}[{i + 1}] must be a non-empty list of attribute names, got {attrs!r}")
        if len(set(attrs)) != len(attrs):
            raise ParameterError(f"{name}[{i + 1}] names an attribute twice: {list(attrs)}")
    return tuple(tuple(a) for a in value)
