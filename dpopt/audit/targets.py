"""What the harness audits: a randomised map from a tiny dataset to a vector of output statistics.

:class:`AuditTarget` is the harness's only view of what it audits. :class:`AlgorithmTarget`
wraps any registered :class:`~dpopt.algorithms.base.Algorithm` through its interface alone
(``plan`` once, ``run`` on every dataset with a fresh accountant and the harness's seeded
source); the statistics are read from the :class:`~dpopt.algorithms.base.Release`: every
released count, every released answer (``count``, and ``noisy`` where the algorithm publishes
it), the histogram of released records, and their totals. Nothing here knows one algorithm from
another.

Every run is also checked against the ledger (:func:`ledger_problem`): the accountant must
have spent exactly the claimed budget, and every noisy measurement in the release must have a
charge of its own.
"""

from __future__ import annotations

import abc
from collections import Counter

import numpy as np

from dpopt.audit.claims import Claim
from dpopt.audit.neighbours import cell_labels, hot_cells
from dpopt.errors import DpoptError, ParameterError
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.accountant import Accountant, PrivacyCost
from dpopt.privacy.budget import Budget

__all__ = ["AuditTarget", "AlgorithmTarget", "ReleaseStatistics", "ledger_problem", "MAX_AUDIT_CELLS"]

#: The harness refuses domains with more cells than this (it enumerates datasets over the cells).
MAX_AUDIT_CELLS = 256


class AuditTarget(abc.ABC):
    """A randomised map ``dataset -> output statistics`` with a privacy claim.

    Attributes
    ----------
    name, title : str
    domain : Domain
        A tiny domain: datasets are histograms over its cells.
    claim : Claim
        The guarantee under the add/remove relation.
    names : list of str
        The statistics, in the order of :meth:`run`'s vector (set by :meth:`prepare`).
    count_statistics : set of str
        Statistics equal to the record count when published exactly (what the ``move``
        relation keeps fixed).
    """

    name: str = "target"
    title: str = ""
    domain: Domain
    claim: Claim
    names: list[str]
    count_statistics: frozenset = frozenset()

    def steps(self) -> list:
        """Planned spending steps (their queries' column norms pick the adversarial cells)."""
        return []

    def hot_cells(self) -> tuple[list[int], list[str]]:
        return hot_cells(self.domain, self.steps())

    def keeps_published(self, r: int, c: int) -> bool:
        """Whether moving a record from cell ``r`` to ``c`` keeps every statistic published exactly."""
        return True

    def allowed_cells(self) -> list[int]:
        """Cells a record may lie in (all but the public structural zeros)."""
        return list(range(self.domain.size))

    @property
    def published_exactly(self) -> list[str]:
        """Statistics the target publishes exactly by declaration (for the report)."""
        return []

    def prepare(self, data: Dataset, rng) -> None:
        """Fix the statistics' layout from one probe run (called once, before sampling)."""

    @abc.abstractmethod
    def run(self, data: Dataset, rng) -> tuple[np.ndarray, str | None]:
        """One run: the statistics, and a ledger problem (None when the ledger is right)."""

    def describe(self) -> str:
        return f"{self.name}: {self.title}" if self.title else self.name


def ledger_problem(accountant: Accountant, claimed: PrivacyCost, measurements=()) -> str | None:
    """What is wrong with a run's ledger, or None.

    The ledger must sum exactly to the claimed budget (no step skipped its charge, none spent
    beyond it), and every noisy measurement must have been charged under its label (a
    measurement whose label is a charged label plus ``":..."`` counts as charged: a split of it).
    """
    needed = accountant.convert(claimed)
    spent = accountant.spent
    names = [n for n in ("epsilon", "delta", "rho") if getattr(needed, n) is not None]
    if any((getattr(spent, n) or 0) != (getattr(needed, n) or 0) for n in names):
        got = ", ".join(f"{n} = {getattr(spent, n) or 0}" for n in names)
        want = ", ".join(f"{n} = {getattr(needed, n) or 0}" for n in names)
        return f"the ledger spends {got}, not the claimed {want}"
    charged = Counter(e.label for e in accountant.ledger)
    for m in measurements:
        label = getattr(m, "label", None)
        if label is None:
            continue
        if charged[label] == 0 and not any(label.startswith(f"{c}:") for c in charged):
            return f"measurement {label!r} drew noise without a charge of its own in the ledger"
    return None


