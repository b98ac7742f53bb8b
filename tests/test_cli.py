"""The dpopt command end to end: the quickstart release, check, models, example-data, bad specs."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.datasets.census import (
    census_domain,
    county_parent,
    generate_census,
    state_totals,
    structural_zero_mask_of_records,
)
from dpopt.errors import DpoptError
from dpopt.release.outputs import read_released
from dpopt.spec import load_spec

REPO = Path(__file__).resolve().parents[1]

# Seeded runs here are tests of seeded runs: their NOT-private warning is expected (and tested in
# tests/test_bad_inputs.py).
pytestmark = pytest.mark.filterwarnings("ignore::dpopt.release.pipeline.NotPrivateWarning")
QUICKSTART = REPO / "models" / "quickstart.toml"


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """One quickstart release through the command line (seeded, with evaluation)."""
    base = tmp_path_factory.mktemp("cli")
    out = base / "release"
    status = main(["run", str(QUICKSTART), "--out", str(out), "--seed", "7", "--evaluate", "--quiet"])
    return status, out


def test_run_writes_every_output(released):
    status, out = released
    assert status == 0
    for name in ("release.csv", "release.parquet", "synthetic.csv", "synthetic.parquet", "report.json",
                 "summary.md", "summary.html", "plots/released_vs_noisy.png", "plots/released_vs_true.png",
                 "plots/error_by_query.png", "marginals/county_x_sex_x_age_group.csv"):
        assert (out / name).is_file(), name
    assert (out / "plots" / "error_by_query.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    siblings = [p.name for p in out.parent.iterdir()]
    assert siblings == ["release"]  # no temporary directory left behind


def test_ledger_sums_exactly_to_the_spec_budget(released):
    _, out = released
    report = json.loads((out / "report.json").read_text())
    spec = load_spec(QUICKSTART)
    ledger = report["privacy"]["ledger"]
    assert len(ledger) == len(spec.measures)
    assert sum((Fraction(e["epsilon"]) for e in ledger), Fraction(0)) == spec.privacy.epsilon == 1
    assert report["privacy"]["budget"] == {"epsilon": "1"}
    assert report["privacy"]["ledger_sums_to_budget"] is True


def test_release_obeys_invariants_zeros_and_hierarchy_exactly(released):
    _, out = released
    table = read_released(out / "release.csv")
    domain = census_domain()
    assert len(table) == domain.size
    counts = table["count"].to_numpy()
    assert (counts >= 0).all() and table["count"].dtype.kind == "i"
    # Invariants: the released state totals equal the true ones exactly.
    truth = state_totals(generate_census(10_000, seed=2024), domain)
    released_totals = table.groupby("state")["count"].sum()
    assert released_totals.to_dict() == truth.to_dict()
    # Structural zeros (the census module's direct implementation, not the predicate parser).
    zero = structural_zero_mask_of_records(table.drop(columns="count"), domain)
    assert zero.sum() > domain.size // 2 and counts[zero].sum() == 0
    # Hierarchy: every person's county lies in its state.
    parent = county_parent(domain)
    nonzero = table[counts > 0]
    assert (nonzero["county"].map(parent) == nonzero["state"]).all()


def test_synthetic_microdata_count_equals_the_released_total(released):
    _, out = released
    table = read_released(out / "release.csv")
    people = read_released(out / "synthetic.csv")
    assert len(people) == table["count"].sum() == 10_000
    attrs = [c for c in table.columns if c != "count"]
    per_cell = people.value_counts(attrs).rename("n").reset_index()
    merged = table.merge(per_cell, on=attrs, how="left").fillna({"n": 0})
    assert (merged["n"].to_numpy() == merged["count"].to_numpy()).all()
    assert pd.read_parquet(out / "synthetic.parquet").shape == people.shape


def test_report_lists_every_constraint_and_marks_the_seed(released):
    _, out = released
    report = json.loads((out / "report.json").read_text())
    kinds = [c["kind"] for c in report["constraints"]]
    assert kinds.count("structural_zero") == 10 and "invariant" in kinds and "hierarchy" in kinds
    assert all(c["satisfied"] and c["max_violation"] == 0 for c in report["constraints"])
    assert report["randomness"]["seed"] == 7 and report["randomness"]["private"] is False
    assert report["reconstruction"]["status"] == "OPTIMAL" and report["reconstruction"]["rounding"]
    assert report["privacy"]["published_without_noise"][0]["invariant"] == "state totals"
    summary = (out / "summary.md").read_text()
    assert "seeded: NOT private" in summary and "NOT private, for testing only" in summary
    assert "<table>" in (out / "summary.html").read_text()


def test_run_prints_a_summary(tmp_path, capsys):
    spec = tmp_path / "small.toml"
    spec.write_text(SMALL)
    assert main(["run", str(spec), "--seed", "1", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "ledger sums exactly to the budget" in text and "seeded, NOT private" in text


def test_the_program_ends_without_teardown_and_keeps_its_output_and_status(tmp_path):
    """``python -m dpopt.cli`` (and the installed script) end with ``os._exit`` once the output
    is flushed (issue #30): the summary, the warning and the exit status are all still there."""
    import subprocess
    import sys

    run = [sys.executable, "-m", "dpopt.cli", "run", "quickstart", "--seed", "1", "--out", str(tmp_path / "r")]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(f"  wrote {tmp_path / 'r'}/ (20 files)")
    assert "is NOT private" in proc.stderr and (tmp_path / "r" / "report.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "dpopt.cli", "run", str(tmp_path / "missing.toml")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.startswith("dpopt: error: spec file") and bad.stdout == ""


def test_run_without_out_uses_the_default_directory(tmp_path, monkeypatch):
    spec = tmp_path / "small.toml"
    spec.write_text(SMALL)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(spec), "--quiet"]) == 0
    assert (tmp_path / "dpopt-out" / "small" / "report.json").is_file()


