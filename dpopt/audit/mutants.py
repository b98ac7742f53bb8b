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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure, make_release
from dpopt.errors import ParameterError
from dpopt.estimate.status import Status
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity, Total
from dpopt.privacy.accountant import PrivacyCost
from dpopt.privacy.mechanisms import calibrate, measure
from dpopt.privacy.samplers import discrete_laplace

__all__ = ["ScaledNoise", "FloatLaplace", "DataZeros", "Uncharged", "MUTANTS"]


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
