"""The default release: measure declared queries with exact noise, then reconstruct under the constraints.

The plan of the design notes (§1), in three lines::

    y_i = Q_i x + z_i                                    # every [[measure]] table, its share of the budget
    x^  = argmin_x loss(Q x, y)  s.t. constraints(x)     # dpopt.estimate.reconstruct
    x   = round(x^)                                      # dpopt.estimate.round_to_integers, when integral

Each measurement gets the noise :func:`~dpopt.privacy.mechanisms.calibrate` derives from its
query's sensitivity and its exact share of the budget (discrete Laplace for pure ε, discrete
Gaussian under (ε, δ) or zCDP unless the spec asks for Laplace); the ledger sums exactly to the
budget by construction (shares summing to 1, :meth:`~dpopt.privacy.budget.Budget.shares`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from dpopt.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    AlgorithmPlan,
    PlannedMeasure,
    Release,
    make_release,
    measured_answers,
    register,
    round_release,
)
from dpopt.errors import DpoptError, ParameterError, SpecError, at_key
from dpopt.estimate.rounding import rounding_budget
from dpopt.estimate.status import Status
from dpopt.model.queries.base import LinearQuery
from dpopt.privacy.budget import MECHANISMS
from dpopt.privacy.mechanisms import calibrate, measure
from dpopt.spec.model import MeasureSpec, ReconstructSpec
from dpopt.spec.queries import QUERY_KINDS, build_query

#: Seconds a release may spend fitting and rounding when ``[reconstruct] time_limit`` is not set
#: (the rounding then also stays within its own budget, :func:`~dpopt.estimate.rounding.rounding_budget`).
#: A spec raises it with ``time_limit``. Every run ends (issue 24).
DEFAULT_RELEASE_TIME_LIMIT = 600.0

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.spec.table import SpecReader

__all__ = ["MeasureReconstruct", "MeasureReconstructParams"]


@dataclass(frozen=True)
class MeasureReconstructParams(AlgorithmParams):
    """The ``[[measure]]`` tables and the ``[reconstruct]`` settings.

    Attributes
    ----------
    measures : tuple of MeasureSpec
        Label, query (a spec :class:`~dpopt.spec.queries.QuerySpec` or any
        :class:`~dpopt.model.queries.base.LinearQuery`), mechanism (None: the accounting's
        natural noise, :meth:`~dpopt.privacy.budget.Budget.noise`) and exact share of the
        budget; the shares sum to exactly 1.
    reconstruct : ReconstructSpec
        Objective, backend and time limit of the consistency solve.
    """

    measures: tuple[MeasureSpec, ...] = ()
    reconstruct: ReconstructSpec = field(default_factory=ReconstructSpec)

    def validate(self) -> None:
        if not self.measures:
            raise ParameterError("measures: give at least one measurement")
        labels = set()
        for i, m in enumerate(self.measures):
            if not isinstance(m, MeasureSpec):
                raise ParameterError(f"measures[{i + 1}] must be a MeasureSpec, got {type(m).__name__}")
            if m.mechanism is not None and m.mechanism not in MECHANISMS:
                raise ParameterError(f"measures[{i + 1}].mechanism must be one of {list(MECHANISMS)} or None "
                                     f"(the accounting's natural noise), got {m.mechanism!r}")
            if not (isinstance(m.share, Fraction) and m.share > 0):
                raise ParameterError(f"measures[{i + 1}].share must be a positive Fraction, got {m.share!r}")
            if m.label in labels:
                raise ParameterError(f"measures[{i + 1}]: label {m.label!r} is used twice")
            labels.add(m.label)
        total = sum((m.share for m in self.measures), Fraction(0))
        if total != 1:
            raise ParameterError(f"measures: the shares sum to {total}, not exactly 1")

    def describe(self) -> str:
        rc = self.reconstruct
        return (f"{len(self.measures)} measurement{'s' if len(self.measures) != 1 else ''}, objective {rc.objective}"
                + (f", backend {rc.backend}" if rc.backend else ""))

    @classmethod
    def from_spec(cls, reader: "SpecReader") -> "MeasureReconstructParams":
        tables = reader.tables("measure", required=True)
        measures, labels = [], {}
        for t in tables:
            query = reader.query(t, QUERY_KINDS)
            mechanism = t.str("mechanism", required=True, choices=MECHANISMS)
            try:
                reader.budget.noise(mechanism)
            except DpoptError as exc:
                raise t.error(("mechanism",), str(exc)) from None
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
                f"spec{f' {ctx.source}' if ctx.source else ''}{at}, key 'measure[*].share': the budget shares of "
                f"the [[measure]] tables ({shares}) sum to {total} ({float(total):.6g}), not exactly 1")
        from dpopt.spec.sections import parse_reconstruct

        return cls(tuple(measures), parse_reconstruct(reader.table("reconstruct")))


@register
class MeasureReconstruct(Algorithm):
    """Measure the declared queries, then solve for the table that fits them best under the constraints."""

    name = "measure_reconstruct"
    aliases = ("measure-and-reconstruct",)
    title = "noisy measurement of declared queries, then consistency optimisation"
    reference = ("design notes §1; weighted least squares as in Hay, Rastogi, Miklau, Suciu (VLDB 2010) "
                 "and the 2020 Census TopDown (Abowd et al. 2022)")
    accountings = ("pure", "approx", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants", "inequalities"})
    sections = {
        "measure": ("label", "query", "attrs", "k", "attr", "mechanism", "share"),
        "reconstruct": ("objective", "backend", "time_limit"),
    }
    Params = MeasureReconstructParams

    def plan(self, domain, constraints, budget) -> AlgorithmPlan:
        entries = []  # (label, query, mechanism, share, path)
        for m in self.params.measures:
            if isinstance(m.query, LinearQuery):
                if m.query.domain != domain:
                    raise at_key(ParameterError(f"measure {m.label!r}: its query is over {m.query.domain}, "
                                                f"not {domain}"), m.path)
                queries = [("", m.query)]
            else:
                queries = build_query(m.query, domain, lambda path, msg: at_key(ParameterError(msg), path))
            mechanism = budget.noise(m.mechanism)
            for suffix, query in queries:
                entries.append((m.label + suffix, query, mechanism, m.share / len(queries), m.path))
        labels = [e[0] for e in entries]
        if len(set(labels)) != len(labels):
            dup = next(lab for lab in labels if labels.count(lab) > 1)
            raise at_key(ParameterError(f"two measurements are labelled {dup!r}; give distinct labels"), ("measure",))
        costs = budget.shares({e[0]: e[3] for e in entries})
        planned = []
        for label, query, mechanism, share, path in entries:
            try:
                law = calibrate(query, costs[label], mechanism)
            except DpoptError as exc:
                raise at_key(exc, path + ("mechanism",)) from None
            planned.append(PlannedMeasure(label, query, mechanism, share, costs[label], law, path=path))
        rc = self.params.reconstruct
        lines = [f"reconstruct: objective {rc.objective}, backend {rc.backend or 'default'}"
                 + (f", time limit {rc.time_limit:g} s" if rc.time_limit else "")
                 + (", then exact integer rounding" if constraints.integral else "")]
        return self.new_plan(domain, constraints, budget, steps=planned, measures=planned, lines=lines)

    def run(self, plan, data, accountant, rng) -> Release:
        from dpopt.estimate import reconstruct

        measurements = [measure(m.query, data, m.law, accountant, rng, label=m.label) for m in plan.measures]
        rc = self.params.reconstruct
        start = time.perf_counter()
        limit = rc.time_limit or DEFAULT_RELEASE_TIME_LIMIT
        result = reconstruct(measurements, plan.constraints, rc.objective, backend=rc.backend,
                             time_limit=limit, integer=False)
        if not result.success or result.x is None:
            status = result.status if isinstance(result.status, Status) else Status.NOT_SOLVED
            return make_release(self, plan, accountant, status=status, measurements=measurements,
                                reconstruction=result, info={"spec_key": ("reconstruct",)},
                                message=f"the {rc.objective} solve ({result.backend}) ended with status "
                                        f"{status.name}: {result.message}")
        left = max(limit - (time.perf_counter() - start), 1e-3)
        if rc.time_limit is None:  # the default limit: the rounding's own budget, within what is left
            n_answers = sum(m.query.num_rows for m in measurements)
            left = min(left, rounding_budget(plan.domain.size, n_answers))
        counts, rounding, failure = round_release(result.x, plan.constraints, measurements, left)
        if failure is not None:
            return make_release(self, plan, accountant, status=rounding.status, measurements=measurements,
                                reconstruction=result, rounding=rounding, message=failure,
                                info={"spec_key": ("constraints", "integer")})
        return make_release(self, plan, accountant, status=result.status, message=result.message, counts=counts,
                            answers=measured_answers(measurements, counts), measurements=measurements,
                            reconstruction=result, rounding=rounding)

    @classmethod
    def example(cls, domain):
        from dpopt.model.queries.marginal import Marginal

        attrs = domain.attrs
        pairs = [attrs[i:i + 2] for i in range(0, max(len(attrs) - 1, 1))][:3]
        measures = tuple(MeasureSpec(f"marginal({', '.join(a)})", Marginal(domain, a), None,
                                     Fraction(1, len(pairs))) for a in pairs)
        return cls.Params(measures)