def test_existing_output_needs_overwrite(tmp_path, capsys):
    spec = tmp_path / "small.toml"
    spec.write_text(SMALL)
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["run", str(spec), "--out", str(out), "--quiet"]) == 1
    assert "--out" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # --overwrite replaces a previous dpopt release only, never a directory holding the user's files.
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--overwrite"]) == 1
    assert "'keep.txt'" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert main(["run", str(spec), "--out", str(out), "--quiet"]) == 0
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert (out / "report.json").is_file() and not (out / "keep.txt").exists()
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_check_prints_the_plan_without_reading_data(tmp_path, capsys, monkeypatch):
    from dpopt.model.data import Dataset

    def no_reading(*args, **kwargs):
        raise AssertionError("check must not read data")

    monkeypatch.setattr(Dataset, "from_csv", no_reading)
    monkeypatch.setattr(Dataset, "from_parquet", no_reading)
    data = tmp_path / "people.csv"
    data.write_text("a,b\n")
    spec = tmp_path / "small.toml"
    spec.write_text(_edit(SMALL, 'source = "example"\nrows = 800', f'path = "{data.name}"'))
    assert main(["check", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "budget split" in text and "1/4" in text and "nothing was read or written" in text
    assert main(["check", "quickstart"]) == 0
    text = capsys.readouterr().out
    assert "state totals" in text and "published exactly from the data" in text
    assert sorted(tmp_path.iterdir()) == sorted([data, spec])


@pytest.mark.parametrize("path", sorted((REPO / "models").glob("*.toml")), ids=lambda p: p.stem)
def test_check_passes_on_every_shipped_spec_without_data(path, capsys):
    """``dpopt check models/X.toml``, as the specs' own header comments show it: no --data."""
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    name = load_spec(path).name
    assert out.startswith(f"release {name!r} ({path})\n")
    assert out.rstrip().endswith("spec OK: nothing was read or written")
    if "source = \"file\"" in path.read_text():  # the real-data specs name their file at run time
        assert "data: a CSV or Parquet file, not named yet" in out


def test_run_without_data_and_check_with_a_missing_file_fail_before_the_plan(tmp_path, capsys, monkeypatch):
    """The data path is the run's business: ``run`` without one, or ``check --data`` naming a file
    that is not there, fail at once, before the algorithm's (possibly slow) plan."""
    from dpopt.algorithms.base import get_algorithm

    def no_planning(*args, **kwargs):
        raise AssertionError("the data path is checked before the algorithm plans")

    monkeypatch.setattr(get_algorithm("measure_reconstruct"), "plan", no_planning)
    out = tmp_path / "out"
    assert main(["run", str(REPO / "models" / "czech.toml"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "key 'data.path': no data file given" in err and "--data PATH" in err and len(err.splitlines()) == 1
    assert main(["check", str(REPO / "models" / "czech.toml"), "--data", str(tmp_path / "missing.csv")]) == 1
    assert "--data: file" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == []


def test_a_spec_naming_a_file_that_is_not_here_passes_check_and_fails_run(tmp_path, capsys):
    """A spec written for the machine that holds the data is checked anywhere; the run refuses."""
    spec = tmp_path / "spec.toml"
    spec.write_text(_edit(SMALL, 'source = "example"\nrows = 800', 'path = "elsewhere/people.csv"'))
    assert main(["check", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"data: {tmp_path / 'elsewhere' / 'people.csv'}, not found here" in out
    assert main(["run", str(spec), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "key 'data.path': file 'elsewhere/people.csv' does not exist (looked for" in err
    assert len(err.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


def test_spark_without_the_extra_is_a_one_line_error_naming_it(tmp_path, capsys, monkeypatch):
    """pyspark is the ``spark`` extra: a spec asking for the Spark executor where it is not
    installed fails at ``check`` (before any data), in one line that says what to install."""
    import sys

    for name in ["pyspark"] + [m for m in sys.modules if m.startswith("pyspark.")]:  # as if not installed (even
        monkeypatch.setitem(sys.modules, name, None)  # after the Spark tests): find_spec and import both fail
    text = (REPO / "models" / "census_topdown.toml").read_text()
    assert 'executor = "serial"' in text
    spec = tmp_path / "spark.toml"
    spec.write_text(text.replace('executor = "serial"', 'executor = "spark"'))
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "key 'topdown" in err, err
    assert "executor 'spark' needs pyspark" in err and 'pip install "dpopt[spark]"' in err
    from dpopt.algorithms.topdown.executors import spark_session

    with pytest.raises(DpoptError, match=r"dpopt\[spark\]"):
        spark_session("local[1]")


def test_models_lists_the_builtin_specs(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "quickstart" in text and str(QUICKSTART) in text


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_example_data_writes_the_file(tmp_path, capsys, fmt):
    path = tmp_path / f"people.{fmt}"
    assert main(["example-data", "--rows", "1500", "--seed", "3", "--out", str(path)]) == 0
    frame = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    assert len(frame) == 1500
    expected = generate_census(1500, seed=3)
    assert (frame["county"].astype(str).to_numpy() == expected["county"].astype(str).to_numpy()).all()


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as err:
        main(["run"])
    assert err.value.code == 2
    with pytest.raises(SystemExit) as err:
        main(["run", "x.toml", "--seed", "-3"])
    assert err.value.code == 2


# ---- bad specs: one line naming the key, exit 1, nothing written -----------------------------------

SMALL = """\
name = "small"
[domain]
builtin = "census"
states = 2
counties_per_state = 2
[data]
source = "example"
rows = 800
[privacy]
accounting = "pure"
epsilon = 1
[[measure]]
query = "marginal"
attrs = ["county", "sex"]
mechanism = "laplace"
share = 0.25
[[measure]]
query = "marginal"
attrs = ["age_group", "relationship", "household_type"]
mechanism = "laplace"
share = 0.75
[constraints]
nonnegative = true
integer = true
structural_zeros = [{ builtin = true }]
invariants = [{ name = "state totals", query = "marginal", attrs = ["state"], from_data = true }]
[reconstruct]
objective = "l2"
[output]
formats = ["csv"]
summary = ["md"]
plots = false
"""


def _edit(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


BAD_SPECS = [
    ("unknown key", lambda t: _edit(t, 'mechanism = "laplace"\nshare = 0.75', 'mechansim = "laplace"\nshare = 0.75'),
     [], ["line 20", "key 'measure[2].mechansim'", "did you mean 'mechanism'"]),
    ("wrong type", lambda t: _edit(t, "rows = 800", 'rows = "800"'), [], ["line 8", "key 'data.rows'", "integer"]),
    ("missing data file", lambda t: _edit(t, 'source = "example"\nrows = 800', 'path = "missing.csv"'), [],
     ["key 'data.path'", "missing.csv", "does not exist"]),
    ("missing --data file", lambda t: t, ["--data", "missing.parquet"], ["--data", "missing.parquet"]),
    ("shares not summing", lambda t: _edit(t, "share = 0.75", "share = 0.7"), [],
     ["key 'measure[*].share'", "sum to 19/20", "lines 16, 21"]),
    ("conflicting public constraints", lambda t: _edit(t, "from_data = true }", "values = [1, 2] },\n"
                                                         '  { name = "all", query = "total", values = [4] }'),
     [], ["key 'constraints'", "'invariant:state totals'", "'invariant:all'", "before reading any data"]),
    ("conflicting data constraints", lambda t: _edit(t, "from_data = true }", "from_data = true },\n"
                                                        '  { name = "all", query = "total", values = [4] }'),
     [], ["key 'constraints'", "'invariant:all'", "before any noise"]),
    ("structural zero against invariant", lambda t: _edit(
        t, "from_data = true }", 'from_data = true },\n  { name = "gq", query = "marginal", '
        'attrs = ["relationship"], values = [0, 0, 0, 0, 0, 0] }').replace(
        "structural_zeros = [{ builtin = true }]",
        "structural_zeros = [{ builtin = true }, { where = \"age_group == '0-14'\", reason = \"none\" }]\n"
        'structural_zero_records = "drop"'),
     [], ["key 'constraints'", "cannot all hold"]),
    ("unknown backend", lambda t: _edit(t, 'objective = "l2"', 'objective = "l2"\nbackend = "gurobi"'), [],
     ["key 'reconstruct.backend'", "'gurobi'", "'cvxpy'", "'highs'"]),
    ("unknown attribute", lambda t: _edit(t, '"county", "sex"', '"county", "gender"'), [],
     ["key 'measure[1].attrs'", "'gender'"]),
]


@pytest.mark.parametrize("name, edit, extra, needles", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_errors_name_the_key_and_write_nothing(tmp_path, capsys, name, edit, extra, needles):
    spec = tmp_path / "spec.toml"
    spec.write_text(edit(SMALL))
    out = tmp_path / "out"
    status = main(["run", str(spec), "--out", str(out), "--quiet", "--seed", "1", *extra])
    err = capsys.readouterr().err
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpopt: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]


def test_check_reports_the_same_errors(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(_edit(SMALL, "share = 0.75", "share = 0.5"))
    assert main(["check", str(spec)]) == 1
    assert "key 'measure[*].share'" in capsys.readouterr().err


def test_the_small_release_counts(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--quiet", "--seed", "2", "--out", str(out), _write(tmp_path, SMALL)]) == 0
    table = read_released(out / "release.csv")
    assert table["count"].sum() == 800
    assert np.array_equal(np.sort(table["state"].unique()), ["S01", "S02"])


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("spec_path", sorted((Path(__file__).resolve().parents[1] / "models").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_check_prints_the_same_heading_before_importing_the_algorithms(spec_path):
    from dpopt.cli import _quick_heading
    from dpopt.release.plan import describe_heading
    from dpopt.spec import load_spec

    assert _quick_heading(str(spec_path)) == describe_heading(load_spec(str(spec_path)))
