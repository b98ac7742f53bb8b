"""Candidate events, the event search and the neighbouring datasets of the audit."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest

from dpopt.audit.events import Event, exact_disclosures, search_events
from dpopt.audit.neighbours import add_remove_pairs, cell_labels, hot_cells, limit_pairs, move_pairs
from dpopt.model.domain import Domain
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.mechanisms import calibrate
from dpopt.privacy.accountant import PrivacyCost


def test_a_shifted_statistic_is_found_by_a_threshold_event_in_the_right_direction():
    gen = np.random.default_rng(0)  # synthetic samples for the search, not privacy noise
    # On a grid of 2^-20: a shifted float sample would differ in its low bits too, itself a (Mironov) leak.
    a = np.round(gen.normal(0, 1, (2000, 3)) * 2**20) / 2**20
    b = np.round(gen.normal(0, 1, (2000, 3)) * 2**20) / 2**20
    b[:, 1] += 1.0
    best = search_events(a, b, ["x", "y", "z"])[0]
    assert best.larger == "b" and best.bound > 0.5
    assert best.event.kind in ("ge", "score_ge") and ("y" in best.event.label)
    assert best.event.hits(b).mean() > best.event.hits(a).mean()


def test_an_exact_value_event_separates_floating_point_noise_from_integers_plus_it():
    gen = np.random.default_rng(1)
    noise = gen.laplace(0, 2, 4000)
    a = noise[:2000, None]            # true answer 0: the noise's own bits
    b = 1.0 + noise[2000:, None]      # true answer 1: the sum is rounded to the grid of 1 + noise
    best = search_events(a, b, ["answer"])[0]
    assert best.event.kind in ("grid", "offgrid") and best.bound > 2
    ints = np.round(noise)[:, None]
    assert all(c.event.kind not in ("grid", "offgrid") for c in search_events(ints[:2000], ints[2000:] + 1, ["n"]))


def test_event_kinds_select_the_right_rows():
    X = np.array([[0.0], [1.0], [2.5], [3.0]])
    assert Event("ge", 0, 2.5).hits(X).tolist() == [False, False, True, True]
    assert Event("le", 0, 1.0).hits(X).tolist() == [True, True, False, False]
    assert Event("eq", 0, 3.0).hits(X).tolist() == [False, False, False, True]
    assert Event("in", 0, values=(0.0, 2.5)).hits(X).tolist() == [True, False, True, False]
    assert Event("grid", 0, 0).hits(X).tolist() == [True, True, False, True]
    assert Event("offgrid", 0, 1).hits(X).tolist() == [False, False, False, False]
    score = Event("score_ge", -1, 0.0, weights=((1.5,), (2.0,)))
    assert score.hits(X).tolist() == [False, False, True, True]


def test_exact_disclosures_are_statistics_constant_on_each_side_and_different_across():
    a = np.array([[1.0, 5.0, 1.0], [1.0, 6.0, 1.0 + 1e-12]])
    b = np.array([[2.0, 5.0, 2.0], [2.0, 7.0, 2.0]])
    assert exact_disclosures(a, b, ["n", "noisy", "float total"]) == ["n", "float total"]
    assert exact_disclosures(a, a, ["n", "noisy", "float total"]) == []


def _small_hists(m, size):
    return {tuple(np.bincount(c, minlength=m)) for s in range(size + 1)
            for c in itertools.combinations_with_replacement(range(m), s)}


def test_add_remove_pairs_cover_every_small_dataset_and_differ_by_one_record():
    domain = Domain.from_dict({"a": 2, "b": 2})
    hot, why = hot_cells(domain, [])
    pairs = add_remove_pairs(domain, 2, hot, why)
    for p in pairs:
        diff = np.asarray(p.b) - np.asarray(p.a)
        assert (np.abs(diff).sum() == 1) and diff.min() >= -1
    small = _small_hists(4, 1)  # every dataset of fewer than max_records records ...
    assert len(small) == sum(comb(4 + s - 1, s) for s in range(2))
    for base in small:  # ... with each of the 4 records added
        for c in range(4):
            plus = tuple(v + (i == c) for i, v in enumerate(base))
            assert any({p.a, p.b} == {base, plus} for p in pairs)


def test_adversarial_cells_are_those_attaining_the_planned_sensitivity():
    domain = Domain.from_dict({"a": 2, "b": 3})

    class Step:
        def __init__(self, query, mechanism):
            self.query, self.label = query, query.name
            self.law = calibrate(query, PrivacyCost.pure(1), mechanism)

    # Total and a marginal: every column has norm 1, so every cell attains it.
    cells, _ = hot_cells(domain, [Step(Marginal(domain, ("a",)), "laplace")])
    assert sorted(cells) == list(range(6))
    # A hand-made query whose columns differ: only cell 4's column reaches the maximum.
    from dpopt.model.queries.explicit import SparseQuery

    q = SparseQuery(domain, np.array([[1, 0, 0, 0, 2, 0], [0, 1, 0, 0, 1, 0]]))
    cells, why = hot_cells(domain, [Step(q, "laplace")])
    assert cells == [4] and "L1 sensitivity" in why[0]


def test_move_pairs_keep_the_record_count_and_the_invariant_columns_and_the_allowed_cells():
    domain = Domain.from_dict({"a": 2, "b": 2})
    cols = Marginal(domain, ("a",)).columns(np.arange(4)).toarray()
    keep = lambda r, c: np.array_equal(cols[:, r], cols[:, c])  # noqa: E731
    pairs = move_pairs(domain, 2, keep, [], allowed=[0, 1, 3])
    assert pairs
    for p in pairs:
        a, b = np.asarray(p.a), np.asarray(p.b)
        assert a.sum() == b.sum() and np.abs(a - b).sum() == 2
        assert np.array_equal(cols @ a, cols @ b)  # the published marginal is the same
        assert a[2] == 0 and b[2] == 0  # no record in a cell a structural zero rules out


def test_limit_pairs_keeps_adversarial_pairs_first_and_samples_the_rest_reproducibly():
    domain = Domain.from_dict({"a": 4})
    hot, why = hot_cells(domain, [])
    pairs = add_remove_pairs(domain, 3, hot, why)
    kept, how = limit_pairs(pairs, 10, seed=1)
    again, _ = limit_pairs(pairs, 10, seed=1)
    assert len(kept) == 10 and kept == again and "of" in how
    assert kept[0].why.startswith("adversarial")


def test_cell_labels_use_value_labels():
    assert cell_labels(Domain.from_dict({"sex": ["F", "M"], "k": 2}))[3] == "sex=M, k=1"


@pytest.mark.parametrize("query", [Total, Identity])
def test_hot_cells_for_gaussian_steps_use_squared_l2_norms(query):
    domain = Domain.from_dict({"a": 3})

    class Step:
        label = "s"
        law = calibrate(query(domain), PrivacyCost.zcdp(1), "gaussian")

    Step.query = query(domain)
    cells, why = hot_cells(domain, [Step()])
    assert cells == [0, 1, 2] and "L2" in why[0]
