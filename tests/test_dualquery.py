"""DualQuery as a registered algorithm: its accounting, its query player, its privacy's independence
of the oracle, reproducibility, fallbacks and the release it builds."""

from __future__ import annotations

import importlib
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms import REGISTRY
from dpopt.algorithms.dualquery import DualQuery, build_workload, play
from dpopt.algorithms.dualquery_privacy import (
    QueryPlayer,
    dualquery_epsilon,
    per_sample_epsilon,
    solve_rounds,
    solve_samples,
)
from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.estimate.engines.best_response import BestResponse, RecordProgram
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Integrality, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Conjunctions, Marginal
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom, make_random

KDD_N = 494_021  # the paper's KDD99 records
# The module (the package re-exports a function of the same name).
dq = importlib.import_module("dpopt.algorithms.dualquery")


def hand_epsilon(eta, T, s, n, delta):
    """The guarantee written out in floating point (advanced composition of s(T-1) samples)."""
    e0 = 2 * eta * (T - 1) / n
    k = s * (T - 1)
    return e0 * math.sqrt(2 * k * math.log(1 / delta)) + k * e0 * math.expm1(e0)


def case(n=600, seed=2):
    dom = Domain.from_dict({"a": 3, "b": 2, "c": 2, "d": 3})
    gen = np.random.default_rng(seed)  # test data, not privacy noise
    a = gen.integers(0, 3, n)
    b = (gen.random(n) < 0.2 + 0.25 * a).astype(int)
    c = (gen.random(n) < 0.8).astype(int)
    d = np.where(gen.random(n) < 0.7, a, gen.integers(0, 3, n))
    frame = pd.DataFrame({"a": a, "b": b, "c": c, "d": d})
    frame = frame[~((frame.a == 2) & (frame.c == 0))].reset_index(drop=True)
    return dom, Dataset.from_frame(frame, dom)


def zeros(dom):
    cs = ConstraintSet(dom)
    cs.add(StructuralZeros("a == 2 and c == 0", name="no a2 without c"))
    return cs


# ---- accounting --------------------------------------------------------------------------------
def test_the_guarantee_at_the_papers_kdd99_parameters():
    # Figure 3's setting: eta = 1.2, T = 170, s = 1750 on n = 494,021 records, delta = 10^-3.
    got = dualquery_epsilon(Fraction(6, 5), 170, 1750, KDD_N, Fraction(1, 1000))
    hand = hand_epsilon(1.2, 170, 1750, KDD_N, 1e-3)
    assert hand == pytest.approx(1.8590188206, rel=1e-9)
    assert float(got) >= hand and float(got) == pytest.approx(hand, rel=1e-12)
    assert per_sample_epsilon(Fraction(6, 5), 170, KDD_N) == Fraction(2 * 6 * 169, 5 * KDD_N)


@pytest.mark.parametrize("eta, T, s, n, delta", [
    (Fraction(1, 2), 2, 1, 100, Fraction(1, 10**6)),
    (Fraction(2), 40, 300, 21_574, Fraction(1, 10**5)),
    (Fraction(1, 10), 200, 200, 48_842, Fraction(1, 1000)),
])
def test_the_guarantee_matches_the_formula(eta, T, s, n, delta):
    got = dualquery_epsilon(eta, T, s, n, delta)
    hand = hand_epsilon(float(eta), T, s, n, float(delta))
    assert float(got) >= hand * (1 - 1e-15) and float(got) == pytest.approx(hand, rel=1e-12)


def test_one_round_costs_nothing():
    assert dualquery_epsilon(1, 1, 10**6, 10, Fraction(1, 10)) == 0


def test_rounds_and_samples_are_solved_as_the_largest_that_fit():
    eps, eta, delta = Fraction(1), Fraction(6, 5), Fraction(1, 1000)
    T = solve_rounds(eps, eta, 1750, KDD_N, delta)
    assert T == 116  # hand: hand_epsilon(1.2, 116, 1750, n, 1e-3) <= 1 < hand_epsilon(..., 117, ...)
    assert hand_epsilon(1.2, T, 1750, KDD_N, 1e-3) <= 1 < hand_epsilon(1.2, T + 1, 1750, KDD_N, 1e-3)
    s = solve_samples(eps, eta, 170, KDD_N, delta)
    assert dualquery_epsilon(eta, 170, s, KDD_N, delta) <= eps < dualquery_epsilon(eta, 170, s + 1, KDD_N, delta)
    with pytest.raises(ParameterError, match="even T = 2"):
        solve_rounds(Fraction(1, 10**6), eta, 1750, KDD_N, delta)


