"""A privacy audit of every registered algorithm's full pipeline, through its interface only.

Parametrised over :data:`dpopt.algorithms.REGISTRY`: an algorithm registered later is audited
by this same test, unchanged. Each runs its ``example`` parameters on a 4-cell binary domain
under its first accounting, on neighbouring datasets of at most one record (all of them, plus
the adversarial pairs of its planned queries), with a small run budget sized for CI (about a
tenth of a minute per algorithm on one core; ~8 algorithms stay under 3 minutes on 2 cores).

What it can see at this size (stated, not hidden): 100 test runs per dataset certify at most
ε ≈ 3.3 (0 hits against 100), so the test flags gross leaks only -- an output fixed by the data
(a data-dependent zero, an exact statistic), a missing noise term -- not a noise scale a few
tens of percent off; ``examples/benchmarks/bench_audit.py`` runs the long audit. Every run's
ledger is checked exactly. A record count published exactly is accepted only when the release
tells its reader so in its notes (MWEM treats n as public, as in its paper) and the audit
conditional on the record count passes.
"""

from __future__ import annotations

import pytest

from dpopt.algorithms import REGISTRY
from dpopt.audit import AlgorithmTarget, audit
from dpopt.model.domain import Domain
from tests.algorithms.test_conformance import BUDGETS

DOMAIN = Domain.from_dict({"a0": 2, "a1": 2})
#: The CI run budget (module notes).
CI = dict(runs=200, screen_runs=16, max_records=1, max_pairs=6, keep_pairs=1, workers=1, seed=18)


def algorithm_cases():
    for name, cls in REGISTRY.items():
        params = cls.example(DOMAIN)
        if params is None:
            yield pytest.param(name, None, marks=pytest.mark.skip(reason=f"{name} has no example on a binary domain"))
        else:
            yield pytest.param(name, params, id=name)


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_every_registered_algorithm_passes_a_privacy_audit(name, params):
    cls = REGISTRY[name]
    budget = BUDGETS[cls.accountings[0]]
    report = audit(AlgorithmTarget(cls(params), DOMAIN, budget), **CI)
    text = "\n".join(report.lines())
    assert report.ledger_ok and report.ledger_runs == sum(report.runs.values()), text
    assert report.claim.describe() and report.total_runs >= 2 * CI["runs"]
    count_only = set(report.exact_disclosures) <= {"count total", "records total", "released"}
    if report.flagged and report.exact_disclosures and count_only:
        assert any("record count" in note.lower() and "public" in note.lower() for note in report.notes), (
            f"{name} publishes the record count exactly without telling its reader:\n{text}")
        assert report.conditional is not None and report.conditional.passed, text
    else:
        assert not report.exact_disclosures, text
        assert report.passed, text
