"""Audit configurations (dpopt.audit.configurations) and what they let the audit catch.

The planted bugs (dpopt.audit.mutants.Planted) go into real algorithms configured as an auditor
would (few rounds, a noisy record count, the budget in few released statistics); the audits are
seeded and small, each a few CPU seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.audit import audit
from dpopt.audit.configurations import AUDIT_CONFIGURATIONS, MAIN, configurations, configured_spec
from dpopt.audit.events import Event, search_events, table_totals
from dpopt.audit.mutants import Planted
from dpopt.audit.neighbours import hot_cells
from dpopt.audit.report import EXACT_DISCLOSURE
from dpopt.audit.spec import spec_target
from dpopt.errors import ParameterError
from dpopt.model.domain import Domain


@pytest.mark.parametrize("algorithm, key", [(a, k) for a in sorted(AUDIT_CONFIGURATIONS) for k in configurations(a)])
def test_every_configuration_plans_on_its_audit_domain_with_a_small_claim(algorithm, key):
    target, _, _ = spec_target(configured_spec(algorithm, key))
    assert target.algorithm.name == algorithm
    if configurations(algorithm)[key].replace:  # the quickstart is audited as shipped (state totals published)
        assert target.claim.epsilon <= 1.0 + 1e-12 and not target.published_exactly  # add/remove: not doubled


def test_an_unknown_algorithm_or_configuration_is_refused():
    with pytest.raises(ParameterError, match="no audit configuration for 'nope'"):
        configured_spec("nope")
    with pytest.raises(ParameterError, match="'topdown' has no audit configuration 'nope'; choose from main, no-zeros"):
        configured_spec("topdown", "nope")


def test_topdown_without_structural_zeros_lets_a_record_in_every_cell_of_its_geography():
    """The second top-down configuration: only the state-county hierarchy rules cells out."""
    assert list(configurations("topdown")) == [MAIN, "no-zeros"]
    main, _, _ = spec_target(configured_spec("topdown"))
    free, _, _ = spec_target(configured_spec("topdown", "no-zeros"))
    rules = {type(c).__name__ for c in free.constraints.zero_rules}
    assert rules == {"Hierarchy"} and "StructuralZeros" in {type(c).__name__ for c in main.constraints.zero_rules}
    geo = free.domain.size_of("state") * free.domain.size_of("county")
    assert len(free.allowed_cells()) == free.domain.size // geo * free.domain.size_of("county")


def test_table_totals_are_the_sums_of_each_answer_table():
    names = ["released", "count[a=0]", "count total", "answer 'm' count[a=0]", "answer 'm' count[a=1]",
             "answer 'one' count[x]", "answer 'm' noisy[a=0]", "answer 'm' noisy[a=1]"]
    G, labels = table_totals(names)
    assert labels == ["answer 'm' count total", "answer 'm' noisy total"]  # a one-row table has no total of its own
    X = np.arange(16, dtype=float).reshape(2, 8)
    assert np.array_equal(X @ G, np.stack([X[:, 3] + X[:, 4], X[:, 6] + X[:, 7]], axis=1))
    assert table_totals(names[:3]) == (None, [])


def test_an_event_on_a_table_total_reads_the_raw_statistics():
    """Two cells each shifted by one (a record added): their total is the statistic that moves;
    the event the search returns on it is evaluated on the raw statistics."""
    gen = np.random.default_rng(2)
    names = ["answer 't' count[0]", "answer 't' count[1]"]
    noise = gen.integers(-1, 2, (400, 2)).astype(float)
    a, b = noise[:200] + [1.0, 0.0], noise[200:] + [0.0, 1.0]  # the record moves between the cells: total equal
    c = noise[200:] + [1.0, 1.0]                                # one record more: the total moves by one
    best = search_events(a, c, names, keep=50, score=False)
    on_total = [e for e in best if e.event.label.startswith("answer 't' count total")]
    assert on_total and on_total[0].event.extend is not None
    ev: Event = on_total[0].event
    assert np.array_equal(ev.statistic(a), a.sum(axis=1))
    assert ev.hits(a).sum() == on_total[0].k_a and ev.hits(c).sum() == on_total[0].k_b
    assert search_events(a, b, names, keep=5, score=False)  # no error when the totals do not move


def test_without_named_cells_the_adversarial_pairs_start_at_the_first_and_last_cells():
    domain = Domain.from_dict({"a": 2, "b": 2, "c": 2})
    cells, why = hot_cells(domain, [])
    assert cells == [0, 7, 1, 6, 2, 5, 3, 4] and len(why) == 8


def _planted(algorithm, bug, runs, seed=0):
    target, _, _ = spec_target(configured_spec(algorithm))
    return audit(Planted(target, bug) if bug else target, runs=runs, workers=1, seed=seed)


def test_polynomial_halved_scale_is_caught_in_its_audit_configuration():
    """The whole budget in one released count: noise at half its scale is a loss of 2 on it (claim 1)."""
    report = _planted("polynomial", "halved_scale", 400)
    assert report.flagged and report.epsilon_lower_bound > 1.0


def test_polynomial_correct_release_passes_at_the_same_size():
    report = _planted("polynomial", None, 400)
    assert report.passed and report.epsilon_lower_bound <= 1.0


def test_polynomial_unnoised_answer_is_an_exact_disclosure_in_its_audit_configuration():
    report = _planted("polynomial", "unnoised_answer", 100)
    assert report.outcome == EXACT_DISCLOSURE and not report.passed
    assert any("disjunctions" in s for s in report.exact_disclosures)


def test_mwem_unnoised_answer_is_an_exact_disclosure_in_its_audit_configuration():
    """With a noisy record count MWEM's first draw is that count: without noise, the table's total is n."""
    report = _planted("mwem", "unnoised_answer", 100)
    assert report.outcome == EXACT_DISCLOSURE and not report.passed
    assert "count total" in report.exact_disclosures


@pytest.mark.slow
def test_mwem_halved_scale_is_caught_in_its_audit_configuration():
    """One round and a noisy count at 0.75 of the budget: the halved scale is a loss of 1.5 on the
    table's total alone (claim 1). Seeded; about 25 CPU seconds (the benchmark's 2,000 runs: 1.27)."""
    report = _planted("mwem", "halved_scale", 800)
    assert report.flagged and report.epsilon_lower_bound > 1.0


def test_topdown_correct_release_passes_without_structural_zeros():
    """The correct algorithm must pass every configuration: here no answer is fixed by edit rules,
    and nothing is disclosed. (A pass at 60 runs detects only large excesses; the benchmark's
    ``--bugs none`` row is the 2,000-run figure.)"""
    report = audit(spec_target(configured_spec("topdown", "no-zeros"))[0], runs=60, workers=1, seed=0)
    assert report.passed and not report.exact_disclosures