# ---- the query player --------------------------------------------------------------------------
def test_the_query_players_distribution_is_the_multiplicative_weights_update():
    dom, data = case()
    workload = build_workload(dom, DualQuery.Params(order=2, rounds=3))
    counts = workload.count_records(data.codes)
    n, eta = data.total, Fraction(7, 10)
    player = QueryPlayer(counts, n, eta)
    direct = np.full(workload.num_rows, 1.0 / workload.num_rows)  # Q_1: uniform
    gen = np.random.default_rng(4)
    for t in range(6):
        assert np.allclose(player.distribution(), direct, rtol=1e-12, atol=0)
        record = dom.unravel(gen.integers(0, dom.size, 1))[0]
        loss = counts / n - workload.satisfied(record)  # q(D) - q(x_t)
        direct = direct * np.exp(float(eta) * loss)
        direct /= direct.sum()
        player.update(workload.satisfied(record))


# ---- privacy does not depend on the oracle ------------------------------------------------------
class CountingRandom(SeededRandom):
    def __init__(self, seed, accountant):
        super().__init__(seed)
        self.accountant, self.charged_before_first_draw = accountant, None

    def words(self, n):
        if self.charged_before_first_draw is None:
            self.charged_before_first_draw = len(self.accountant.ledger) > 0
        return super().words(n)


def random_oracle(seed):
    gen = np.random.default_rng(seed)  # the stand-in's own randomness, unrelated to the data

    def oracle(program, sampled, multiplicity, **_):
        cells = program.domain.unravel(np.arange(program.domain.size))
        allowed = cells[program.allows(cells)]
        codes = allowed[gen.integers(0, len(allowed))]
        return BestResponse(codes=codes, score=float(multiplicity[sampled.satisfied(codes)].sum()), bound=np.nan,
                            gap=np.nan, status=Status.TIME_LIMIT, time=0.0, backend="random", solver="random",
                            message="random record")
    return oracle


def test_ledger_and_sampling_law_are_the_same_whatever_the_oracle(monkeypatch):
    dom, data = case()
    cs = zeros(dom)
    budget = Budget.approx(2, Fraction(1, 10**5))
    params = DualQuery.Params(order=2, eta=Fraction(1, 2), rounds=6, samples=None)
    captured = []
    real_sample = QueryPlayer.sample

    def spy(self, size, rng):
        captured.append((self.scores.copy(), self.coef, size))
        return real_sample(self, size, rng)

    monkeypatch.setattr(QueryPlayer, "sample", spy)
    ledgers, releases = [], []
    for oracle in (None, random_oracle(0)):
        if oracle is not None:
            monkeypatch.setattr(dq, "best_response", oracle)
        algorithm = DualQuery(params)
        plan = algorithm.plan(dom, cs, budget)
        accountant = budget.accountant()
        rng = CountingRandom(5, accountant)
        captured.clear()
        release = algorithm.run(plan, data, accountant, rng)
        assert rng.charged_before_first_draw  # the whole cost is charged before any sample
        ledgers.append([(e.label, e.cost) for e in accountant.ledger])
        releases.append(release)
        # Round t samples from exp((eta/n) u) with u = sum_{i<t} (c_q - n q(x_i)): a function of the
        # data and the RELEASED records only, the same function whatever produced the records.
        workload = plan.details
        c = workload.count_records(data.codes)
        records = release.records.to_numpy(dtype=np.int64)
        n = data.total
        for t, (scores, coef, size) in enumerate(captured):
            expected = t * c - n * sum((workload.satisfied(records[i]).astype(np.int64) for i in range(t)),
                                       np.zeros(workload.num_rows, dtype=np.int64))
            assert np.array_equal(scores, expected) and coef == params.eta / n
            assert size == release.info["samples"]
    assert ledgers[0] == ledgers[1] and len(ledgers[0]) == 1
    assert releases[0].info["samples"] == releases[1].info["samples"]
    assert (releases[1].info["rounds_log"]["status"] == "TIME_LIMIT").all()


def test_a_round_without_a_record_keeps_the_previous_one():
    dom, data = case()
    program = RecordProgram(dom, zeros(dom))
    workload = build_workload(dom, DualQuery.Params(order=2, rounds=3))
    calls = []

    def flaky(program, sampled, multiplicity):
        calls.append(1)
        if len(calls) in (1, 3):
            return BestResponse(None, np.nan, np.nan, np.nan, Status.TIME_LIMIT, 0.0, "x", "x", "no incumbent")
        return random_oracle(1)(program, sampled, multiplicity)

    game = play(workload, data, data.total, 1, 4, 20, program, SeededRandom(3), oracle=flaky)
    assert list(game.log["fallback"]) == [True, False, True, False]
    assert program.allows(game.records[0])[0]             # round 1: an allowed record from a feasibility solve
    assert np.array_equal(game.records[2], game.records[1])  # round 3: the previous record


