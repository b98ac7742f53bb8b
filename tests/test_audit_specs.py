"""Every shipped spec (``models/*.toml``) can be audited, and its verdict says what it rests on.

Parametrised over the files, so a spec added to ``models/`` is audited by this test unchanged: a
spec the audit cannot plan on its audit domain (a geography left without children, a query over
an encoded domain, a game sized for half a million records) fails CI.

Time-boxed by its size: 40 runs per dataset of one pair, no screening, one worker (about 4 s of
CPU per spec, 15 s for the top-down census). At this size the test certifies only gross leaks
(20 test runs detect no excess with 95% probability, and the verdict says so); the outcomes it
accepts are NO VIOLATION FOUND, and an EXACT DISCLOSURE of the record count by an algorithm that
says it treats the count as public (MWEM, DualQuery) and passes the audit conditional on it.
``examples/benchmarks/bench_audit.py specs`` audits the same specs at 1,000 runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpopt.audit.report import EXACT_DISCLOSURE, NO_VIOLATION
from dpopt.audit.spec import audit_spec
from dpopt.audit.targets import MAX_AUDIT_CELLS

MODELS = Path(__file__).resolve().parents[1] / "models"
#: The CI size (module notes).
CI = dict(runs=40, screen_runs=0, keep_pairs=1, max_pairs=4, workers=1, seed=1)


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_spec_is_audited_and_its_verdict_names_its_assumptions(path):
    report = audit_spec(path, **CI)
    text = "\n".join(report.lines())
    assert report.ledger_ok and report.ledger_runs == sum(report.runs.values()), text
    assert report.settings["possible_cells"] <= 16 and report.settings["domain_cells"] <= MAX_AUDIT_CELLS
    assert report.verdict.startswith(report.outcome), text
    assert report.outcome in (NO_VIOLATION, EXACT_DISCLOSURE), text
    if report.published_exactly:  # invariants from the data: the first words say the verdict rests on them
        first = report.verdict.split(":")[0]
        assert f"assuming the published invariants ({', '.join(report.published_exactly)}) are public" in first
    if report.outcome == EXACT_DISCLOSURE:
        assert set(report.exact_disclosures) <= {"count total", "records total", "released"}, text
        assert any("treated as public" in note for note in report.notes), text
        assert report.conditional is not None and report.conditional.passed, text
        assert report.conditional.verdict.startswith("NO VIOLATION FOUND, assuming the record count is public")
    else:
        assert report.passed and "test runs per dataset" in report.verdict, text
