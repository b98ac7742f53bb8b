"""A PL 94-171-like top-down release of the synthetic nation (:mod:`dpopt.datasets.national`).

The workload of every level (nation, state, county, tract): the detailed table (2,016 cells),
voting age × Hispanic origin × race (252 cells), the total and the group-quarters types; the
invariants: each state's population by voting age, published exactly (as the 2020 census
published state populations). The budget is a zCDP ρ split over the levels
(:data:`LEVEL_SHARES`) and, within a level, over the queries (:data:`QUERY_SHARES`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping

from dpopt.algorithms.topdown.algorithm import GeographySpec, LevelMeasure, TopDown, TopDownParams
from dpopt.algorithms.topdown.constraints import invariant_from_data
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.marginal import Marginal

__all__ = ["LEVEL_SHARES", "QUERY_SHARES", "pl94_measures", "pl94_algorithm"]

#: Share of the budget of each level (more to the small units, whose counts are small).
LEVEL_SHARES = {"nation": Fraction(1, 10), "state": Fraction(2, 10), "county": Fraction(3, 10),
                "tract": Fraction(4, 10)}
#: Share of a level's budget of each query.
QUERY_SHARES = {"detailed": Fraction(6, 10), "voting_age x hispanic x race": Fraction(2, 10),
                "total": Fraction(1, 10), "gq": Fraction(1, 10)}


def pl94_measures(chars, level_shares: Mapping[str, Fraction] = LEVEL_SHARES,
                  query_shares: Mapping[str, Fraction] = QUERY_SHARES) -> tuple[LevelMeasure, ...]:
    """The workload of every level, over the characteristics ``chars``."""
    queries = {"detailed": Identity(chars), "voting_age x hispanic x race": Marginal(chars, ("voting_age", "hispanic", "race")),
               "total": Total(chars), "gq": Marginal(chars, ("gq",))}
    return tuple(LevelMeasure(label, level, queries[label], None, Fraction(ls) * Fraction(qs))
                 for level, ls in level_shares.items() for label, qs in query_shares.items())


def pl94_algorithm(national, *, executor: str = "pool", workers: int | None = None, spark: str = "local[*]",
                   level_shares: Mapping[str, Fraction] = LEVEL_SHARES, progress: bool = False,
                   backend: str | None = None, rounding: str = "controlled", upward: bool = True) -> TopDown:
    """The registered algorithm set up for ``national`` (a :class:`~dpopt.datasets.national.NationalCensus`).

    The state invariants are computed from the confidential counts and published exactly:
    NOT private, on purpose (as :meth:`ConstraintSet.invariant_from_data`).
    """
    chars = national.characteristics
    invariant = invariant_from_data("state population by voting age", national.geography, "state",
                                    Marginal(chars, ("voting_age",)), national.tract_counts)
    params = TopDownParams(GeographySpec(geography=national.geography), pl94_measures(chars, level_shares),
                           executor=executor, workers=workers, spark=spark, invariants=(invariant,),
                           progress=progress, backend=backend, rounding=rounding, upward=upward)
    return TopDown(params)
