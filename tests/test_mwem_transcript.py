"""The measurement transcript of MWEM and DualQuery (``transcript = true``, issue 29).

The transcript is every noisy answer the run drew, with the query each MWEM round selected
(:mod:`dpopt.algorithms.transcript`). Checked here: it equals the draws used (the true answers
of the selected queries plus the noise the sampler returned, bit for bit), the option changes no
other output bit for bit and no ledger entry, it is a spec key and a written file, and the audit
reads it (which is how it sees the floating-point Laplace plant that the integer table hides).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms.dualquery import DualQuery
from dpopt.algorithms.mwem import MWEM, marginal_workload
from dpopt.algorithms.transcript import TRANSCRIPT_COLUMNS, transcript_frame
from dpopt.errors import ParameterError, SpecError
from dpopt.model.constraints import ConstraintSet, Integrality, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom
from dpopt.spec import parse_spec

DOMAIN = Domain.from_dict({"a": 2, "b": 3, "c": 2})
DATA = Dataset.from_histogram(np.array([30, 5, 0, 12, 7, 1, 0, 3, 9, 14, 2, 6]), DOMAIN)
CONSTRAINTS = ConstraintSet(DOMAIN, [NonNegativity(), Integrality()])
HALF = Fraction(1, 2)


def _release(algorithm, budget, seed, monkeypatch=None):
    """One seeded run; with ``monkeypatch``, also the noise vectors the sampler returned, in order."""
    drawn = []
    if monkeypatch is not None:
        import dpopt.privacy.mechanisms as mechanisms

        original = mechanisms.discrete_laplace

        def recording(*args, **kw):
            noise = original(*args, **kw)
            drawn.append(np.array(noise, copy=True))
            return noise
        monkeypatch.setattr(mechanisms, "discrete_laplace", recording)
    accountant = budget.accountant()
    plan = algorithm.plan(DOMAIN, CONSTRAINTS, budget)
    release = algorithm.run(plan, DATA, accountant, SeededRandom(seed))
    return release, accountant, drawn


def _mwem(select, transcript, count_share=HALF, rounds=4):
    return MWEM(marginals=2, rounds=rounds, select=select, repeat_passes=2, count_share=count_share,
                transcript=transcript)


@pytest.mark.parametrize("select", ["query", "block"])
@pytest.mark.parametrize("count_share", [HALF, None], ids=["noisy-n", "public-n"])
def test_mwem_transcript_is_the_true_answers_of_the_selected_queries_plus_the_noise_drawn(select, count_share,
                                                                                      monkeypatch):
    release, _, drawn = _release(_mwem(select, True, count_share), Budget.pure(2), 5, monkeypatch)
    t = release["transcript"]
    assert list(t.columns) == list(TRANSCRIPT_COLUMNS)
    workload = marginal_workload(DOMAIN, 2)
    expected_true = []
    if count_share is not None:
        first = t.iloc[0]
        assert (first["step"], first["block"], first["row"]) == ("record count", -1, 0)
        expected_true.append(float(DATA.total))
    rounds = t[t["block"] >= 0]
    assert list(dict.fromkeys(rounds["step"])) == [f"mwem round {i}: measure" for i in range(1, 5)]
    for (step, block), rows in rounds.groupby(["step", "block"], sort=False):
        answers = workload[block].answer(DATA)
        expected_true.extend(answers[rows["row"].to_numpy()].astype(float))
        if select == "block":
            assert rows["row"].tolist() == list(range(workload[block].num_rows))
        else:
            assert len(rows) == 1
    selected = release.info["selected"]
    assert [s["block"] for s in selected] == [", ".join(workload[b].attrs) for b in
                                               rounds.drop_duplicates("step")["block"]]
    noise = np.concatenate(drawn)
    assert noise.size == len(t)  # one sampler call per measurement, nothing else drew Laplace noise
    np.testing.assert_array_equal(t["noisy"].to_numpy(), np.asarray(expected_true) + noise)
    # the values the fit used, bit for bit
    used = np.concatenate([np.asarray(m.values, dtype=np.float64) for m in release.measurements])
    assert t["noisy"].to_numpy().tobytes() == used.tobytes()
    assert np.allclose(t["stddev"], np.repeat([m.stddev for m in release.measurements],
                                              [np.size(m.values) for m in release.measurements]))


def _same_release(a, b, ignore=("parameters", "transcript")):
    assert set(a) - set(ignore) == set(b) - set(ignore)
    for key in set(a) - set(ignore):
        x, y = a[key], b[key]
        if key == "counts" or key == "records":
            if x is None:
                assert y is None
            elif isinstance(x, pd.DataFrame):
                pd.testing.assert_frame_equal(x, y)
            else:
                assert np.asarray(x).dtype == np.asarray(y).dtype and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        elif key == "answers":
            assert list(x) == list(y)
            for label in x:
                pd.testing.assert_frame_equal(x[label], y[label], check_exact=True)
        elif key == "measurements":
            assert [(m.label, m.query.name, m.scale, m.cost) for m in x] == [(m.label, m.query.name, m.scale, m.cost)
                                                                             for m in y]
            assert all(np.asarray(m.values).tobytes() == np.asarray(n.values).tobytes() for m, n in zip(x, y))
        elif key == "accountant":
            assert [(e.label, e.cost, e.detail) for e in x.ledger] == [(e.label, e.cost, e.detail) for e in y.ledger]
            assert x.spent == y.spent
        elif key in ("rounding", "reconstruction"):
            assert (x is None) == (y is None)
            if x is not None:
                assert x.status == y.status and np.asarray(x.x).tobytes() == np.asarray(y.x).tobytes()
        elif key == "info":
            assert set(x) == set(y)
            for k in x:
                if k in ("rounds_log", "timings", "ip_time_median", "ip_time_max"):
                    continue  # solver times differ between any two runs
                if isinstance(x[k], pd.DataFrame):
                    pd.testing.assert_frame_equal(x[k], y[k])
                elif isinstance(x[k], np.ndarray):
                    assert x[k].tobytes() == y[k].tobytes()
                else:
                    assert x[k] == y[k], k
        else:
            assert x == y, key


@pytest.mark.parametrize("select", ["query", "block"])
def test_mwem_transcript_changes_no_other_output_and_no_ledger_entry(select):
    on, acc_on, _ = _release(_mwem(select, True), Budget.pure(1), 11)
    off, acc_off, _ = _release(_mwem(select, False), Budget.pure(1), 11)
    assert "transcript" in on and "transcript" not in off
    _same_release(on, off)
    assert [(e.label, e.cost) for e in acc_on.ledger] == [(e.label, e.cost) for e in acc_off.ledger]
    assert {k: v for k, v in on.parameters.items() if k != "transcript"} == \
        {k: v for k, v in off.parameters.items() if k != "transcript"}


def _dualquery(transcript, count_share=HALF):
    return DualQuery(order=2, eta=Fraction(1, 10), rounds=3, samples=None, count_share=count_share,
                     transcript=transcript)


def test_dualquery_transcript_is_the_noisy_count_drawn_and_changes_nothing_else(monkeypatch):
    budget = Budget.approx(1, Fraction(1, 10**6))
    on, acc_on, drawn = _release(_dualquery(True), budget, 4, monkeypatch)
    t = on["transcript"]
    assert t[["step", "block", "row"]].values.tolist() == [["record count", -1, 0]]
    assert len(drawn) == 1 and t["noisy"].to_numpy().tobytes() == (DATA.total + drawn[0]).astype(float).tobytes()
    monkeypatch.undo()
    off, acc_off, _ = _release(_dualquery(False), budget, 4)
    _same_release(on, off)
    assert [(e.label, e.cost) for e in acc_on.ledger] == [(e.label, e.cost) for e in acc_off.ledger]
    public, _, _ = _release(_dualquery(True, None), budget, 4)
    assert len(public["transcript"]) == 0 and list(public["transcript"].columns) == list(TRANSCRIPT_COLUMNS)


@pytest.mark.filterwarnings("ignore::dpopt.release.pipeline.NotPrivateWarning")
def test_transcript_is_a_spec_key_with_a_clear_error_and_a_written_file(tmp_path):
    from dpopt.release.pipeline import run

    raw = {"name": "m", "domain": {"attributes": {"a": 2, "b": 3, "c": 2}}, "data": {"source": "file"},
           "privacy": {"accounting": "pure", "epsilon": 1}, "algorithm": "mwem",
           "mwem": {"marginals": 2, "rounds": 2, "count_share": 0.5, "transcript": True},
           "constraints": {"nonnegative": True, "integer": True},
           "output": {"formats": ["csv"], "plots": False, "summary": []}}
    assert parse_spec(raw).algorithm.params.transcript is True
    assert parse_spec({**raw, "mwem": {"marginals": 2}}).algorithm.params.transcript is False
    with pytest.raises(SpecError, match="transcript"):
        parse_spec({**raw, "mwem": {"marginals": 2, "transcript": "yes"}})
    with pytest.raises(ParameterError, match="transcript must be true or false"):
        MWEM(marginals=2, transcript=1)
    with pytest.raises(ParameterError, match="transcript must be true or false"):
        DualQuery(order=2, rounds=3, samples=None, transcript="yes")
    out = tmp_path / "rel"
    result = run(raw, DATA.to_frame(), out=out, seed=3)
    written = pd.read_csv(out / "transcript.csv", comment="#")
    assert list(written.columns) == list(TRANSCRIPT_COLUMNS) and len(written) == 3  # the count and two cells
    np.testing.assert_array_equal(written["noisy"].to_numpy(), result["transcript"]["noisy"].to_numpy())
    assert "transcript.csv" in result.report["files"]


def test_transcript_frame_of_measurements_outside_the_workload_and_bad_lengths():
    from dpopt.model.measurement import Measurement
    from dpopt.model.queries import Total

    m = Measurement(Total(DOMAIN), np.array([3.0]), "discrete_laplace", 1.0, 2.0, None, "record count")
    t = transcript_frame([m])
    assert t[["step", "query", "block", "row", "noisy"]].values.tolist() == [["record count", Total(DOMAIN).name, -1, 0,
                                                                              3.0]]
    assert len(transcript_frame([])) == 0
    with pytest.raises(ValueError, match="1 answers for 2 rows"):
        transcript_frame([m], [(0, np.array([0, 1]), "a")])


# ---- what the audit sees (issue 29: the float-Laplace plant) ----------------------------------------
def _audit_statistics(alg, transcript, bug, records, runs):
    """``runs`` runs of ``alg``'s audit configuration (transcript on or off) on ``records`` records in
    the first cell, with ``bug`` planted (or none): the statistics matrix and their names."""
    from dpopt.audit.configurations import AUDIT_CONFIGURATIONS, configured_spec
    from dpopt.audit.mutants import Planted
    from dpopt.audit.spec import spec_target

    config = AUDIT_CONFIGURATIONS[alg]
    assert config.replace[alg]["transcript"] is True  # the configuration turns it on
    original = dict(config.replace[alg])
    try:
        config.replace[alg]["transcript"] = transcript
        target, _, _ = spec_target(configured_spec(alg))
    finally:
        config.replace[alg].clear()
        config.replace[alg].update(original)
    data = Dataset.from_histogram(np.eye(1, target.domain.size, dtype=np.int64).ravel() * records, target.domain)
    target.prepare(data, SeededRandom(1))
    run = Planted(target, bug).run if bug else target.run
    rows = np.array([run(data, SeededRandom(1000 + i))[0] for i in range(runs)])
    return rows, target.names


@pytest.mark.slow
@pytest.mark.parametrize("transcript", [False, True], ids=["table-only", "with-transcript"])
def test_the_float_laplace_plant_is_invisible_in_mwems_table_and_visible_in_its_transcript(transcript):
    """MWEM's audit configuration (1 round, a noisy count, an integer table): with floating-point
    Laplace noise planted, every statistic of the table alone is an integer (nothing for an
    exact-value event to see), while the transcript's noisy count has bits below 2^-53 far more
    often with no record than with one: near 0 a double keeps bits that ``1 + noise`` rounds away
    (Mironov 2012). The correct algorithm's transcript is all integers (exact discrete noise)."""
    from dpopt.audit.events import Event

    from scipy.stats import fisher_exact

    runs = 100 if transcript else 30
    empty, names = _audit_statistics("mwem", transcript, "float_laplace", 0, runs)
    one, _ = _audit_statistics("mwem", transcript, "float_laplace", 1, runs)
    if not transcript:
        assert not any(n.startswith("transcript") for n in names)
        assert np.array_equal(empty, np.round(empty)) and np.array_equal(one, np.round(one))
        return
    j = names.index("transcript noisy[0]")
    fine = Event("offgrid", j, 53.0)  # the audit's own exact-value event
    k_empty, k_one = int(fine.hits(empty).sum()), int(fine.hits(one).sum())
    # At 1 record the count lies in [1/2, ...) when |noise| < 1/2 (a grid of 2^-53 or coarser) and
    # never has those bits; at 0 a noise below 1/2 in size usually has them (P about 0.2 at the
    # count's scale 4/3). The gap must be significant, not just present.
    assert k_one == 0
    assert fisher_exact([[k_empty, runs - k_empty], [k_one, runs - k_one]], alternative="greater")[1] < 1e-3, k_empty
    correct, _ = _audit_statistics("mwem", True, None, 0, 30)
    cols = [i for i, n in enumerate(names) if n.startswith("transcript")]
    assert np.array_equal(correct[:, cols], np.round(correct[:, cols]))


def test_the_audit_reads_the_transcript_in_a_fixed_layout_failed_runs_included():
    """A run that releases nothing gives zeros in the same layout (a DualQuery run may fail)."""
    from dpopt.audit import AlgorithmTarget

    target = AlgorithmTarget(_mwem("query", True), DOMAIN, Budget.pure(1), CONSTRAINTS)
    target.prepare(DATA, SeededRandom(2))
    names = target.names
    # the noisy count and 4 rounds' answers; the selections are labels, audited through the table
    assert [n for n in names if n.startswith("transcript")] == [f"transcript noisy[{i}]" for i in range(5)]
    values, problem = target.run(DATA, SeededRandom(3))
    assert problem is None and values.size == len(names)
    release, accountant, _ = target._release(DATA, SeededRandom(3))
    np.testing.assert_array_equal(values[names.index("transcript noisy[0]"):][:5], release["transcript"]["noisy"])
    failed, _ = target.statistics(None, accountant)
    assert failed.size == len(names) and not failed.any()
