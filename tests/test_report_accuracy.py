"""Reports that state accuracy: the plan's expected error against an explicit pseudo-inverse,
the fit's error bars against the dense active-set covariance, and the summary's wording.

Noise here is numpy Gaussian noise: test input for post-processing, not a release.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import dpopt
from dpopt.estimate import reconstruct, standard_errors
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Total
from dpopt.release.accuracy import consistency_changes, fitted_error_bars, planned_accuracy
from dpopt.release.glossary import GLOSSARY, glossary_for

DOM = Domain(("a", "b", "c"), (3, 4, 6))   # 72 cells: the identity is above the exact-probe size


def _steps(queries, variances):
    return [SimpleNamespace(label=q.name, query=q, law=SimpleNamespace(variance=v)) for q, v in zip(queries, variances)]


def test_planned_accuracy_is_the_explicit_gls_formula():
    queries = [Marginal(DOM, ["a", "b"]), Marginal(DOM, ["b", "c"]), Marginal(DOM, ["a"])]
    variances = [4.0, 9.0, 1.0]
    rows = planned_accuracy(SimpleNamespace(steps=_steps(queries, variances)))
    H = sum(q.to_dense().T @ q.to_dense() / v for q, v in zip(queries, variances))
    pinv = np.linalg.pinv(H)
    for q, v, row in zip(queries, variances, rows):
        A = q.to_dense()
        expected = np.sqrt(np.mean(np.einsum("ij,jk,ik->i", A, pinv, A)))
        assert row["expected_rmse"] == pytest.approx(expected, rel=1e-9)
        assert row["noise_rmse"] == pytest.approx(np.sqrt(v))
        assert row["expected_rmse"] <= row["noise_rmse"] + 1e-12   # fitting all of them never hurts


def test_planned_accuracy_says_why_when_no_form_applies():
    other = Domain(("a",), (3,))
    rows = planned_accuracy(SimpleNamespace(steps=_steps([Marginal(DOM, ["a"]), Total(other)], [1.0, 1.0])))
    assert all(r["expected_rmse"] is None and "different domains" in r["why"] for r in rows)


def _release(truth, rng, queries, sigmas, constraints):
    ms = [Measurement(q, q.matvec(truth) + rng.normal(0, s, q.num_rows), "gaussian", s, s * s, label=q.name)
          for q, s in zip(queries, sigmas)]
    fit = reconstruct(ms, constraints, "l2")
    assert fit.success
    return SimpleNamespace(reconstruction=fit, counts=fit.x, measurements=ms, constraints=fit.problem.constraints,
                           rounding=None), fit


@pytest.mark.parametrize("solve", ["direct", "cg"])
@pytest.mark.parametrize("sparse_truth", [False, True])
def test_error_bars_match_the_dense_active_set_covariance(rng, sparse_truth, solve, monkeypatch):
    """Both solves of the error bars (eigendecomposition of G Gᵀ up to DIRECT_ROWS rows, conjugate
    gradients above) against the dense active-set covariance."""
    import dpopt.release.accuracy as accuracy

    if solve == "cg":
        monkeypatch.setattr(accuracy, "DIRECT_ROWS", 0)
    truth = (rng.poisson(0.4, DOM.size) if sparse_truth else rng.integers(20, 40, DOM.size)).astype(float)
    queries = [Identity(DOM), Marginal(DOM, ["a", "b"]), Marginal(DOM, ["c"])]
    sigmas = [3.0, 2.0, 1.0]
    total = Total(DOM)
    cs = ConstraintSet(DOM, [NonNegativity(), Invariant(total, total.matvec(truth), name="total")])
    release, fit = _release(truth, rng, queries, sigmas, cs)
    rows, why = fitted_error_bars(release)
    assert why is None
    for q, row in zip(queries, rows):
        dense = standard_errors(fit, q, method="active_set")
        exact = float(np.sqrt(np.mean(dense ** 2)))
        assert row["converged"]
        if row["exact"]:  # unit probes: the same number up to the solver's tolerance
            assert row["rmse"] == pytest.approx(exact, rel=1e-5, abs=1e-9)
        else:  # Rademacher probes: within 4 of the estimate's own standard errors
            assert abs(row["rmse"] - exact) <= 4 * row["rmse_se"] + 1e-9
            assert row["rmse_se"] < 0.2 * exact


def test_direct_and_cg_error_bars_agree_on_the_quickstart(quickstart_release, monkeypatch):
    """The eigendecomposition and the conjugate gradients give the same figures on the quickstart's
    fit (684 rows, the state totals, many cells at 0), to far below the printed digits."""
    import dpopt.release.accuracy as accuracy

    calls = []
    original = accuracy._direct_solver
    monkeypatch.setattr(accuracy, "_direct_solver", lambda system: calls.append(original(system)) or calls[-1])
    release, _ = quickstart_release
    direct, _ = fitted_error_bars(release)
    assert len(calls) == 1 and calls[0] is not None  # the spectrum has a clean gap: the direct solve ran
    assert all(row["converged"] for row in direct)
    monkeypatch.setattr(accuracy, "DIRECT_ROWS", 0)
    cg, _ = fitted_error_bars(release)
    assert len(calls) == 1
    for a, b in zip(direct, cg):
        assert a["table"] == b["table"] and b["converged"]
        assert a["rmse"] == pytest.approx(b["rmse"], rel=1e-6)
        assert a["rmse_se"] == pytest.approx(b["rmse_se"], rel=1e-4, abs=1e-12)


def test_error_bars_refuse_other_objectives_with_the_reason(rng):
    truth = rng.integers(5, 10, DOM.size).astype(float)
    ms = [Measurement(Identity(DOM), truth + rng.normal(0, 1, DOM.size), "gaussian", 1.0, 1.0, label="id")]
    fit = reconstruct(ms, ConstraintSet(DOM, [NonNegativity()]), "l1")
    rows, why = fitted_error_bars(SimpleNamespace(reconstruction=fit, counts=fit.x, measurements=ms))
    assert rows == [] and "'l1'" in why


def test_consistency_changes_name_what_moved_the_answers(rng):
    truth = np.zeros(DOM.size)
    truth[:5] = 3
    queries = [Marginal(DOM, ["a", "b"]), Marginal(DOM, ["a", "c"])]
    total = Marginal(DOM, ["a"])
    cs = ConstraintSet(DOM, [NonNegativity(), Invariant(total, total.matvec(truth), name="a totals")])
    release, _ = _release(truth, rng, queries, [2.0, 2.0], cs)
    rows = consistency_changes(release)
    for q, row in zip(queries, rows):
        noisy = release.measurements[queries.index(q)].values
        change = q.matvec(release.counts) - noisy
        assert row["rms_change"] == pytest.approx(np.sqrt(np.mean(change ** 2)))
        assert row["noisy_negative"] == int((noisy < 0).sum())
        assert "sums held to a totals" in row["why"]
        assert ("non-negativity" in row["why"]) == bool(row["noisy_negative"])


def test_glossary_lines_follow_the_terms_printed():
    assert glossary_for("Objective l2, backend cvxpy (cvxpy/CLARABEL): status OPTIMAL") == [
        line for pattern, line in GLOSSARY if pattern.startswith(("Objective l2", r"\bcvxpy", r"\bCLARABEL",
                                                                  r"\bOPTIMAL"))]
    assert glossary_for("nothing technical here") == []


@pytest.fixture(scope="module")
def quickstart_release(tmp_path_factory):
    import tomllib
    from pathlib import Path

    from dpopt.release.pipeline import NotPrivateWarning

    out = tmp_path_factory.mktemp("acc") / "release"
    spec = tomllib.loads((Path(__file__).parent.parent / "models" / "quickstart.toml").read_text())
    spec["data"]["rows"] = 3000
    with pytest.warns(NotPrivateWarning):
        release = dpopt.run(spec, seed=3, out=out)
    return release, out


def test_the_summary_and_report_state_accuracy(quickstart_release):
    release, out = quickstart_release
    report = json.loads((out / "report.json").read_text())
    acc = report["accuracy"]
    labels = [m.label for m in release.measurements]
    assert [r["table"] for r in acc["expected_before_data"]] == labels
    assert [r["table"] for r in acc["error_bars"]] == labels
    assert all(r["expected_rmse"] < r["noise_rmse"] for r in acc["expected_before_data"])
    assert all(r["converged"] and r["rmse"] > 0 for r in acc["error_bars"])
    summary = (out / "summary.md").read_text()
    for heading in ("## Accuracy", "## What consistency changed", "## Glossary"):
        assert heading in summary
    assert "l2 (weighted least squares)" in summary and "controlled rounding" in summary
    assert (out / "plots" / "accuracy_by_query.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "plots" / "change_by_query.png").is_file()
    assert not (out / "plots" / "error_by_query.png").exists()   # an error needs the truth (evaluate)


def test_auto_states_its_error_per_workload_table(tmp_path):
    import tomllib
    from pathlib import Path

    from dpopt.release.pipeline import NotPrivateWarning

    spec = tomllib.loads((Path(__file__).parent.parent / "models" / "quickstart_auto.toml").read_text())
    spec["data"]["rows"] = 3000
    with pytest.warns(NotPrivateWarning):
        release = dpopt.run(spec, seed=2, out=tmp_path / "release")
    tables = release.report["accuracy"]["workload_tables"]
    assert [t["table"] for t in tables] == [row["table"] for row in release.info["tables"]]
    for t, row in zip(tables, release.info["tables"]):
        assert t["estimated_rmse"] == pytest.approx(np.sqrt(row["released_risk"] / t["answers"]))
        assert t["estimated_rmse"] <= t["noisy_estimated_rmse"]   # the rule's promise, restated per answer
    summary = (tmp_path / "release" / "summary.md").read_text()
    assert "| workload table |" in summary and summary.count("estimated error") >= 2


def test_a_release_result_prints_one_line_per_key(quickstart_release):
    release, _ = quickstart_release
    text = repr(release)   # scipy's nested formatter failed on the report's empty dicts
    assert "counts: array(shape=(17280,), dtype=int64)" in text and "report: dict(" in text
    assert all(len(line) < 140 for line in text.splitlines())
