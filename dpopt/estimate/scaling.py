"""Scaling a consistency problem before any solver sees it.

Solvers work to tolerances of about 1e-8 *relative to the numbers they are given*. A
release at ε = 10^-9 has counts near 10^10; one at ε = 100 has noise variances near
10^-87, so weights ``1/σ²`` near 10^87. Passed as they are, such problems make interior-point
solvers stop early with "optimal" points that are far from the optimum, or report a feasible
problem infeasible (issue 13). Two steps, applied by :func:`prepare` to every problem that
:func:`dpopt.estimate.reconstruct` solves:

1. **Units.** Every count (answers, invariant values, inequality bounds) is divided by a
   power of two ``s`` close to the largest of them, so that the engines and solvers see
   numbers of order one. Dividing by a power of two is exact in floating point. Each
   objective's minimiser simply scales with ``s``: for L2, L1 and L-infinity the
   standardised residuals ``(Q x − y)/σ`` do not change, and the entropy and smooth
   objectives are built from them and from relative quantities. The engines normalise the
   weights ``1/σ`` themselves (dividing by their largest value), which changes no minimiser.
2. **Resolution.** A noisy measurement whose standard deviation is below
   :data:`RESOLUTION` times ``s`` asks for agreement finer than a solver can resolve among
   counts of that size. It is imposed as an exact equality (an invariant) instead, and the
   result lists it in ``info["exact_by_resolution"]``. If those equalities contradict the
   constraints (two such measurements of the same total that disagree, a negative value
   under non-negativity), they stay measurements with their standard deviation raised to
   the floor ``RESOLUTION · s`` (``info["variance_floored"]``): the weights then span what
   a solver can handle, and the estimate is the weighted compromise.

The result is mapped back to the original units by :func:`dpopt.estimate.reconstruct`,
which also recomputes the objective, the residual tables and the checks there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpopt.errors import InconsistentConstraintsError
from dpopt.estimate.problem import ConsistencyProblem, unique_invariant_name
from dpopt.model.constraints import ConstraintSet, Invariant, LinearInequality
from dpopt.model.measurement import Measurement

__all__ = ["RESOLUTION", "Prepared", "count_scale", "prepare"]

#: Smallest noise standard deviation, relative to the problem's count scale, that is kept
#: as a weighted measurement (solvers resolve about 1e-8 of the numbers they are given).
RESOLUTION = 1e-7


@dataclass
class Prepared:
    """A problem ready for the engines: counts divided by ``scale``, precise measurements as equalities."""

    problem: ConsistencyProblem
    scale: float
    exact_by_resolution: list[str] = field(default_factory=list)
    variance_floored: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One sentence for the result's message ('' when nothing was changed but the units)."""
        parts = []
        if self.exact_by_resolution:
            parts.append(f"measurement(s) {self.exact_by_resolution} imposed as exact equalities: their noise "
                         f"standard deviation is below {RESOLUTION:g} of the count scale {self.scale:g}, finer than "
                         "a solver resolves")
        if self.variance_floored:
            parts.append(f"measurement(s) {self.variance_floored} kept with their standard deviation raised to "
                         f"{RESOLUTION * self.scale:g} (as exact equalities they contradict the constraints)")
        return "; ".join(parts)


def count_scale(problem: ConsistencyProblem) -> float:
    """A power of two near the largest count of the problem (1 when every count is 0)."""
    largest = 0.0
    for m in getattr(problem, "noisy", ()):
        largest = max(largest, float(np.abs(m.values).max(initial=0.0)))
    for inv in problem.constraints.invariants:
        largest = max(largest, float(np.abs(inv.values).max(initial=0.0)))
    for ineq in problem.constraints.inequalities:
        for bound in (ineq.lower, ineq.upper):
            finite = np.abs(bound[np.isfinite(bound)])
            largest = max(largest, float(finite.max(initial=0.0)))
    if not (largest > 0 and math.isfinite(largest)):
        return 1.0
    return float(2.0 ** round(math.log2(largest)))


def prepare(problem: ConsistencyProblem) -> Prepared:
    """The scaled problem the engines solve (see the module notes)."""
    scale = count_scale(problem)
    floor = RESOLUTION * scale
    precise = [m for m in problem.noisy if m.stddev < floor]
    constraints = _scaled_constraints(problem.constraints, scale)
    measurements = []
    for m in problem.measurements:
        if m.variance == 0:
            continue  # already an invariant of problem.constraints
        values = m.values / scale
        if any(m is p for p in precise):
            name = unique_invariant_name(f"{m.label} (exact: noise below resolution)", constraints)
            constraints.add(Invariant(m.query, values, name=name))
        else:
            measurements.append(_scaled_measurement(m, scale))
    prepared = Prepared(ConsistencyProblem(measurements, constraints, problem.objective), scale,
                        [m.label for m in precise])
    if precise and prepared.problem.constraints.invariants:
        try:
            prepared.problem.constraints.check()
        except InconsistentConstraintsError:
            measurements = [_scaled_measurement(m, scale, floor=floor) for m in problem.noisy]
            prepared = Prepared(ConsistencyProblem(measurements, _scaled_constraints(problem.constraints, scale),
                                                   problem.objective), scale, [], [m.label for m in precise])
    return prepared


def _scaled_measurement(m: Measurement, scale: float, floor: float = 0.0) -> Measurement:
    stddev = max(m.stddev, floor)
    return Measurement(m.query, m.values / scale, m.noise, m.scale / scale, (stddev / scale) ** 2, m.cost, m.label,
                       m.info)


def _scaled_constraints(cs: ConstraintSet, scale: float) -> ConstraintSet:
    out = []
    for c in cs.constraints:
        if isinstance(c, Invariant):
            c = Invariant(c.query, np.asarray(c.values, dtype=np.float64) / scale, name=c.name, from_data=c.from_data)
        elif isinstance(c, LinearInequality):
            c = LinearInequality(c.query, c.lower / scale, c.upper / scale, name=c.name)
        out.append(c)
    return ConstraintSet(cs.domain, out)
