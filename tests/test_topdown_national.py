"""The synthetic nation (dpopt.datasets.national) and the PL94-like top-down release on it, at a small scale."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpopt.algorithms.topdown.pl94 import LEVEL_SHARES, QUERY_SHARES, pl94_algorithm, pl94_measures
from dpopt.datasets.national import EDIT_RULES, generate_nation, national_characteristics, race_labels
from dpopt.errors import DomainError
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom


@pytest.fixture(scope="module")
def nation():
    return generate_nation(3, 12, 300_000, tract_size=4_000, seed=3)


def test_the_nation_has_the_declared_shape_and_geoid_codes(nation):
    g = nation.geography
    assert g.names == ("nation", "state", "county", "tract") and g.sizes[:3] == (1, 3, 12)
    assert abs(nation.persons - 300_000) < 3_000
    assert all(len(t) == 11 and t[:5] in set(g.units[2]) for t in g.units[3])
    assert nation.characteristics.size == 2016 and len(race_labels()) == 63
    assert nation.tract_counts.shape == (g.sizes[3], 2016)
    # units are the prefixes of their tracts' codes
    anc = g.ancestors()
    assert all(g.units[3][i].startswith(g.units[2][anc[2][i]]) for i in range(g.sizes[3]))


def test_the_edit_rules_hold_and_group_quarters_exist(nation):
    mask = nation.zero_mask()
    assert mask.sum() == 504  # 3 adult-only facility types x minors + juvenile x adults, x 2 x 63
    assert nation.tract_counts[:, mask].sum() == 0
    gq = national_characteristics().axis("gq")
    codes = national_characteristics().unravel(nation.tract_counts.tocoo().col)
    assert (codes[:, gq] > 0).any()
    assert len(EDIT_RULES) == 2


def test_the_same_seed_gives_the_same_nation(nation):
    again = generate_nation(3, 12, 300_000, tract_size=4_000, seed=3)
    assert (again.tract_counts != nation.tract_counts).nnz == 0
    other = generate_nation(3, 12, 300_000, tract_size=4_000, seed=4)
    assert other.tract_counts.shape != nation.tract_counts.shape or abs(other.tract_counts - nation.tract_counts).sum() > 0


def test_bad_arguments_are_refused():
    with pytest.raises(DomainError, match="num_counties \\(2\\) must be at least num_states \\(3\\)"):
        generate_nation(3, 2, 1000)
    with pytest.raises(DomainError, match="persons must be an integer >= 1"):
        generate_nation(3, 3, 0)


def test_the_pl94_release_is_consistent_from_tract_to_nation(nation):
    assert sum(m.share for m in pl94_measures(nation.characteristics)) == 1
    assert sum(LEVEL_SHARES.values()) == 1 and sum(QUERY_SHARES.values()) == 1
    budget = Budget.zcdp(Fraction(1, 2))
    algorithm = pl94_algorithm(nation, executor="serial")
    release = algorithm.run(algorithm.plan(nation.domain, nation.constraints(), budget), nation.dataset(),
                            budget.accountant(), SeededRandom(2))
    assert release.success
    assert release.counts.sum() == nation.persons  # the tract tables over the full (tract x 2,016 cells) domain
    tables = release.level_tables
    g = nation.geography
    for k in (1, 2, 3):
        sums = np.zeros_like(tables[g.names[k - 1]])
        np.add.at(sums, g.parents[k], tables[g.names[k]])
        assert np.array_equal(sums, tables[g.names[k - 1]])
    truth = nation.level_counts("state").toarray()
    va = national_characteristics().axis("voting_age")
    adult = national_characteristics().unravel(np.arange(2016))[:, va] == 1
    assert np.array_equal(tables["state"][:, adult].sum(axis=1), truth[:, adult].sum(axis=1))
    assert np.array_equal(tables["state"].sum(axis=1), truth.sum(axis=1))
    assert not tables["tract"][:, nation.zero_mask()].any()
    assert list(release.ledger["label"])[:4] == ["nation: detailed", "nation: voting_age x hispanic x race",
                                                 "nation: total", "nation: gq"]
    assert sum(release.ledger["rho"], Fraction(0)) == Fraction(1, 2)
    frame = release.level_frame("tract", cells="nonzero")
    assert frame["count"].sum() == tables["tract"].sum() and (frame["count"] > 0).all()
