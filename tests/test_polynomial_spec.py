"""Release specs with ``algorithm = "polynomial"``: the ``[polynomial]`` table, its errors, a run.

Validation happens before any data is read and every error names the file, line and key;
``models/nltcs_polynomial.toml`` loads and plans; a small spec runs end to end through the
release pipeline (answers only: no table) and writes its marginals in one long file (one per
marginal when asked).
"""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import SpecError
from dpopt.release import plan, run
from dpopt.release.outputs import read_released
from dpopt.spec import load_spec, parse_spec_text

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "algorithm": "polynomial",
    "domain": {"attributes": {"a": 2, "b": 2, "c": 3, "d": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def poly(**params) -> dict:
    raw = copy.deepcopy(BASE)
    raw["polynomial"] = {"workload": 2, **params}
    return raw


def spec_error(raw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return str(info.value)


def test_defaults_and_values():
    p = load_spec(poly()).algorithm.params
    assert (p.workload, p.queries, p.construction, p.universe, p.split, p.gamma, p.degree) == \
        (2, "marginals", "minimax", "literals", "variance", None, None)
    assert p.bound_beta == Fraction(1, 20)
    p = load_spec(poly(workload=[["a", "b"], ["c"]], gamma="1/7", records=1000, consistency="l2",
                       bound_beta=0.01)).algorithm.params
    assert p.workload == (("a", "b"), ("c",)) and p.gamma == Fraction(1, 7) and p.records == 1000
    assert p.consistency == "l2" and p.bound_beta == Fraction(1, 100)


@pytest.mark.parametrize("params, key, words", [
    (dict(gamma=2), "polynomial.gamma", "in (0, 1)"),
    (dict(gamma="1/10", degree=2), "polynomial.gamma", "not both"),
    (dict(degree=0), "polynomial.degree", ">= 1"),
    (dict(queries="cells"), "polynomial.queries", "choose one of"),
    (dict(split="even"), "polynomial.split", "choose one of"),
    (dict(threshold=2), "polynomial.threshold", "threshold goes with"),
    (dict(construction="exact", degree=2), "polynomial.degree", "neither gamma nor degree"),
    (dict(workload="a"), "polynomial.workload", "order k"),
    (dict(universe="monotone"), "polynomial.universe", "negated literals"),
    (dict(colour="red"), "polynomial.colour", "unknown key"),
])
def test_bad_keys_name_the_key(params, key, words):
    message = spec_error(poly(**params))
    assert f"key '{key}'" in message and words in message, message


def test_refused_constraints_and_the_line_of_the_key():
    raw = poly()
    raw["constraints"] = {"nonnegative": True}
    assert "key 'constraints.nonnegative'" in spec_error(raw)
    text = "\n".join(['algorithm = "polynomial"', "[domain.attributes]", "a = 2", "b = 2", "[data]",
                      'source = "file"', "[privacy]", 'accounting = "pure"', "epsilon = 1", "[polynomial]",
                      "workload = 1", 'split = "evenly"'])
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source=Path("x.toml"))
    assert "spec x.toml, line 12, key 'polynomial.split'" in str(info.value)


def test_plan_checks_the_workload_before_reading_data(tmp_path):
    missing = tmp_path / "never-read.csv"
    missing.write_text("a,b,c,d\n")  # plan() must not read it
    for params, key in ((dict(workload=[["a", "z"]]), "polynomial.workload[1]"),
                        (dict(workload=5), "polynomial.workload"),
                        (dict(k=1), "polynomial.k"),
                        (dict(queries="disjunctions"), "polynomial.queries")):
        with pytest.raises(SpecError) as info:
            plan(poly(**params), data=missing)
        assert f"key '{key}'" in str(info.value), str(info.value)
    p = plan(poly(), data=missing)
    assert "algorithm: polynomial" in p.describe() and "Theorem 3.1 bound" in p.describe()


def test_the_model_spec_loads_and_plans(tmp_path):
    s = load_spec(REPO / "models" / "nltcs_polynomial.toml")
    params = s.algorithm.params
    assert (s.algorithm.name, params.workload, params.records, params.consistency) == ("polynomial", 3, 21574, "l2")
    missing = tmp_path / "never-read.csv"
    missing.write_text(",".join(f"item{i:02d}" for i in range(1, 17)) + "\n")
    p = plan(REPO / "models" / "nltcs_polynomial.toml", data=missing)
    details = p.algorithm_plan.details
    assert details.polynomial.degree == 2 and details.k == 3  # (t, gamma) chosen for 21,574 records
    assert sum((s.share for s in p.algorithm_plan.steps), Fraction(0)) == 1


def test_a_spec_runs_end_to_end(tmp_path):
    gen = np.random.default_rng(3)  # test input, not privacy noise
    frame = pd.DataFrame({"a": gen.integers(0, 2, 600), "b": gen.integers(0, 2, 600),
                          "c": gen.integers(0, 3, 600), "d": gen.integers(0, 2, 600)})
    release = run(poly(consistency="l2"), data=frame, out=tmp_path / "out", seed=1)
    assert release.success and release.counts is None
    assert len(release.answers) == 2 * 6  # six pair marginals and their projections
    # no table: every answer table in one long file (output.marginals_layout = "auto")
    assert not (tmp_path / "out" / "marginals").exists()
    answers = read_released(tmp_path / "out" / "marginals.csv")
    assert list(answers.columns) == ["table", "a", "b", "c", "d", "count", "stddev"] and len(answers) == 2 * 30
    cells = answers[answers["table"] == "a, c"].dropna(axis=1)
    assert list(cells.columns) == ["table", "a", "c", "count", "stddev"] and len(cells) == 6
    raw = poly(consistency="l2")
    raw["output"]["marginals_layout"] = "files"  # one file per table when asked
    run(raw, data=frame, out=tmp_path / "files", seed=1)
    written = sorted(p.name for p in (tmp_path / "files" / "marginals").glob("*.csv"))
    assert len(written) == 12
    cells = read_released(tmp_path / "files" / "marginals" / "a_c.csv")
    assert list(cells.columns) == ["a", "c", "count", "stddev"] and len(cells) == 6


def test_dpopt_run_prints_a_summary_of_an_answers_only_release(tmp_path, capsys):
    from dpopt.cli import main

    gen = np.random.default_rng(4)  # test input, not privacy noise
    frame = pd.DataFrame(gen.integers(0, 2, (300, 4)), columns=list("wxyz"))
    frame.to_csv(tmp_path / "data.csv", index=False)
    spec = tmp_path / "s.toml"
    spec.write_text("\n".join([
        'algorithm = "polynomial"', "[domain.attributes]", "w = 2", "x = 2", "y = 2", "z = 2", "[data]",
        'source = "file"', f'path = "{tmp_path / "data.csv"}"', "[privacy]", 'accounting = "pure"', "epsilon = 1",
        "[polynomial]", "workload = 2", "[output]", 'formats = ["csv"]', 'summary = ["md"]', "plots = false"]))
    assert main(["run", str(spec), "--seed", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "6 answer tables (24 answers), no table" in out and "NOT private" in out


def test_evaluate_reports_the_theorem_bound_beside_the_measured_error(tmp_path):
    gen = np.random.default_rng(4)  # test input, not privacy noise
    frame = pd.DataFrame({"a": gen.integers(0, 2, 400), "b": gen.integers(0, 2, 400),
                          "c": gen.integers(0, 3, 400), "d": gen.integers(0, 2, 400)})
    release = run(poly(consistency="l2"), data=frame, out=tmp_path / "out", seed=2, evaluate=True)
    bounds = release.evaluation_summary["algorithm_bounds"]
    assert len(bounds) == 6 and all(row["within_bound"] for row in bounds)
    assert all(0 <= row["max_error"] <= row["bound"] for row in bounds)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "bound its theorem gives" in summary and "within bound" in summary


def test_the_command_line_summary_says_when_no_constraint_was_declared():
    from dpopt.cli import _run_summary

    gen = np.random.default_rng(5)  # test input, not privacy noise
    frame = pd.DataFrame({"a": gen.integers(0, 2, 100), "b": gen.integers(0, 2, 100),
                          "c": gen.integers(0, 3, 100), "d": gen.integers(0, 2, 100)})
    release = run(poly(), data=frame, seed=3)
    assert "  constraints: none declared" in _run_summary(release, 1.0).splitlines()
