"""The Python release pipeline: each step on its own, budgets, outputs, atomic writing."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.atomic import MANIFEST_NAME, OutputExistsError, atomic_directory
from dpopt.datasets.census import (
    census_domain,
    generate_census,
    state_totals,
    structural_zero_mask_of_records,
    write_example_data,
)
from dpopt.errors import InconsistentConstraintsError, SpecError
from dpopt.model.data import Dataset
from dpopt.release import (
    build_constraints,
    evaluate_release,
    load_data,
    measure,
    plan,
    reconstruct_table,
    released_counts,
    released_marginals,
    run,
    synthesize,
)
from dpopt.release.outputs import read_released
from dpopt.spec import load_spec

REPO = Path(__file__).resolve().parents[1]

# Seeded runs here are tests of seeded runs: their NOT-private warning is expected (and tested in
# tests/test_bad_inputs.py).
pytestmark = pytest.mark.filterwarnings("ignore::dpopt.release.pipeline.NotPrivateWarning")
QUICKSTART = REPO / "models" / "quickstart.toml"
SHARED = REPO.parent / "shared" / "data"


def small_spec(accounting: dict, mechanism: str = "laplace") -> dict:
    return {
        "name": "small",
        "domain": {"attributes": {"a": ["x", "y", "z"], "b": 2, "c": 4}},
        "privacy": accounting,
        "measure": [
            {"label": "ab", "query": "marginal", "attrs": ["a", "b"], "mechanism": mechanism, "share": "1/3"},
            {"label": "c", "query": "marginal", "attrs": ["c"], "mechanism": mechanism, "share": "1/6"},
            {"label": "total", "query": "total", "mechanism": mechanism, "share": 0.5},
        ],
        "constraints": {"nonnegative": True, "integer": True,
                        "structural_zeros": [{"where": "a == 'z' and c == 3", "reason": "made up"}]},
    }


def small_frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)  # test data only, not privacy noise
    df = pd.DataFrame({"a": rng.choice(["x", "y", "z"], n), "b": rng.integers(0, 2, n), "c": rng.integers(0, 4, n)})
    return df[~((df.a == "z") & (df.c == 3))].reset_index(drop=True)


@pytest.fixture(scope="module")
def quickstart_run():
    return run(QUICKSTART, seed=11, evaluate=True)


# ---- the quickstart through the API ----------------------------------------------------------------


def test_quickstart_release_obeys_every_constraint(quickstart_run):
    r = quickstart_run
    counts = r.counts
    dom = r.plan.domain
    assert counts.dtype == np.int64 and (counts >= 0).all()
    # Structural zeros, checked with the census module's own rule implementation (not the predicates).
    cells = r.table.drop(columns="count")
    masked = structural_zero_mask_of_records(cells, dom)
    assert masked.any() and counts[masked].sum() == 0
    # The state totals are published exactly.
    truth = state_totals(generate_census(10_000, seed=2024), dom)
    released = r.table.groupby("state", observed=False)["count"].sum()
    assert (released.to_numpy() == truth.to_numpy()).all()
    assert counts.sum() == 10_000
    assert r.constraint_residuals["satisfied"].all()


def test_quickstart_ledger_sums_exactly_to_the_budget(quickstart_run):
    ledger = quickstart_run.ledger
    assert sum(ledger["epsilon"], Fraction(0)) == Fraction(1)
    spec = load_spec(QUICKSTART)
    assert list(ledger["epsilon"]) == [m.share * spec.privacy.epsilon for m in spec.measures]
    privacy = quickstart_run.report["privacy"]
    assert privacy["ledger_sums_to_budget"] and privacy["ledger_sum"] == {"epsilon": "1"}


def test_plan_predicts_the_noise_of_each_measurement(quickstart_run):
    for planned, m in zip(quickstart_run.plan.measures, quickstart_run.measurements):
        assert planned.label == m.label
        assert planned.variance == pytest.approx(m.variance, rel=1e-12)
        assert m.noise == planned.noise == "discrete_laplace"


def test_synthetic_microdata_reproduce_the_released_table(quickstart_run):
    r = quickstart_run
    assert len(r.synthetic) == r.counts.sum()
    again = Dataset.from_frame(r.synthetic, r.plan.domain).histogram()
    assert (again == r.counts).all()


def test_released_marginals_are_answers_on_the_release(quickstart_run):
    r = quickstart_run
    for m in r.measurements:
        frame = r.marginals[m.label]
        assert np.array_equal(frame["count"].to_numpy(), m.query.matvec(r.counts))
        assert np.array_equal(frame["noisy"].to_numpy(), m.values)


def test_evaluation_matches_a_direct_computation(quickstart_run):
    r = quickstart_run
    data = Dataset.from_frame(generate_census(10_000, seed=2024), r.plan.domain)
    truth = data.histogram()
    assert r.evaluation_summary["l1_full_table"] == np.abs(r.counts - truth).sum()
    tv = 0.5 * np.abs(r.counts / r.counts.sum() - truth / truth.sum()).sum()
    assert r.evaluation_summary["total_variation"] == pytest.approx(tv, abs=1e-12)
    ev = r.evaluation.set_index("query")
    for m in r.measurements:
        t = m.query.matvec(truth)
        assert ev.loc[m.label, "l1_error"] == np.abs(m.query.matvec(r.counts) - t).sum()
        assert ev.loc[m.label, "noisy_l1_error"] == pytest.approx(np.abs(m.values - t).sum())
    assert ev.loc["state totals", "l1_error"] == 0


def test_seeded_run_is_reported_as_not_private(quickstart_run):
    rnd = quickstart_run.report["randomness"]
    assert rnd["seeded"] and rnd["seed"] == 11 and rnd["private"] is False
    assert "NOT private" in rnd["warning"]
    assert "NOT private" in quickstart_run.report["evaluation"]["warning"]


def test_same_data_from_a_file_gives_the_same_release(quickstart_run, tmp_path):
    path = write_example_data(tmp_path / "people.csv", num_people=10_000, seed=2024)
    again = run(QUICKSTART, data=path, seed=11)
    assert np.array_equal(again.counts, quickstart_run.counts)
    assert again.report["run"]["data"] == str(path.absolute())
    assert again.evaluation is None and again.report["evaluation"] is None


# ---- step by step on a small domain ----------------------------------------------------------------


@pytest.mark.parametrize(
    "accounting, mechanism, component, total",
    [
        ({"accounting": "pure", "epsilon": 0.5}, "laplace", "epsilon", Fraction(1, 2)),
        ({"accounting": "approx", "epsilon": 1, "delta": 1e-6}, "gaussian", "delta", Fraction(1, 10**6)),
        ({"accounting": "zcdp", "rho": "1/8"}, "gaussian", "rho", Fraction(1, 8)),
    ],
)
def test_steps_and_exact_ledgers(accounting, mechanism, component, total):
    spec = small_spec(accounting, mechanism)
    frame = small_frame()
    p = plan(spec, data=frame, seed=3)
    data = load_data(p)
    assert data.total == len(frame)
    constraints = build_constraints(p, data)
    measurements, accountant, rng = measure(p, data)
    assert not rng.is_private
    ledger = accountant.ledger_frame()
    assert sum(ledger[component], Fraction(0)) == total
    for planned, m in zip(p.measures, measurements):
        assert planned.variance == pytest.approx(m.variance, rel=1e-12)
    result = reconstruct_table(p, measurements, constraints)
    counts = released_counts(p, result.x)
    assert counts.dtype == np.int64 and (counts >= 0).all()
    zero = constraints.zero_mask()
    assert zero.sum() == 2 and counts[zero].sum() == 0  # a == 'z' and c == 3, for b = 0 and 1
    people = synthesize(p.domain, counts)
    assert len(people) == counts.sum()
    assert set(released_marginals(measurements, counts)) == {"ab", "c", "total"}
    frame_ev, summary, truths = evaluate_release(p, data, counts, measurements, constraints)
    assert summary["records"] == len(frame)
    assert set(truths) == {"ab", "c", "total"}


def test_zcdp_from_epsilon_delta_spends_the_derived_rho():
    from dpopt.privacy.conversions import approx_dp_to_zcdp

    spec = small_spec({"accounting": "zcdp", "epsilon": 1, "delta": 1e-6}, "gaussian")
    p = plan(spec, data=small_frame(), seed=1)
    _, accountant, _ = measure(p, load_data(p))
    assert sum(accountant.ledger_frame()["rho"], Fraction(0)) == approx_dp_to_zcdp(1, Fraction(1, 10**6))


def test_laplace_under_approx_leaves_delta_unspent_and_says_so():
    spec = small_spec({"accounting": "approx", "epsilon": 1, "delta": 1e-6}, "laplace")
    r = run(spec, data=small_frame(), seed=2)
    privacy = r.report["privacy"]
    assert sum(r.ledger["epsilon"], Fraction(0)) == 1
    assert not privacy["ledger_sums_to_budget"]
    assert privacy["unspent"] == {"delta": "1/1000000"}


def test_unseeded_run_uses_the_secure_source():
    r = run(small_spec({"accounting": "pure", "epsilon": 1}), data=small_frame())
    assert r.report["randomness"] == {"seeded": False, "seed": None, "private": True, "source": r.random_description}
    assert "warning" not in r.report["randomness"]


def test_constraints_from_the_data_are_checked_before_any_noise(monkeypatch, tmp_path):
    import dpopt.privacy.mechanisms as mechanisms

    calls = []
    monkeypatch.setattr(mechanisms, "laplace_mechanism", lambda *a, **k: calls.append(a))
    spec = small_spec({"accounting": "pure", "epsilon": 1})
    spec["constraints"]["invariants"] = [
        {"name": "everyone", "query": "total", "from_data": True},
        {"name": "claimed", "query": "total", "values": [5]},
    ]
    out = tmp_path / "out"
    with pytest.raises(InconsistentConstraintsError, match="before any noise"):
        run(spec, data=small_frame(), out=out)
    assert calls == [] and not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_counts_file_and_records_file_give_the_same_data():
    if not (SHARED / "czech_counts.csv").is_file():
        pytest.skip("shared data not available")
    spec = load_spec(REPO / "models" / "czech.toml")
    records = load_data(plan(spec, data=SHARED / "czech.csv"))
    raw = dict(spec.raw, data={"source": "file", "path": str(SHARED / "czech_counts.csv"), "count_column": "count"})
    counts = load_data(plan(raw))
    assert records.total == counts.total == 1841
    assert np.array_equal(records.histogram(), counts.histogram())


def test_dataset_over_another_domain_is_refused():
    other = Dataset.from_frame(generate_census(100, num_states=2, counties_per_state=2, seed=1), census_domain(2, 2))
    with pytest.raises(SpecError, match="domain"):
        plan(QUICKSTART, data=other)


# ---- writing ------------------------------------------------------------------------------------


def test_written_release_round_trips(tmp_path):
    out = tmp_path / "deep" / "release"
    r = run(small_spec({"accounting": "pure", "epsilon": 1}), data=small_frame(), out=out, seed=5)
    assert r.out == out
    table = read_released(out / "release.csv")
    assert np.array_equal(table["count"].to_numpy(), r.counts)
    assert np.array_equal(pd.read_parquet(out / "release.parquet")["count"].to_numpy(), r.counts)
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["files"]) == sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
    )
    assert len(read_released(out / "synthetic.csv")) == r.counts.sum()
    assert [p.name for p in tmp_path.iterdir()] == ["deep"]
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["release"]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import dpopt.report

    def broken(report):
        raise OSError("disk full")

    monkeypatch.setattr(dpopt.report, "render_html", broken)
    out = tmp_path / "new" / "release"
    with pytest.raises(OSError, match="disk full"):
        run(small_spec({"accounting": "pure", "epsilon": 1}), data=small_frame(), out=out, seed=5)
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replaces_only_when_asked(tmp_path):
    target = tmp_path / "t"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(OutputExistsError, match="already holds files"):
        with atomic_directory(target):
            pass  # pragma: no cover
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt", MANIFEST_NAME]
    with pytest.raises(RuntimeError):
        with atomic_directory(target, overwrite=True) as tmp:
            (tmp / "c.txt").write_text("third")
            raise RuntimeError("boom")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt", MANIFEST_NAME]
    assert [p.name for p in tmp_path.iterdir()] == ["t"]


def test_hierarchy_from_a_table_of_codes_and_nonzero_cells():
    spec = {
        "domain": {"attributes": {"region": ["north", "south"], "district": 4, "sex": ["F", "M"]}},
        "privacy": {"accounting": "pure", "epsilon": 1},
        "measure": [{"query": "marginal", "attrs": ["district", "sex"], "mechanism": "laplace", "share": 1}],
        "constraints": {"nonnegative": True, "integer": True, "hierarchy": [
            {"parent": "region", "child": "district",
             "parent_of": {"0": "north", "1": "north", "2": "south", "3": "south"}}]},
        "output": {"cells": "nonzero"},
    }
    frame = pd.DataFrame({"region": ["north", "north", "south", "south"] * 20, "district": [0, 1, 2, 3] * 20,
                          "sex": ["F", "M"] * 40})
    r = run(spec, data=frame, seed=4)
    grid = r.counts.reshape(2, 4, 2)
    assert grid[0, 2:].sum() == 0 and grid[1, :2].sum() == 0  # districts stay in their region
    assert (r.table["count"] > 0).all() and r.table["count"].sum() == r.counts.sum()
    spec["constraints"]["hierarchy"][0]["parent_of"] = {"0": "north", "1": "north", "2": "south"}
    with pytest.raises(InconsistentConstraintsError, match=r"key 'constraints.hierarchy\[1\]'.*\[3\]"):
        plan(spec, data=frame)


def test_the_default_integer_release_beats_its_own_noisy_answers_on_every_measured_marginal():
    """Issue 12, deliver 5: averaged over seeds, the quickstart's released integer table is closer to
    the truth than its noisy answers on each measured marginal; each run's report names any
    marginal where that one run lost, with the amounts."""
    released, noisy = {}, {}
    for seed in range(1, 6):
        r = run("quickstart", seed=seed, evaluate=True)
        measured = r.evaluation[r.evaluation["kind"] == "measured"]
        for row in measured.itertuples():
            released[row.query] = released.get(row.query, 0.0) + row.l1_error
            noisy[row.query] = noisy.get(row.query, 0.0) + row.noisy_l1_error
        worse = {w["query"] for w in r.evaluation_summary["worse_than_noisy"]}
        assert worse == set(measured.loc[measured["l1_error"] > measured["noisy_l1_error"], "query"])
        from dpopt.report import render_markdown

        text = render_markdown(r.report)
        assert ("further from the truth than its own noisy answers" in text) == bool(worse)
        assert [w["query"] for w in r.report["evaluation"]["summary"]["worse_than_noisy"]] == sorted(worse, key=list(
            measured["query"]).index)
    assert all(released[q] <= noisy[q] for q in released), (released, noisy)
