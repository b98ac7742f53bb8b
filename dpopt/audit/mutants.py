"""Planted bugs that check the auditor itself (never registered; for tests and benchmarks).

Each mutant is an :class:`~dpopt.algorithms.base.Algorithm` over a tiny domain, audited through
the same interface as the real algorithms. It measures the histogram with discrete Laplace
noise, as :mod:`dpopt.privacy.mechanisms` would, except for one planted bug:

``ScaledNoise(factor)``
    Noise calibrated for ``factor · ε`` while the ledger is charged ``ε``: the release is
    ``factor · ε``-DP, not ε-DP. ``factor = 1.05`` is *not* flagged at the default run count (a
    5% excess needs about 10^5 runs per dataset: the power limit), ``1.5`` is.
``FloatLaplace``
    The textbook floating-point Laplace mechanism: ``x + b·ln(U)`` with random sign, ``U`` a
    uniform double, every operation rounded to nearest (the naive rounding of IEEE
    arithmetic). The outputs are doubles whose least significant bits depend on the true
    count (Mironov, CCS 2012): an exact-value event flags it.
``DataZeros``
    Structural zeros derived from the data: cells that are empty in the data are released as
    exact zeros (the consistency step told they are impossible). An empty cell is then
    certain under one dataset and not under its neighbour.
``Uncharged``
    Correct noise, but the second of its two measurements is drawn without charging the
    accountant: only the ledger check can see it.

:class:`Planted` plants the same kinds of bug, and two more (a halved noise scale, one answer
without noise), in any registered algorithm's real run, through the privacy layer every
algorithm draws from (:data:`PLANTED_BUGS`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure, make_release
from dpopt.audit.targets import AuditTarget
from dpopt.errors import ParameterError
from dpopt.estimate.status import Status
from dpopt.model.constraints import StructuralZeros
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity, Total
from dpopt.privacy.accountant import Accountant, LedgerEntry, PrivacyCost
from dpopt.privacy.mechanisms import calibrate, measure
from dpopt.privacy.samplers import discrete_laplace

__all__ = ["ScaledNoise", "FloatLaplace", "DataZeros", "Uncharged", "MUTANTS", "Planted", "PLANTED_BUGS",
           "ZerosFromData"]


@dataclass(frozen=True)
class MutantParams(AlgorithmParams):
    """``factor``: the ε the noise is really calibrated for, relative to the claim (ScaledNoise)."""

    factor: Fraction = Fraction(1)

    def validate(self) -> None:
        if not isinstance(self.factor, Fraction) or self.factor <= 0:
            raise ParameterError(f"factor must be a positive Fraction, got {self.factor!r}")


class _Mutant(Algorithm):
    """Measure the histogram under a pure budget; subclasses plant one bug in :meth:`draw`."""

    title = "planted bug"
    reference = "dpopt.audit.mutants (a planted bug, not an algorithm)"
    accountings = ("pure",)
    Params = MutantParams

    def plan(self, domain, constraints, budget):
        query = Identity(domain)
        cost = budget.total
        law = calibrate(query, cost, "laplace")
        step = PlannedMeasure("histogram", query, "laplace", Fraction(1), cost, law)
        return self.new_plan(domain, constraints, budget, steps=[step], measures=[step])

    def run(self, plan, data, accountant, rng):
        (step,) = plan.measures
        measurements, values = self.draw(step, data, accountant, rng)
        return make_release(self, plan, accountant, status=Status.COMPLETED, message="mutant", counts=values,
                            measurements=measurements)

    def draw(self, step, data, accountant, rng):
        m = measure(step.query, data, step.law, accountant, rng, label=step.label)
        return [m], m.values

    @classmethod
    def example(cls, domain):
        return cls.Params()


class ScaledNoise(_Mutant):
    """Noise for ``factor · ε``, charged ``ε`` (module notes)."""

    name = "mutant_scaled_noise"

    def draw(self, step, data, accountant, rng):
        eps = step.law.cost.epsilon * self.params.factor
        wrong = replace(calibrate(step.query, PrivacyCost.pure(eps), "laplace"), cost=step.law.cost)
        m = measure(step.query, data, wrong, accountant, rng, label=step.label)
        return [m], m.values


class FloatLaplace(_Mutant):
    """Textbook floating-point Laplace noise (module notes)."""

    name = "mutant_float_laplace"

    def draw(self, step, data, accountant, rng):
        accountant.charge(step.law.cost, step.label, detail="float Laplace (planted bug)")
        true = step.query.answer(data).astype(np.float64)
        words = rng.words(2 * true.size)
        u = ((words[: true.size] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # uniform double in (0, 1]
        sign = np.where(words[true.size:] & np.uint64(1), 1.0, -1.0)
        values = true + sign * step.law.scale * np.log(u)
        m = Measurement(step.query, values, "laplace", step.law.scale, 2 * step.law.scale**2, step.law.cost,
                        step.label)
        return [m], values


class DataZeros(_Mutant):
    """Cells empty in the data released as exact zeros (module notes)."""

    name = "mutant_data_zeros"

    def draw(self, step, data, accountant, rng):
        m = measure(step.query, data, step.law, accountant, rng, label=step.label)
        empty = data.histogram() == 0  # the bug: a constraint read off the confidential data
        return [m], np.where(empty, 0.0, m.values)


class Uncharged(_Mutant):
    """Two measurements, the second never charged (module notes)."""

    name = "mutant_uncharged"

    def plan(self, domain, constraints, budget):
        halves = budget.shares({"histogram": 1, "total": 1})
        steps = []
        for label, query in (("histogram", Identity(domain)), ("total", Total(domain))):
            law = calibrate(query, halves[label], "laplace")
            steps.append(PlannedMeasure(label, query, "laplace", Fraction(1, 2), halves[label], law))
        return self.new_plan(domain, constraints, budget, steps=steps, measures=steps)

    def run(self, plan, data, accountant, rng):
        first, second = plan.measures
        m1 = measure(first.query, data, first.law, accountant, rng, label=first.label)
        noise = discrete_laplace(second.law.parameter, second.query.num_rows, rng)  # the bug: no charge
        m2 = Measurement(second.query, second.query.answer(data) + noise, "discrete_laplace", second.law.scale,
                         second.law.variance, second.law.cost, second.label)
        return make_release(self, plan, accountant, status=Status.COMPLETED, message="mutant",
                            counts=m1.values, answers={"total": _frame(m2.values)}, measurements=[m1, m2])


def _frame(values):
    import pandas as pd

    return pd.DataFrame({"count": np.asarray(values, dtype=np.float64)})


#: The mutants by name.
MUTANTS = {cls.name: cls for cls in (ScaledNoise, FloatLaplace, DataZeros, Uncharged)}


# ---- the same bugs planted in a real algorithm -----------------------------------------------------
#: Bugs :class:`Planted` can plant in any algorithm's run (module notes of :class:`Planted`).
PLANTED_BUGS = ("halved_scale", "unnoised_answer", "unnoised_last", "float_laplace", "data_zeros", "uncharged")


class Planted(AuditTarget):
    """A registered algorithm's target with one bug planted in the shared privacy layer, run by run.

    The bug is planted where every algorithm draws its noise, so the same bug can be planted in
    any algorithm without touching its code: every reference (in any ``dpopt`` module) to the
    samplers of :mod:`dpopt.privacy.samplers`, the exact exponential-mechanism draw of
    :mod:`dpopt.privacy.mechanisms` and the exponential-weights sampler of
    :mod:`dpopt.privacy.exp_weights` is swapped for a faulty one while a run lasts (in the
    worker process that runs it), then restored.

    ``halved_scale``
        Every noise draw at half its scale (discrete Laplace ``b/2``, discrete Gaussian
        ``σ/2``; the exponential mechanism and the exponential-weights sampler at twice their
        coefficient), charged as before: the release is about ``2ε``-DP.
    ``unnoised_answer``
        One answer of the first noisy measurement of each run is released without noise: the
        first answer the public constraints do not fix (:meth:`first_free_answer`). An answer
        whose cells are all structural zeros is 0 on every dataset the audit may test, and one
        in the span of published invariants is equal between neighbours: without noise either
        is a public value, not a leak. When every answer of that draw is fixed the bug does not
        apply (:attr:`not_applicable`).
    ``unnoised_last``
        The first answer of the *last* noisy draw of each run without noise (the number of
        draws is counted on the probe run). Where the first draw feeds nothing the release
        shows exactly (the polynomial release's record count, MWEM's first round, which later
        rounds overwrite), the last draw is an answer the release is built from directly.
    ``float_laplace``
        Discrete Laplace draws replaced by textbook floating-point ones (``b·ln(U)`` with a
        random sign, Mironov 2012); the measured answers then carry the true count's low bits.
    ``data_zeros``
        Cells the data leave empty declared structural zeros (a constraint read off the
        confidential data), planted where the algorithm decides its zeros: a rule
        (:class:`ZerosFromData`) added to the constraint set of the run's plan, which every
        algorithm that keeps structural zeros reads there -- the estimator's constraints
        (``measure_reconstruct``; ``topdown``, per unit), the support of MWEM's initial
        distribution, the record space of DualQuery's best response. Applies to the algorithms
        whose ``supports`` include ``"structural_zeros"`` (:attr:`applies`): the others (the
        polynomial release) accept no zero rule, so no step of theirs decides a zero.
    ``uncharged``
        The first charge of each run is skipped (the accountant is not told): only the ledger
        check sees it.

    Parameters
    ----------
    inner : AlgorithmTarget
    bug : str
        One of :data:`PLANTED_BUGS`.
    """

    def __init__(self, inner, bug: str) -> None:
        if bug not in PLANTED_BUGS:
            raise ParameterError(f"bug must be one of {PLANTED_BUGS}, got {bug!r}")
        self.inner, self.bug = inner, bug
        self.name, self.title = f"{inner.name} + {bug.replace('_', ' ')}", f"{inner.title} (planted bug)"
        self.domain, self.claim = inner.domain, inner.claim
        self.swaps = _references(_FAULTY)

    # the harness's view: that of the algorithm
    names = property(lambda self: self.inner.names)
    count_statistics = property(lambda self: self.inner.count_statistics)
    published_exactly = property(lambda self: self.inner.published_exactly)
    notes = property(lambda self: self.inner.notes)

    def steps(self) -> list:
        return self.inner.steps()

    def keeps_published(self, r: int, c: int) -> bool:
        return self.inner.keeps_published(r, c)

    def allowed_cells(self) -> list[int]:
        return self.inner.allowed_cells()

    def prepare(self, data, rng) -> None:
        self.inner.prepare(data, rng)
        if self.bug == "unnoised_last" and not hasattr(self, "draws"):
            state = {"count": 0}
            swapped = [(module, attr, original, _counting(original, state)) for module, attr, name, original
                       in self.swaps if name.startswith("dpopt.privacy.samplers.")]
            for module, attr, _, counting in swapped:
                setattr(module, attr, counting)
            try:
                self.inner._release(data, rng)
            finally:
                for module, attr, original, _ in swapped:
                    setattr(module, attr, original)
            self.draws = state["count"]

    @property
    def applies(self) -> bool:
        """Whether the bug has anything to act on in this algorithm (:attr:`not_applicable`)."""
        return self.not_applicable is None

    @property
    def not_applicable(self) -> str | None:
        """Why the bug has nothing to act on in this algorithm, or None when it has."""
        if self.bug == "unnoised_answer":
            index, why = self.first_free_answer()
            return why if index is None else None
        if self.bug == "data_zeros":
            algorithm = getattr(self.inner, "algorithm", None)
            if algorithm is None:
                return f"{self.inner.name} is not an algorithm's run: it has no constraint set to plant zeros in"
            supports = type(algorithm).supports
            if "structural_zeros" not in supports:
                kept = ", ".join(sorted(supports)) or "none"
                return (f"{algorithm.name} keeps no structural zeros (its supports: {kept}): no step of its "
                        "release decides that a cell is zero")
        return None

    def first_free_answer(self) -> tuple[int | None, str]:
        """The position in the first noise draw of the first answer no public constraint fixes,
        and which answer it is (``None`` and why, when every one is fixed).

        A probe run on the dataset with one record in every allowed cell (the default source: the
        match below does not depend on the noise drawn, and only the harness seeds) records the first draw;
        the release's measurement whose values minus its true answers equal that draw exactly is
        the one drawn (draws are integers: the match is exact). Its answer ``i`` is fixed when
        its query row, restricted to the allowed cells, is in the span of the published
        invariants' rows there (a zero row included: only structural zeros under it). Without
        a matching measurement, the first answer (position 0) is used and the text says so.
        """
        if hasattr(self, "_free"):
            return self._free
        from dpopt.model.data import Dataset
        from dpopt.privacy.randomness import SecureRandom

        domain, allowed = self.inner.domain, np.asarray(self.inner.allowed_cells(), dtype=np.int64)
        data = Dataset.from_histogram(np.bincount(allowed, minlength=domain.size).astype(np.int64), domain)
        state: dict = {}
        swapped = [(module, attr, original, _recording(original, state)) for module, attr, name, original
                   in self.swaps if name.startswith("dpopt.privacy.samplers.")]
        for module, attr, _, recording in swapped:
            setattr(module, attr, recording)
        try:
            release, _, _ = self.inner._release(data, SecureRandom())  # which answer it is needs no seed
        finally:
            for module, attr, original, _ in swapped:
                setattr(module, attr, original)
        noise = state.get("first")
        if noise is None or release is None:
            self._free = (0, "the first answer of the first noise draw (the probe run drew none or released nothing)")
            return self._free
        drawn = next((m for m in release.get("measurements") or []
                      if np.size(m.values) == noise.size
                      and np.array_equal(np.asarray(m.values, dtype=np.float64).ravel() - m.query.answer(data),
                                         noise)), None)
        if drawn is None:
            self._free = (0, "the first answer of the first noise draw (no released measurement matches it)")
            return self._free
        rows = drawn.query.columns(allowed).toarray()
        published = [q.columns(allowed).toarray() for _, q in getattr(self.inner, "invariants", [])]
        if published:
            A = np.vstack(published)
            rows = rows - (rows @ np.linalg.pinv(A)) @ A  # what the invariants leave undetermined
        free = np.flatnonzero(np.abs(rows).max(axis=1, initial=0.0) > 1e-9)
        label = getattr(drawn, "label", None) or "the first measurement"
        if free.size == 0:
            self._free = (None, f"every answer of the first noise draw ({label!r}) is fixed by the public "
                                "constraints (structural zeros, published invariants): without noise it is a "
                                "public value")
        else:
            self._free = (int(free[0]), f"answer {int(free[0])} of {label!r}, the first its public constraints "
                                        "do not fix")
        return self._free

    def run(self, data, rng):
        state = {"first": True, "count": 0, "last": getattr(self, "draws", 0)}
        if self.bug == "unnoised_answer":
            state["index"] = self.first_free_answer()[0] or 0
        swapped = [(module, attr, original, _FAULTY[name](original, self.bug, state))
                   for module, attr, name, original in self.swaps]
        charge = Accountant.charge
        if self.bug == "uncharged":
            def skip_first(accountant, cost, label, *, detail=None):
                if state.get("charge", True):
                    state["charge"] = False  # the bug: the first charge of the run never reaches the ledger;
                    # the caller gets the entry it expects (top-down composes in parallel from it)
                    return LedgerEntry(label, accountant.convert(cost), accountant.spent, detail, cost)
                return charge(accountant, cost, label, detail=detail)
            Accountant.charge = skip_first
        for module, attr, _, faulty in swapped:
            setattr(module, attr, faulty)
        extra = [ZerosFromData.of(data)] if self.bug == "data_zeros" else []  # the bug: zeros read off the data
        try:
            release, accountant, _ = self.inner._release(data, rng, extra)
        finally:
            for module, attr, original, _ in swapped:
                setattr(module, attr, original)
            Accountant.charge = charge
        return self.inner.statistics(release, accountant)


@dataclass(frozen=True, eq=False)
class ZerosFromData(StructuralZeros):
    """The planted ``data_zeros`` rule: every cell empty in the data is a structural zero.

    A :class:`~dpopt.model.constraints.StructuralZeros` whose pattern is a mask over every
    attribute, so each algorithm reads it where it reads the public zero rules
    (:meth:`~dpopt.model.constraints.ConstraintSet.zero_patterns`). Built from the
    confidential data: the bug, never a constraint a release may use.
    """

    predicate: object = "cells empty in the data"
    name: str = "zeros read off the data (planted bug)"
    mask: np.ndarray | None = None

    @classmethod
    def of(cls, data) -> "ZerosFromData":
        return cls(mask=np.asarray(data.histogram()).ravel() == 0)

    def pattern(self, domain):
        return tuple(domain.attrs), self.mask


def _halve_laplace(original, bug, state):
    def draw(scale, size, rng=None, **kw):
        if bug == "halved_scale":
            return original(Fraction(scale) / 2, size, rng, **kw)
        noise = original(scale, size, rng, **kw)
        if bug == "float_laplace":
            n = int(np.prod(size))
            words = rng.words(2 * n)
            u = ((words[:n] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
            sign = np.where(words[n:] & np.uint64(1), 1.0, -1.0)
            return (sign * float(scale) * np.log(u)).reshape(np.shape(noise))
        return _unnoised(noise, bug, state)
    return draw


def _halve_gaussian(original, bug, state):
    def draw(sigma2, size, rng=None, **kw):
        if bug == "halved_scale":
            return original(Fraction(sigma2) / 4, size, rng, **kw)
        return _unnoised(original(sigma2, size, rng, **kw), bug, state)
    return draw


def _unnoised(noise, bug, state):
    state["count"] = state.get("count", 0) + 1
    first = bug == "unnoised_answer" and state.get("first")
    last = bug == "unnoised_last" and state["count"] == state.get("last")
    if (first or last) and np.size(noise):
        state["first"] = False
        noise = np.array(noise, copy=True)
        noise.flat[state.get("index", 0) if first else 0] = 0  # the bug: one answer without noise
    return noise


def _recording(original, state):
    def draw(*args, **kw):
        noise = original(*args, **kw)
        state.setdefault("first", np.asarray(noise, dtype=np.float64).ravel().copy())
        return noise
    return draw


def _counting(original, state):
    def draw(*args, **kw):
        state["count"] += 1
        return original(*args, **kw)
    return draw


def _sharper(original, bug, state):
    def draw(scores_or_steps, coef, *args):
        return original(scores_or_steps, coef * 2 if bug == "halved_scale" else coef, *args)
    return draw


#: The noise sources :class:`Planted` swaps, by their defining module and name.
_FAULTY = {"dpopt.privacy.samplers.discrete_laplace": _halve_laplace,
           "dpopt.privacy.samplers.discrete_gaussian": _halve_gaussian,
           "dpopt.privacy.mechanisms._exact_exponential_draw": _sharper,
           "dpopt.privacy.exp_weights.sample_exp_weights": _sharper}


def _references(faulty) -> list[tuple]:
    """``(module, attribute, source name, original)`` of every ``dpopt`` module attribute that is one
    of the noise sources (modules import them by name: each such binding is swapped)."""
    import importlib
    import sys

    originals = {}
    for name in faulty:
        module, attr = name.rsplit(".", 1)
        originals[id(getattr(importlib.import_module(module), attr))] = name
    out = []
    for modname, module in list(sys.modules.items()):
        if not modname.startswith("dpopt.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and id(value) in originals:
                out.append((module, attr, originals[id(value)], value))
    return out