# ---- runs ---------------------------------------------------------------------------------------
def test_a_seeded_run_is_reproducible():
    dom, data = case()
    budget = Budget.approx(1, Fraction(1, 10**5))
    algorithm = DualQuery(order=2, eta=Fraction(1, 2), rounds=5, samples=None)
    cs = zeros(dom)
    one = algorithm.run(algorithm.plan(dom, cs, budget), data, budget.accountant(), make_random(8))
    two = algorithm.run(algorithm.plan(dom, cs, budget), data, budget.accountant(), make_random(8))
    assert one.records.equals(two.records) and np.array_equal(one.counts, two.counts)
    assert [(e.label, e.cost) for e in one.accountant.ledger] == [(e.label, e.cost) for e in two.accountant.ledger]


def test_records_avoid_the_zeros_and_the_table_is_their_scaled_histogram():
    dom, data = case()
    cs = zeros(dom)
    budget = Budget.approx(1, Fraction(1, 10**5))
    algorithm = DualQuery(order=2, eta=Fraction(1, 2), rounds=8, samples=None)
    release = algorithm.run(algorithm.plan(dom, cs, budget), data, budget.accountant(), make_random(1))
    codes = release.records.to_numpy(dtype=np.int64)
    assert len(codes) == 8 and RecordProgram(dom, cs).allows(codes).all()
    assert release.info["multiplicities"]["count"].sum() == 8
    h = np.bincount(dom.ravel(codes), minlength=dom.size)
    assert np.allclose(release.counts, h * data.total / 8)
    assert release.status is Status.COMPLETED and release.success
    assert release.info["rounds"] == 8 and release.ledger["epsilon"].sum() == 1

    cs.add(NonNegativity()).add(Integrality())
    rounded = algorithm.run(algorithm.plan(dom, cs, budget), data, budget.accountant(), make_random(1))
    assert rounded.counts.dtype.kind == "i" and rounded.counts.sum() == data.total
    assert np.all(rounded.counts[cs.zero_mask()] == 0)


def test_the_projection_keeps_invariants_and_is_reported_separately():
    dom, data = case()
    cs = zeros(dom)
    cs.add(NonNegativity())
    cs.invariant_from_data(Marginal(dom, ("a",)), data, "a published")
    budget = Budget.approx(1, Fraction(1, 10**5))
    with pytest.raises(ParameterError, match="project = true"):
        DualQuery(order=2, rounds=4, samples=None).plan(dom, cs, budget)
    algorithm = DualQuery(order=2, eta=Fraction(1, 2), rounds=4, samples=None, project=True)
    release = algorithm.run(algorithm.plan(dom, cs, budget), data, budget.accountant(), make_random(2))
    (inv,) = cs.invariants
    assert np.abs(inv.query.matvec(release.counts) - inv.values).max() <= 1e-6 * data.total
    assert np.all(release.counts[cs.zero_mask()] == 0) and (release.counts >= -1e-9).all()
    assert release.reconstruction is not None and len(release.records) == 4


def test_dualquery_answers_the_workload_better_than_random_records():
    dom, data = case(n=3000)
    budget = Budget.approx(4, Fraction(1, 10**5))
    algorithm = DualQuery(order=2, eta=Fraction(1, 1), rounds=30, samples=None)
    plan = algorithm.plan(dom, ConstraintSet(dom), budget)
    release = algorithm.run(plan, data, budget.accountant(), make_random(4))
    workload = plan.details
    truth = workload.count_records(data.codes) / data.total
    synthetic = workload.count_records(release.records.to_numpy(dtype=np.int64)) / 30
    baseline = []
    gen = np.random.default_rng(0)
    for _ in range(20):  # random records of the same size: what no information gives
        rand = dom.unravel(gen.integers(0, dom.size, 30))
        baseline.append(np.abs(workload.count_records(rand) / 30 - truth).mean())
    assert np.abs(synthetic - truth).mean() < min(baseline)


# ---- input checks -------------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    ({"rounds": 1}, "rounds must be an integer >= 2"),
    ({"rounds": None, "samples": None}, "give rounds or samples"),
    ({"samples": 0}, "samples must be a positive integer"),
    ({"eta": -1}, "eta"),
    ({"solver": "gurobi"}, "solver must be one of"),
    ({"workload": "all"}, "workload must be one of"),
    ({"time_limit": 0}, "time_limit"),
    ({"order": 0}, "order must be a positive integer"),
    ({"mip_gap": 1.5}, "mip_gap"),
    ({"records": 0}, "records must be a positive integer"),
])
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(ParameterError, match=message):
        DualQuery(**options)


