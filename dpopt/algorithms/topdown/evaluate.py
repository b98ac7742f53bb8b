"""Errors of a top-down release against the confidential counts, by level and unit size. NOT private.

Small units suffer most: a tract's counts are small next to the noise, a state's are not.
:func:`error_by_unit_size` gives the mean absolute error per cell of every level, for units
grouped by their true population (deciles by default), of the released tables, of the noisy
detailed measurements the release came from, and of any other release given (e.g.
:func:`bottom_up`, the noisy leaves summed up, at the same budget). For testing and
benchmarks only: it reads the confidential data.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import scipy.sparse as sp

from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.model.queries.basic import Identity
from dpopt.privacy.budget import Budget

__all__ = ["error_by_unit_size", "bottom_up"]


def error_by_unit_size(geography: Geography, leaf_counts: sp.spmatrix, releases: dict, *, groups: int = 10
                       ) -> pd.DataFrame:
    """Mean absolute error per cell, by level and by unit population group. NOT private.

    Parameters
    ----------
    geography : Geography
    leaf_counts : sparse matrix (leaves × cells)
        The confidential counts.
    releases : dict of str to dict of str to ndarray
        Per method (e.g. ``"top-down"``, ``"noisy"``, ``"bottom-up"``), per level name, a
        (units × cells) table; a level may be missing for a method.
    groups : int
        Population quantile groups per level (10: deciles; fewer when a level has fewer units).

    Returns
    -------
    DataFrame
        One row per level and group: ``level, group, units, population_min, population_max``
        and per method ``mae_<method>`` (mean absolute error per cell) and
        ``error_per_person_<method>`` (the absolute errors summed over the group's cells, per
        person of the group: what small units suffer from).
    """
    truth = geography.level_histograms(leaf_counts)
    rows = []
    for k, name in enumerate(geography.names):
        true = truth[k].toarray()
        population = true.sum(axis=1)
        g = min(groups, population.size)
        rank = np.argsort(np.argsort(population, kind="stable"), kind="stable")
        group = rank * g // population.size
        for j in range(g):
            members = group == j
            row = {"level": name, "group": j + 1, "units": int(members.sum()),
                   "population_min": int(population[members].min()), "population_max": int(population[members].max())}
            persons = max(float(population[members].sum()), 1.0)
            for method, tables in releases.items():
                table = tables.get(name)
                if table is not None:
                    error = np.abs(np.asarray(table)[members] - true[members])
                    row[f"mae_{method}"] = float(error.mean())
                    row[f"error_per_person_{method}"] = float(error.sum() / persons)
            rows.append(row)
    return pd.DataFrame(rows)


def bottom_up(geography: Geography, chars: Domain, leaf_counts: sp.spmatrix, budget: Budget, rng,
              mechanism: str | None = None) -> dict:
    """The baseline: every leaf's detailed table measured with the whole budget, summed up the tree.

    Returns ``{level name: noisy table (units × cells)}``; the tables are consistent by
    construction (sums) but neither non-negative nor integral-constrained beyond the noise's.
    """
    from dpopt.algorithms.topdown.engine import LevelQuery, measure_level
    from dpopt.privacy.mechanisms import calibrate

    query = Identity(chars)
    mechanism = budget.noise(mechanism)
    law = calibrate(query, budget.total, mechanism)
    leaf = geography.depth - 1
    q = LevelQuery(leaf, "detailed", query, law, Fraction(1), f"{geography.names[-1]}: detailed (bottom-up)")
    noisy = measure_level(q, sp.csr_matrix(leaf_counts), chars, budget.accountant(), rng, geography.names[-1])
    return {name: np.asarray(geography.aggregation(k) @ noisy) if k < leaf else noisy
            for k, name in enumerate(geography.names)}
