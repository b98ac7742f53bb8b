"""The noisy record count of MWEM, factored MWEM and DualQuery (``count_share``), which lets the
audit audit them unconditionally: the plan, the ledger, the spec key and the release's notes.

The audit side (no exact disclosure with the count) is in
``tests/algorithms/test_audit_conformance.py``; here the count's own law is checked against its
closed form (a discrete Laplace count of scale ``1/(share·ε)``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpopt.algorithms.dualquery import DualQuery
from dpopt.algorithms.mwem import MWEM
from dpopt.algorithms.mwem_factored import FactoredMWEM
from dpopt.algorithms.record_count import COUNT_LABEL, check_count_share
from dpopt.errors import ParameterError, SpecError
from dpopt.model.constraints import ConstraintSet, Integrality, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom
from dpopt.spec import parse_spec

DOMAIN = Domain.from_dict({"a": 2, "b": 2})
DATA = Dataset.from_histogram(np.array([30, 5, 0, 12]), DOMAIN)
TENTH = Fraction(1, 10)


def algorithms():
    return [(MWEM(marginals=2, rounds=3, select="block", count_share=TENTH), Budget.pure(1)),
            (MWEM(marginals=2, rounds=3, select="block", count_share=TENTH), Budget.zcdp(Fraction(1, 2))),
            (FactoredMWEM(ways=2, rounds=3, select="block", count_share=TENTH), Budget.pure(1)),
            (DualQuery(order=2, eta=Fraction(1, 10), rounds=3, samples=None, count_share=TENTH),
             Budget.approx(1, Fraction(1, 10**6)))]


@pytest.mark.parametrize("algorithm, budget", algorithms(), ids=["mwem", "mwem-zcdp", "mwem_factored", "dualquery"])
def test_the_count_is_planned_first_charged_first_and_the_ledger_sums_to_the_budget(algorithm, budget):
    cs = ConstraintSet(DOMAIN, [NonNegativity(), Integrality()])
    plan = algorithm.plan(DOMAIN, cs, budget)
    assert plan.steps[0].label == COUNT_LABEL and plan.steps[0].share == TENTH
    assert sum(s.share for s in plan.steps) == 1
    accountant = budget.accountant()
    release = algorithm.run(plan, DATA, accountant, SeededRandom(3))
    ledger = accountant.ledger
    assert ledger[0].label == COUNT_LABEL
    assert accountant.spent == accountant.convert(budget.total)  # exactly the budget, count included
    assert release.measurements[0].label == COUNT_LABEL
    noted = release.notes[0]
    assert noted.startswith("The record count was measured with noise") and "treated as public" not in noted
    if release.get("counts") is not None:
        n = int(noted.split("used n = ")[1].split(" ")[0])
        assert int(np.sum(release.counts)) == n  # the released total is the noisy count


def test_the_default_keeps_the_papers_public_n_and_says_so():
    accountant = Budget.pure(1).accountant()
    algorithm = MWEM(marginals=2, rounds=3, select="block")
    plan = algorithm.plan(DOMAIN, ConstraintSet(DOMAIN, [Integrality()]), Budget.pure(1))
    release = algorithm.run(plan, DATA, accountant, SeededRandom(3))
    assert all(s.label != COUNT_LABEL for s in plan.steps)
    note = release.notes[0]
    assert note.startswith("The record count n = 47 is treated as public") and "count_share" in note
    assert int(np.sum(release.counts)) == 47


def test_the_noisy_count_has_the_discrete_laplace_law_of_its_share():
    """Its variance is that of a discrete Laplace of scale b = 1/(share·ε): 2e^{-1/b}/(1 - e^{-1/b})^2."""
    from dpopt.privacy.mechanisms import measure

    algorithm = MWEM(marginals=1, rounds=1, select="block", count_share=Fraction(1, 2))
    step = algorithm.plan(DOMAIN, ConstraintSet(DOMAIN), Budget.pure(1)).steps[0]
    assert step.law.scale == pytest.approx(2.0)
    rng = SeededRandom(7)
    draws = np.array([measure(step.query, DATA, step.law, Budget.pure(1).accountant(), rng,
                              label=COUNT_LABEL).values[0] for _ in range(4000)]) - 47
    q = np.exp(-1 / 2.0)
    assert abs(draws.mean()) < 0.15
    assert draws.var() == pytest.approx(2 * q / (1 - q) ** 2, rel=0.08)


def test_count_share_is_a_spec_key_with_clear_errors():
    raw = {"name": "m", "domain": {"attributes": {"a": 2, "b": 2}}, "data": {"source": "file"},
           "privacy": {"accounting": "pure", "epsilon": 1}, "algorithm": "mwem",
           "mwem": {"marginals": 2, "count_share": 0.05}}
    assert parse_spec(raw).algorithm.params.count_share == Fraction(1, 20)
    with pytest.raises(SpecError, match="count_share"):
        parse_spec({**raw, "mwem": {"marginals": 2, "count_share": 1.5}})
    with pytest.raises(ParameterError, match="count_share must be in"):
        check_count_share(0)
    with pytest.raises(ParameterError, match="not both"):
        DualQuery(order=2, rounds=3, samples=None, records=100, count_share=TENTH)


def test_an_exact_count_of_a_release_that_measured_it_is_a_finding_not_the_papers_public_n():
    """With count_share the release does not declare its count public: an exact count (here an
    unnoised count, planted) fails the audit, whatever the audit conditional on it finds. Every pair
    is kept: the first pair (no record against one) uses n = 1 on both sides (the count is at least 1)."""
    from dpopt.audit import AlgorithmTarget, audit
    from dpopt.audit.mutants import Planted
    from dpopt.audit.report import EXACT_DISCLOSURE

    cs = ConstraintSet(DOMAIN, [NonNegativity(), Integrality()])
    target = AlgorithmTarget(MWEM(marginals=2, rounds=2, select="block", count_share=TENTH), DOMAIN, Budget.pure(1), cs)
    report = audit(Planted(target, "unnoised_answer"), runs=40, screen_runs=0, keep_pairs=4, max_pairs=4, workers=1,
                   seed=1)
    assert report.outcome == EXACT_DISCLOSURE and not report.passed, report.verdict
    assert not report.count_declared_public
    assert "the release notes do not say the record count is public" in report.verdict
