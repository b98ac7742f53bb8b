"""``dpopt audit SPEC``: a user's spec audited on tiny datasets over its domain, never on its data."""

from __future__ import annotations

import json

import pytest

from dpopt.audit.spec import audit_dir, audit_spec, downscale
from dpopt.cli import main
from dpopt.model.domain import Domain

SPEC = """
name = "tiny"
[domain.attributes]
a = ["x", "y"]
b = 2
c = 3
[data]
source = "file"
path = "people.csv"
[privacy]
accounting = "pure"
epsilon = 1.0
[[measure]]
label = "a x b"
query = "marginal"
attrs = ["a", "b"]
mechanism = "laplace"
share = 0.5
[[measure]]
label = "c"
query = "marginal"
attrs = ["c"]
mechanism = "laplace"
share = 0.5
[constraints]
nonnegative = true
structural_zeros = [{ where = "a == 'y' and c == 2", name = "no y at c 2" }]
invariants = [{ name = "a totals", query = "marginal", attrs = ["a"], from_data = true }]
"""


@pytest.fixture
def spec_file(tmp_path):
    (tmp_path / "people.csv").write_text("this file is not data: the audit never reads it\n")
    path = tmp_path / "tiny.toml"
    path.write_text(SPEC)
    return path


def test_dpopt_audit_prints_the_claim_the_bound_and_writes_the_report(spec_file, tmp_path, capsys):
    out = tmp_path / "audit"
    status = main(["audit", str(spec_file), "--runs", "40", "--domain-limit", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "claimed: epsilon = 2" in printed  # invariants published exactly: one moved record, two steps
    verdict = next(line for line in printed.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: NO VIOLATION FOUND, assuming the published invariants (a totals) are public")
    assert "group guarantee of epsilon = 1 over two add/remove steps" in verdict
    assert "epsilon lower bound:" in printed and "event:" in printed and "down-scaled from 12 to" in printed
    assert "4 of them possible" in printed
    data = json.loads((out / "report.json").read_text())
    assert data["relation"] == "move" and data["published_exactly"] == ["a totals"]
    assert data["settings"]["domain_cells"] == 4 and data["ledger"]["ok"]
    assert (out / "plots" / "output_distributions.png").is_file() and (out / "summary.md").is_file()


def test_the_audit_keeps_the_spec_constraints_and_never_reads_the_data(spec_file, monkeypatch):
    from dpopt.model.data import Dataset

    def refuse(*args, **kwargs):
        raise AssertionError("the audit read the spec's data")

    monkeypatch.setattr(Dataset, "from_csv", classmethod(refuse))
    monkeypatch.setattr(Dataset, "from_parquet", classmethod(refuse))
    report = audit_spec(spec_file, runs=40, domain_limit=12, max_records=1, workers=1)
    assert report.settings["domain_cells"] == 12 and report.passed
    for text in (report.pair["a"], report.pair["b"]):
        assert "a=y, b=0, c=2" not in text and "a=y, b=1, c=2" not in text  # the structural zero holds


def test_downscale_keeps_the_first_values_of_every_attribute_in_balance():
    domain = Domain.from_dict({"s": ["A", "B", "C"], "t": 4, "u": 2})
    small, note = downscale(domain, 8)
    assert small.size <= 8 and small.sizes == (2, 2, 2) and small.labels["s"] == ("A", "B")
    assert "down-scaled from 24 to 8 cells, 8 of them possible" in note
    assert downscale(domain, 24) == (domain, None)


def test_runs_auto_and_its_options_are_parsed(spec_file, tmp_path, capsys, monkeypatch):
    import dpopt.audit.harness as harness

    monkeypatch.setattr(harness, "MIN_TEST_RUNS", 20)  # the floors scaled down: this test checks the wiring
    monkeypatch.setattr(harness, "MIN_SCREEN_RUNS", 4)
    out = tmp_path / "auto"
    status = main(["audit", str(spec_file), "--runs", "auto", "--excess", "2", "--time-budget", "0.01",
                   "--domain-limit", "4", "--workers", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    lines = printed.splitlines()
    estimate = next(i for i, line in enumerate(lines) if line.startswith("  about "))
    sizing = next(i for i, line in enumerate(lines) if line.startswith("  test: "))
    verdict = next(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    assert estimate < sizing < verdict  # the time estimate first, then the test's size, then the result
    # a budget of 0.6 s: the screening and the search shrink to their floors, and the estimate says it overruns
    assert "more than the budget: it runs anyway" in lines[estimate]
    data = json.loads((out / "report.json").read_text())
    assert data["settings"]["runs"] == "auto" and data["settings"]["excess"] == 2.0
    assert data["settings"]["screen_runs"] == 4 and data["settings"]["search_runs"] == 40
    assert data["test"]["runs_a"] == 20


def test_the_default_output_directory_sits_beside_the_release(spec_file):
    from dpopt.spec import load_spec

    assert str(audit_dir(load_spec(spec_file))).endswith("tiny-audit")


def test_bad_options_are_usage_errors(spec_file, capsys):
    for bad in (["--runs", "2"], ["--runs", "many"], ["--excess", "0"], ["--time-budget", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["audit", str(spec_file), *bad])
        assert exc.value.code == 2 and bad[0] in capsys.readouterr().err