class ReleaseStatistics:
    """The output statistics of a :class:`~dpopt.algorithms.base.Release`, in a fixed layout.

    The layout comes from a probe release: its table (one statistic per cell, and the total),
    each answer table's ``count`` and ``noisy`` columns (one statistic per row), its measurement
    transcript when it has one (the noisy answer of every draw:
    :mod:`dpopt.algorithms.transcript`), and the
    histogram of its records over the domain (and their number). A run that releases nothing
    (a failed solve) gives zeros and ``released = 0``: failing is an output too.
    """

    def __init__(self, domain: Domain, probe) -> None:
        self.domain = domain
        self.cells = cell_labels(domain)
        names = ["released"]
        self.parts: list[tuple] = []
        if probe.get("counts") is not None:
            self.parts.append(("counts", None, domain.size))
            names += [f"count[{c}]" for c in self.cells] + ["count total"]
        for label in sorted(probe.get("answers") or {}):
            frame = probe["answers"][label]
            rows = _row_labels(frame)
            for col in ("count", "noisy"):
                if col in frame.columns:
                    self.parts.append(("answers", (label, col), len(frame)))
                    names += [f"answer '{label}' {col}[{r}]" for r in rows]
        transcript = probe.get("transcript")  # the noisy answers drawn (dpopt.algorithms.transcript)
        if transcript is not None:
            from dpopt.algorithms.transcript import TRANSCRIPT_STATISTICS

            for col in TRANSCRIPT_STATISTICS:
                self.parts.append(("transcript", col, len(transcript)))
                names += [f"transcript {col}[{i}]" for i in range(len(transcript))]
        if probe.get("records") is not None:
            self.parts.append(("records", None, domain.size))
            names += [f"records[{c}]" for c in self.cells] + ["records total"]
        self.names = names
        self.count_statistics = frozenset({"count total", "records total"})

    def values(self, release) -> np.ndarray:
        out = [1.0 if release is not None and release.get("success", False) else 0.0]
        for kind, key, size in self.parts:
            if out[0] == 0.0:
                out.append(np.zeros(size + (1 if kind in ("counts", "records") else 0)))  # their totals
                continue
            if kind == "counts":
                v = np.asarray(release["counts"], dtype=np.float64).ravel()
                out.append(np.append(v, v.sum()))
            elif kind == "answers":
                label, col = key
                frame = (release.get("answers") or {}).get(label)
                v = np.zeros(size) if frame is None else frame[col].to_numpy(dtype=np.float64)
                out.append(v)
            elif kind == "transcript":
                frame = release.get("transcript")
                out.append(np.zeros(size) if frame is None else frame[key].to_numpy(dtype=np.float64))
            else:
                records = release.get("records")
                h = (np.zeros(size) if records is None or len(records) == 0
                     else Dataset.from_frame(records, self.domain).histogram().astype(np.float64))
                out.append(np.append(h, h.sum()))
        flat = np.concatenate([np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in out])
        if flat.size != len(self.names):
            raise ParameterError(f"a release has {flat.size} output statistics where the first had {len(self.names)}; "
                                 "the audit needs a fixed output layout")
        return flat


def _row_labels(frame) -> list[str]:
    keys = [c for c in frame.columns if c not in ("count", "noisy") and frame[c].dtype.kind not in "fc"]
    if not keys:
        return [str(i) for i in range(len(frame))]
    return [", ".join(f"{k}={v}" for k, v in zip(keys, row)) for row in frame[keys].itertuples(index=False)]


