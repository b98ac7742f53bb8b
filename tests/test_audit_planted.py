"""Planted bugs where real algorithms decide them (dpopt.audit.mutants.Planted).

``data_zeros`` is planted in the constraint set each algorithm reads its zeros from (the
estimator's, MWEM's support, DualQuery's record space, top-down's units), and is not applicable
to an algorithm that keeps no structural zeros. ``unnoised_answer`` removes the noise of the first
answer the public constraints do not fix. Audits are seeded and small (a few CPU seconds each);
the 2,000-run figures are ``examples/benchmarks/bench_audit.py planted``'s.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.algorithms import REGISTRY
from dpopt.audit import AlgorithmTarget, audit
from dpopt.audit.configurations import configured_spec
from dpopt.audit.mutants import Planted, ZerosFromData
from dpopt.audit.report import EXACT_DISCLOSURE
from dpopt.audit.spec import spec_target
from dpopt.model.constraints import ConstraintSet, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries.basic import Total
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom


def _target(algorithm, key="main"):
    target, _, _ = spec_target(configured_spec(algorithm, key))
    return target


def _two_records(target):
    """One record in the first and one in the last allowed cell."""
    allowed = target.allowed_cells()
    h = np.zeros(target.domain.size, dtype=np.int64)
    h[[allowed[0], allowed[-1]]] = 1
    return Dataset.from_histogram(h, target.domain), h


def test_zeros_from_data_is_a_structural_zero_rule_over_every_attribute():
    domain = Domain.from_dict({"a": 2, "b": 3})
    data = Dataset.from_histogram(np.array([1, 0, 2, 0, 0, 1]), domain)
    rule = ZerosFromData.of(data)
    cs = ConstraintSet(domain, [rule])
    assert cs.zero_rules == [rule]
    assert np.array_equal(cs.zero_mask(), [False, True, False, True, True, False])


@pytest.mark.parametrize("algorithm", ["measure_reconstruct", "mwem", "dualquery", "topdown"])
def test_data_zeros_reach_the_zeros_each_algorithm_decides(algorithm):
    """Planted in the run's constraint set, the zeros read off the data hold in the released
    table (every cell the data leave empty is 0, on every seed), where the correct release has
    mass there; the bug charges nothing, so the ledger is right."""
    target = _target(algorithm)
    data, h = _two_records(target)
    target.prepare(data, SeededRandom(0))
    cells = np.array([i for i, n in enumerate(target.names) if n.startswith("count[")])
    assert cells.size == target.domain.size
    mutant = Planted(target, "data_zeros")
    assert mutant.applies
    planted = [mutant.run(data, SeededRandom(s)) for s in range(3)]
    correct = np.array([target.run(data, SeededRandom(s))[0] for s in range(3)])
    assert all(problem is None for _, problem in planted)
    planted = np.array([values for values, _ in planted])
    assert np.all(planted[:, cells[h == 0]] == 0)
    assert np.any(correct[:, cells[h == 0]] != 0)


def test_data_zeros_do_not_apply_to_an_algorithm_that_keeps_no_structural_zeros():
    mutant = Planted(_target("polynomial"), "data_zeros")
    assert not mutant.applies
    assert "keeps no structural zeros" in mutant.not_applicable and "polynomial" in mutant.not_applicable


@pytest.mark.parametrize("algorithm, event", [("measure_reconstruct", "count["), ("mwem", "released")])
def test_data_zeros_are_caught_in_real_algorithms(algorithm, event):
    """The quickstart: a cell the data leave empty is an exact 0 in the fit (a record moved out of
    it makes it positive); MWEM: on the empty dataset every cell is ruled out and the run fails,
    which the correct MWEM never does."""
    report = audit(Planted(_target(algorithm), "data_zeros"), runs=60, workers=1, seed=0)
    assert report.outcome == EXACT_DISCLOSURE and not report.passed
    assert any(s.startswith(event) for s in report.exact_disclosures)


@pytest.mark.slow
def test_topdown_data_zeros_are_caught_in_its_audit_configuration():
    """On the empty dataset every unit's table is fitted to all-zero cells: the released table's
    total is 0 surely, against a positive total with one record. Seeded; about 40 CPU seconds."""
    report = audit(Planted(_target("topdown"), "data_zeros"), runs=200, workers=1, seed=0)
    assert report.flagged and report.epsilon_lower_bound > 1.0 and not report.passed


def test_unnoised_answer_skips_the_answers_structural_zeros_fix():
    """Top-down's first draw is the nation's detailed table; its first answers (age 0-14,
    householder or spouse) are ruled out by the census edit rules, so the bug removes the noise of
    the first one a record can change: it is then the true count on every run."""
    target = _target("topdown")
    mutant = Planted(target, "unnoised_answer")
    index, why = mutant.first_free_answer()
    assert index is not None and index > 0 and "'nation: detailed'" in why and mutant.applies
    data, _ = _two_records(target)
    target.prepare(data, SeededRandom(0))
    nation = next(m for m in target._release(data, SeededRandom(0))[0]["measurements"] if m.label == "nation: detailed")
    columns = nation.query.columns(np.arange(target.domain.size)).toarray()
    allowed = np.zeros(target.domain.size, dtype=bool)
    allowed[target.allowed_cells()] = True
    assert not columns[:index][:, allowed].any() and columns[index][allowed].any()
    rows = [i for i, n in enumerate(target.names) if n.startswith("answer 'level nation' noisy[")]
    truth = columns[index] @ data.histogram()
    planted = np.array([mutant.run(data, SeededRandom(s))[0][rows] for s in range(4)])
    correct = np.array([target.run(data, SeededRandom(s))[0][rows] for s in range(4)])
    assert np.all(planted[:, index] == truth) and np.any(correct[:, index] != truth)
    assert np.any(planted[:, 0] != 0)  # the structural zero's answer keeps its noise


def test_unnoised_answer_does_not_apply_when_public_constraints_fix_every_answer():
    """A histogram of two cells, one a structural zero, the total published: each answer of the
    one draw is fixed (the allowed cell's count is the total; the other is 0)."""
    domain = Domain.from_dict({"x": 2})
    cls = REGISTRY["measure_reconstruct"]
    histogram = cls(cls.example(domain))  # one measurement: the marginal on x, the histogram itself
    cs = ConstraintSet(domain, [StructuralZeros("x == 1", name="no x = 1")])
    target = AlgorithmTarget(histogram, domain, Budget.pure(1), cs, invariants=[("total", Total(domain))])
    mutant = Planted(target, "unnoised_answer")
    assert not mutant.applies and "fixed by the public constraints" in mutant.not_applicable
    free = Planted(AlgorithmTarget(histogram, domain, Budget.pure(1), cs), "unnoised_answer")
    assert free.applies and free.first_free_answer()[0] == 0  # without the total, cell 0's count is free