@pytest.mark.parametrize("budget", [Budget.pure(1), Budget.zcdp(Fraction(1, 2))])
def test_pure_and_zcdp_accounting_are_refused_with_the_reason(budget):
    dom, _ = case()
    with pytest.raises(ParameterError, match="advanced composition"):
        DualQuery(rounds=3).plan(dom, ConstraintSet(dom), budget)


def test_rounds_and_samples_beyond_the_budget_are_refused_before_any_draw():
    dom, data = case()
    budget = Budget.approx(Fraction(1, 10), Fraction(1, 10**5))
    algorithm = DualQuery(order=2, rounds=50, samples=5000, records=data.total)
    with pytest.raises(ParameterError, match="above the budget"):
        algorithm.plan(dom, ConstraintSet(dom), budget)
    smaller = Budget.approx(Fraction(1, 20), Fraction(1, 10**6)).accountant()
    ok = DualQuery(order=2, rounds=3, samples=None)
    source = CountingRandom(1, smaller)
    with pytest.raises(BudgetExceededError):
        ok.run(ok.plan(dom, ConstraintSet(dom), budget), data, smaller, source)
    assert source.charged_before_first_draw is None  # nothing drawn


def test_registered_with_its_reference():
    assert REGISTRY["dualquery"] is DualQuery
    assert "1402.1526" in DualQuery.reference and DualQuery.accountings == ("approx",)
    dom, _ = case()
    plan = DualQuery(order=2, rounds=4, samples=None, records=500).plan(dom, ConstraintSet(dom),
                                                                     Budget.approx(1, Fraction(1, 10**5)))
    assert any("T = 4 rounds" in line for line in plan.lines)
    assert sum(s.share for s in plan.steps) == 1
    assert isinstance(plan.details, Conjunctions) and plan.details.negated.sum() == plan.details.num_rows // 2


def test_rounds_are_bounded_by_solver_work_and_cpu_time_not_wall_time(monkeypatch):
    """The integer programs get a work budget and a CPU-time backstop, never a wall-clock limit, so
    the same seed plays the same game on an idle or a loaded machine; each round starts from the
    earlier records (the first from the all-zero record, improved)."""
    import dpopt.estimate.engines.best_response as br_module

    dom, data = case()
    budget = Budget.approx(2, Fraction(1, 10**5))
    params = DualQuery.Params(order=2, eta=Fraction(1, 2), rounds=6, samples=None, work_limit=3, time_limit=7.0)
    seen = []
    real = br_module.get_backend

    def spy(name):
        backend = real(name)

        class Spy:
            def solve(self, form, **kwargs):
                seen.append(kwargs)
                return backend.solve(form, **kwargs)
        return Spy()

    monkeypatch.setattr(br_module, "get_backend", spy)
    releases = []
    for _ in range(2):
        algorithm = DualQuery(params)
        plan = algorithm.plan(dom, zeros(dom), budget)
        releases.append(algorithm.run(plan, data, budget.accountant(), make_random(8)))
    seen = [k for k in seen if "work_limit" in k]  # not the plan's feasibility check (public, no data)
    assert len(seen) == 12
    # a small program keeps HiGHS's presolve (PRESOLVE_OFF_VALUES)
    assert all(k["time_limit"] is None and k["work_limit"] == 3 and k["cpu_limit"] == 7.0 and k["presolve"]
               and k["mip_start"] is not None for k in seen)
    first, second = (r.info["rounds_log"] for r in releases)
    assert np.array_equal(releases[0].info["record_codes"], releases[1].info["record_codes"])
    assert first["work"].tolist() == second["work"].tolist() and (first["work"] <= 3).all()
    assert set(first["status"]) <= {"OPTIMAL", "ITERATION_LIMIT"} and not first["fallback"].any()
    assert (first["score"] >= first["start_score"]).all()


def test_presolve_is_off_only_for_programs_where_it_costs_more_than_it_saves():
    from dpopt.algorithms.dualquery import PRESOLVE_OFF_VALUES, _limits

    assert _limits("highs", 5.0, 10, PRESOLVE_OFF_VALUES - 1)["options"] == {"presolve": True, "cpu_limit": 5.0}
    assert _limits("highs", 5.0, 10, 419) == {"work_limit": 10, "options": {"presolve": False, "cpu_limit": 5.0}}
    assert _limits("pulp", 5.0, 10, 419) == {"time_limit": 5.0}  # CBC: its own time limit only