class AlgorithmTarget(AuditTarget):
    """A registered algorithm's full pipeline (``plan`` then ``run``), through its interface only.

    Parameters
    ----------
    algorithm : Algorithm
        With its parameters (e.g. ``cls(cls.example(domain))``).
    domain : Domain
        A tiny domain (at most :data:`MAX_AUDIT_CELLS` cells).
    budget : Budget
    constraints : ConstraintSet, optional
        Public constraints (default none).
    invariants : sequence of (name, LinearQuery)
        Statistics published exactly from each dataset (``invariant_from_data``); the audit then
        keeps them equal between neighbours (``move`` relation).
    """

    def __init__(self, algorithm, domain: Domain, budget: Budget, constraints: ConstraintSet | None = None,
                 invariants=(), name: str | None = None) -> None:
        if domain.size > MAX_AUDIT_CELLS:
            raise ParameterError(f"the audit domain has {domain.size} cells; at most {MAX_AUDIT_CELLS} "
                                 "(down-scale it: fewer values per attribute)")
        self.algorithm = algorithm
        self.domain = domain
        self.budget = budget
        self.constraints = constraints if constraints is not None else ConstraintSet(domain)
        self.invariants = list(invariants)
        self.plan = algorithm.plan(domain, self.constraints, budget)
        self.claim = Claim.of(budget)
        self.claimed_cost = budget.total
        self.name = name or algorithm.name
        self.title = getattr(algorithm, "title", "")
        self.layout: ReleaseStatistics | None = None
        self.notes: list[str] = []
        self._plans: dict = {}
        self._columns = [q.columns(np.arange(domain.size)).toarray() for _, q in self.invariants]

    def steps(self) -> list:
        return list(self.plan.steps)

    def keeps_published(self, r: int, c: int) -> bool:
        return all(np.array_equal(cols[:, r], cols[:, c]) for cols in self._columns)

    def allowed_cells(self) -> list[int]:
        return [int(c) for c in np.flatnonzero(~np.asarray(self.constraints.zero_mask(), dtype=bool).ravel())]

    @property
    def published_exactly(self) -> list[str]:
        return [name for name, _ in self.invariants]

    @property
    def names(self) -> list[str]:
        return self.layout.names if self.layout is not None else []

    @property
    def count_statistics(self) -> frozenset:
        return self.layout.count_statistics if self.layout is not None else frozenset()

    def _plan_for(self, data: Dataset):
        if not self.invariants:
            return self.plan
        key = tuple(data.histogram())
        if key not in self._plans:
            cs = ConstraintSet(self.domain, list(self.constraints.constraints))
            for name, query in self.invariants:
                cs.invariant_from_data(query, data, name)
            self._plans[key] = self.plan.with_constraints(cs)
        return self._plans[key]

    def _release(self, data: Dataset, rng, extra=()):
        """One run on ``data``; ``extra`` constraints are added to the plan's (a planted bug's hook:
        :class:`~dpopt.audit.mutants.Planted` with ``data_zeros``)."""
        accountant = self.budget.accountant()
        plan = self._plan_for(data)
        if extra:
            plan = plan.with_constraints(ConstraintSet(self.domain, list(plan.constraints.constraints) + list(extra)))
        try:
            release = self.algorithm.run(plan, data, accountant, rng)
        except DpoptError as exc:  # a run that stops with an error releases nothing: an output too
            return None, accountant, str(exc)
        return release, accountant, None

    def prepare(self, data: Dataset, rng) -> None:
        if self.layout is not None:
            return
        release, _, error = self._release(data, rng)
        if release is None or not release.success:
            raise ParameterError(f"{self.name}: the probe run released nothing "
                                 f"({error or release.message}); cannot read its output statistics")
        self.layout = ReleaseStatistics(self.domain, release)
        self.notes = list(release.get("notes") or [])

    def run(self, data: Dataset, rng) -> tuple[np.ndarray, str | None]:
        return self.statistics(*self._release(data, rng)[:2])

    def statistics(self, release, accountant) -> tuple[np.ndarray, str | None]:
        """A run's statistics and ledger problem, from its release (None: it released nothing)."""
        values = self.layout.values(release)
        if release is None:
            return values, None
        return values, ledger_problem(accountant, self.claimed_cost, release.get("measurements") or [])
