"""MWEM (Hardt, Ligett, McSherry 2012): the update against a plain re-implementation of the
paper's reference code, convergence without noise, the selection law, the ledger."""

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpopt.algorithms.mwem import SelectedRows, WorkloadEvaluator, mwem
from dpopt.errors import ParameterError, PrivacyParameterError, QueryError
from dpopt.estimate.engines.mw_step import MarginalIndex, MWState
from dpopt.model.constraints import ConstraintSet, Invariant, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import FourierParity, Marginal, RangeQueries, Total, all_marginals
from dpopt.privacy.randomness import make_random


@pytest.fixture(scope="module")
def small():
    dom = Domain(("a", "b", "c", "d"), (2, 3, 2, 2))
    counts = np.random.default_rng(3).integers(0, 9, size=dom.size)
    return Dataset.from_histogram(counts, dom)


def reference_mw(A, rows, values, passes):
    """The paper's reference loop (Fig. 8), written plainly over dense query rows:
    for each pass, for each past measurement in order,
    A[x] *= exp(q(x) * (m - q(A)) / (2 n)), then renormalise to n."""
    A = A.copy()
    n = A.sum()
    for _ in range(passes):
        for q, m in zip(rows, values):
            A = A * np.exp(q * (m - q @ A) / (2.0 * n))
            A = A * (n / A.sum())
    return A


def test_update_matches_reference_code(small):
    dom = small.domain
    rng = np.random.default_rng(0)
    marg = Marginal(dom, ["a", "c"])
    ranges = RangeQueries(dom, ["b"], [[0], [1]], [[1], [2]])
    parity = FourierParity(Domain(("p", "q", "r"), (2, 2, 2)), [("p",), ("q", "r")])
    n = float(small.total)
    # marginal cells and ranges on the mixed domain
    picks = [(marg, 1), (ranges, 0), (marg, 3), (ranges, 1), (marg, 1)]
    values = rng.normal(n / 4, 5, size=len(picks))
    state = MWState(dom, n, merge=False)
    for (q, r), v in zip(picks, values):
        state.add_measurement(q, [r], [v])
    state.passes(7)
    dense_rows = [q.to_dense()[r] for q, r in picks]
    expected = reference_mw(np.full(dom.size, n / dom.size), dense_rows, values, 7)
    np.testing.assert_allclose(state.x, expected, rtol=1e-12)
    # parities (entries +-1) on a binary domain
    state = MWState(parity.domain, 50.0, merge=False)
    state.add_measurement(parity, [0], [10.0])
    state.add_measurement(parity, [1], [-4.0])
    state.passes(5)
    expected = reference_mw(np.full(8, 50 / 8), [parity.to_dense()[0], parity.to_dense()[1]], [10.0, -4.0], 5)
    np.testing.assert_allclose(state.x, expected, rtol=1e-12)


def test_whole_run_replays_with_reference(small):
    """Fig. 1 end to end: re-running the reference loop on the run's own measurements
    reproduces the released table, and every selection was a workload row."""
    W = all_marginals(small.domain, 2)
    res = mwem(small, W, 2, rounds=6, rng=make_random(11), repeat_passes=4, merge=False)
    rows = [W[b].to_dense()[r] for b, r in res.selected]
    values = [m.values[0] for m in res.measurements]
    n = float(small.total)
    A = np.full(small.domain.size, n / small.domain.size)
    iterates = []
    for i in range(len(rows)):
        A = reference_mw(A, rows[: i + 1], values[: i + 1], 4)
        iterates.append(A)
    np.testing.assert_allclose(res.last, A, rtol=1e-10)
    np.testing.assert_allclose(res.average, np.mean(iterates, axis=0), rtol=1e-10)
    # the plain Fig. 1 update (no repetition): one step per measurement
    res = mwem(small, W, 2, rounds=5, rng=make_random(12))
    rows = [W[b].to_dense()[r] for b, r in res.selected]
    A = np.full(small.domain.size, n / small.domain.size)
    for q, m in zip(rows, [m.values[0] for m in res.measurements]):
        A = reference_mw(A, [q], [m], 1)
    np.testing.assert_allclose(res.x, A, rtol=1e-10)


def test_converges_to_data_without_noise(small):
    """With an enormous budget the noise vanishes and MWEM fits the data (no empty cells:
    multiplicative weights approach a zero cell only sublinearly)."""
    counts = np.random.default_rng(8).integers(1, 9, size=small.domain.size)
    small = Dataset.from_histogram(counts, small.domain)
    W = [Marginal(small.domain, small.domain.attrs)] + all_marginals(small.domain, 2)
    res = mwem(small, W, 10**9, rounds=8, rng=make_random(5), select="block",
               repeat_passes=50, boost=64.0, final_passes=2000, tol=1e-13)
    assert all(np.array_equal(m.values, W[b].answer(small)) for m, (b, _) in zip(res.measurements, res.selected))
    np.testing.assert_allclose(res.x, small.histogram(), atol=1e-3)


def test_selection_frequencies_follow_exponential_law():
    """First-round picks ~ exp(eps s / (4T)) with s = |q(A_0) - q(B)| (chi-square test)."""
    dom = Domain(("a", "b"), (2, 2))
    data = Dataset.from_histogram(np.array([14, 2, 0, 4]), dom)
    W = [Marginal(dom, ["a", "b"])]
    eps, T, runs = 4, 2, 1500
    picks = np.array([mwem(data, W, eps, rounds=T, rng=make_random(1000 + i)).selected[0][1] for i in range(runs)])
    scores = np.abs(np.full(4, 5.0) - np.array([14, 2, 0, 4]))
    p = np.exp(eps * scores / (4 * T))
    p /= p.sum()
    observed = np.bincount(picks, minlength=4)
    assert stats.chisquare(observed, p * runs).pvalue > 1e-3
    # power: the law at twice the rate is rejected
    p2 = np.exp(2 * eps * scores / (4 * T))
    p2 /= p2.sum()
    assert stats.chisquare(observed, p2 * runs).pvalue < 1e-6


@pytest.mark.parametrize("options", [
    {}, {"select": "block"}, {"init_share": "1/4"}, {"adaptive": True, "rounds": 4}, {"iterate": "average"},
])
def test_ledger_sums_exactly_to_epsilon(small, options):
    options = {"rounds": 5, **options}
    res = mwem(small, all_marginals(small.domain, 2), "7/10", rng=make_random(2), **options)
    frame = res.accountant.ledger_frame()
    assert frame["epsilon"].sum() == Fraction(7, 10) == res.accountant.spent.epsilon
    n_select = sum("select" in label for label in frame["label"])
    assert n_select == res.rounds == len(res.selected)
    if not options.get("adaptive"):
        assert res.rounds == options["rounds"]
        # each round: eps/(2T) to select and eps/(2T) to measure (Fig. 1)
        share = Fraction(7, 10) * (1 - Fraction(options.get("init_share", 0))) / (2 * options["rounds"])
        assert all(e == share for e in frame["epsilon"][frame["label"].str.startswith("mwem round")])
        measure = [m for m in res.measurements if "round" in m.label]
        sens = 1.0  # marginal cells and whole marginals have sensitivity 1
        assert all(np.isclose(m.scale, sens / float(share)) for m in measure)  # Laplace scale 2T/eps


def test_zcdp_variant_ledger_and_gaussian_noise(small):
    res = mwem(small, all_marginals(small.domain, 2), rho="1/2", rounds=4, rng=make_random(3))
    assert res.accountant.spent.rho == Fraction(1, 2)
    assert sum(res.accountant.ledger_frame()["rho"]) == Fraction(1, 2)
    assert all(m.noise == "discrete_gaussian" for m in res.measurements)


def test_structural_zeros_and_invariants(small):
    dom = small.domain
    hist = small.histogram().copy()
    cs = ConstraintSet(dom, [StructuralZeros("a == 1 and b == 2", name="z")])
    zero = cs.zero_mask()
    hist[zero] = 0
    data = Dataset.from_histogram(hist, dom)
    inv_q = Marginal(dom, ["d"])
    cs.add(Invariant(inv_q, inv_q.answer(data), "d-margin"))
    res = mwem(data, all_marginals(dom, 2), 1, rounds=5, rng=make_random(4), constraints=cs, repeat_passes=3)
    assert np.all(res.x[zero] == 0) and np.all(res.x[~zero] > 0)
    np.testing.assert_allclose(inv_q.matvec(res.x), inv_q.answer(data), rtol=1e-9)
    np.testing.assert_allclose(res.x.sum(), data.total)


def test_range_and_parity_workloads(small):
    dom = Domain(("x",), (16,))
    data = Dataset.from_histogram(np.arange(16), dom)
    W = RangeQueries(dom, "x", [[0], [3], [8], [0]], [[7], [9], [15], [15]])
    res = mwem(data, W, 5, rounds=4, rng=make_random(6), repeat_passes=10)
    assert res.x.shape == (16,) and abs(res.x.sum() - data.total) < 1e-6
    pdom = Domain(("p", "q", "r"), (2, 2, 2))
    pdata = Dataset.from_histogram(np.array([5, 0, 1, 7, 2, 2, 0, 9]), pdom)
    res = mwem(pdata, FourierParity(pdom, [("p",), ("q",), ("p", "r")]), 3, rounds=3, rng=make_random(7))
    assert res.rounds == 3


def test_evaluator_matches_blockwise_answers(small):
    bdom = Domain(tuple("abcde"), (2,) * 5)
    x = np.random.default_rng(1).random(32)
    blocks = all_marginals(bdom, 2) + all_marginals(bdom, 3) + [Total(bdom)]
    ev = WorkloadEvaluator(bdom, blocks)
    np.testing.assert_allclose(ev.answers(x), np.concatenate([b.matvec(x) for b in blocks]))
    hist = np.random.default_rng(2).integers(0, 50, 32)
    assert np.array_equal(ev.answers(hist), np.concatenate([b.matvec(hist) for b in blocks]))
    ev = WorkloadEvaluator(small.domain, all_marginals(small.domain, 2))
    x = np.random.default_rng(1).random(small.domain.size)
    np.testing.assert_allclose(ev.answers(x), np.concatenate([b.matvec(x) for b in ev.blocks]))
    assert ev.locate(0) == (0, 0) and ev.locate(int(ev.offsets[2])) == (2, 0)


def test_marginal_index_and_selected_rows(small):
    dom = small.domain
    x = np.random.default_rng(4).random(dom.size)
    for attrs in (["a"], ["b", "d"], ["a", "b", "c", "d"]):
        mi, q = MarginalIndex(dom, attrs), Marginal(dom, attrs)
        np.testing.assert_allclose(mi.answers(x), q.matvec(x))
        v = np.arange(q.num_rows, dtype=float)
        np.testing.assert_allclose(mi.spread(v), q.rmatvec(v))
    sel = SelectedRows(Marginal(dom, ["b", "c"]), [1, 4])
    np.testing.assert_allclose(sel.to_dense(), Marginal(dom, ["b", "c"]).to_dense()[[1, 4]])
    assert sel.sensitivity(1) == 1.0 and np.array_equal(sel.answer(small), Marginal(dom, ["b", "c"]).answer(small)[[1, 4]])


def test_bad_inputs_raise_named_errors(small):
    W = all_marginals(small.domain, 2)
    with pytest.raises(PrivacyParameterError, match="exactly one of epsilon"):
        mwem(small, W)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        mwem(small, W, -1)
    with pytest.raises(ParameterError, match="rounds"):
        mwem(small, W, 1, rounds=0)
    with pytest.raises(ParameterError, match="select"):
        mwem(small, W, 1, select="cells")
    with pytest.raises(ParameterError, match="iterate"):
        mwem(small, W, 1, iterate="best")
    with pytest.raises(ParameterError, match="repeat_passes"):
        mwem(small, W, 1, repeat_passes=-2)
    with pytest.raises(PrivacyParameterError, match="init_share"):
        mwem(small, W, 1, init_share=1)
    with pytest.raises(QueryError, match="workload item 0"):
        mwem(small, [Marginal(Domain(("z",), (3,)), ["z"])], 1)
    with pytest.raises(QueryError, match="empty"):
        mwem(small, [], 1)


def test_merge_keeps_overlapping_rows_in_separate_terms():
    """Disjoint ranges share one merged term; a range overlapping them starts a new term
    (one merged step would shrink by the overlap), and the update then equals the paper's
    one-measurement-at-a-time order."""
    dom = Domain(("v",), (10,))
    ranges = RangeQueries(dom, "v", [0, 5, 3], [4, 9, 6])  # [0,4], [5,9] disjoint; [3,6] overlaps both
    merged = MWState(dom, 100.0, merge=True)
    plain = MWState(dom, 100.0, merge=False)
    for state in (merged, plain):
        state.add_measurement(ranges, np.array([0]), np.array([70.0]), key="r")
        state.add_measurement(ranges, np.array([1]), np.array([30.0]), key="r")
        state.add_measurement(ranges, np.array([2]), np.array([50.0]), key="r")
    assert len(merged.terms) == 2 and len(plain.terms) == 3
    assert merged.terms[0].rows[[0, 1]].all() and merged.terms[0].scale == 1.0
    assert merged.terms[1].rows[2] and not merged.terms[1].rows[[0, 1]].any()
    merged.passes(200)
    plain.passes(200)
    np.testing.assert_allclose(ranges.matvec(merged.x), ranges.matvec(plain.x), rtol=1e-3)



def test_info_reports_wall_and_cpu_seconds_of_each_phase(small):
    """``time_*`` are wall seconds and ``cpu_*`` the process's CPU seconds over the same spans (issue 30)."""
    import time

    W = all_marginals(small.domain, 2)
    cpu, wall = time.process_time(), time.perf_counter()
    res = mwem(small, W, 2, rounds=6, rng=make_random(11), repeat_passes=4)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    phases = ("data", "select", "measure", "update")
    for clock, spent in (("time", wall), ("cpu", cpu)):
        values = [res.info[f"{clock}_{phase}"] for phase in phases]
        assert all(v >= 0 for v in values) and sum(values) <= spent + 1e-6, clock
    assert res.info["cpu_update"] > 0  # six rounds of four passes take measurable CPU


def test_factored_info_reports_wall_and_cpu_seconds_of_each_phase():
    """factored MWEM's ``time_*`` (wall) have ``cpu_*`` beside them over the same spans, each bounded by
    the process's own measure of the run (issue 30)."""
    import time

    from dpopt.algorithms.mwem_factored import factored_mwem

    dom = Domain.from_dict({f"x{i}": 2 for i in range(8)})
    codes = np.random.default_rng(3).integers(0, 2, size=(400, 8))
    data = Dataset(codes, dom)
    cpu, wall = time.process_time(), time.perf_counter()
    res = factored_mwem(data, 2, 2, rounds=6, rng=make_random(11), repeat_passes=4)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    phases = ("data", "score", "mask", "select", "measure", "update")
    for clock, spent in (("time", wall), ("cpu", cpu)):
        values = [res.info[f"{clock}_{phase}"] for phase in phases]
        assert all(v >= 0 for v in values) and sum(values) <= spent + 1e-6, clock
        assert res.info[f"{clock}_logic"] == pytest.approx(sum(values[1:]), abs=1e-12), clock
    assert res.info["cpu_update"] > 0  # six rounds of four passes take measurable CPU


# ---- issue 30: the fast update matches the update it replaced, bit for bit ------------------------
def _run_with_state(state_cls, monkeypatch, *args, **kwargs):
    """``mwem`` with ``MWState`` replaced by ``state_cls`` for this one call."""
    import sys

    module = sys.modules["dpopt.algorithms.mwem"]
    with monkeypatch.context() as patch:
        patch.setattr(module, "MWState", state_cls)
        return mwem(*args, **kwargs)


def _same_bits(a, b) -> bool:
    return (a.x.tobytes() == b.x.tobytes() and a.average.tobytes() == b.average.tobytes()
            and a.selected == b.selected and a.info["passes"] == b.info["passes"]
            and all(p.values.tobytes() == q.values.tobytes() for p, q in zip(a.measurements, b.measurements)))


@pytest.fixture(scope="module")
def binary12():
    """12 binary attributes (4,096 cells): big enough for blocks of cells to move together."""
    dom = Domain(tuple(f"v{i:02d}" for i in range(12)), (2,) * 12)
    gen = np.random.default_rng(30)
    weights = gen.dirichlet(np.full(dom.size, 0.3))
    return Dataset.from_histogram(gen.multinomial(5000, weights), dom)


BIT_OPTIONS = [
    {"rounds": 12, "repeat_passes": 5, "boost": 32.0, "final_passes": 10},  # the benchmark's "optimised"
    {"rounds": 10, "repeat_passes": 20, "merge": False},  # the paper's reference loop, shorter
    {"rounds": 8},  # Fig. 1: one update per round
    {"rounds": 6, "select": "block", "repeat_passes": 3, "boost": 8.0},
    {"rounds": 6, "repeat_passes": 4, "tol": 1e-4, "iterate": "average"},
    {"rounds": 5, "init_share": "1/4", "repeat_passes": 2, "boost": 4.0},
    {"rho": "1/2", "rounds": 5, "repeat_passes": 3},
    {"rounds": 4, "adaptive": True, "repeat_passes": 2},
]


@pytest.mark.parametrize("options", BIT_OPTIONS)
def test_fast_update_matches_the_previous_update_bit_for_bit(binary12, monkeypatch, options):
    from tests.reference_mw_step import MWState as ReferenceState

    W = all_marginals(binary12.domain, 3) + all_marginals(binary12.domain, 1)
    epsilon = None if "rho" in options else 1
    old = _run_with_state(ReferenceState, monkeypatch, binary12, W, epsilon, rng=make_random(17), **options)
    new = mwem(binary12, W, epsilon, rng=make_random(17), **options)
    assert _same_bits(old, new)


def test_fast_update_bits_with_mixed_blocks_constraints_and_any_layout(small, monkeypatch):
    """A non-binary domain, ranges beside marginals, structural zeros and an invariant (C order
    after every update); and the marginal layouts with a cache too small to keep any move, or
    switched off: the same bits every time."""
    import dpopt.estimate.engines.mw_step as mw_step
    from tests.reference_mw_step import MWState as ReferenceState

    dom = small.domain
    W = all_marginals(dom, 2) + [RangeQueries(dom, ["b"], [[0], [1]], [[1], [2]]), Marginal(dom, dom.attrs)]
    options = dict(rounds=8, repeat_passes=4, boost=16.0, final_passes=5, rng=None)
    reference = _run_with_state(ReferenceState, monkeypatch, small, W, 2, **{**options, "rng": make_random(5)})
    assert _same_bits(reference, mwem(small, W, 2, **{**options, "rng": make_random(5)}))
    with monkeypatch.context() as patch:
        patch.setattr(mw_step, "LAYOUT_CACHE_BYTES", 1)
        assert _same_bits(reference, mwem(small, W, 2, **{**options, "rng": make_random(5)}))
    with monkeypatch.context() as patch:
        patch.setattr(mw_step, "LAYOUT_MAX_CELLS", 0)
        assert _same_bits(reference, mwem(small, W, 2, **{**options, "rng": make_random(5)}))
    cs = ConstraintSet(dom, [StructuralZeros("a == 1 and b == 2", name="z")])
    hist = small.histogram().copy()
    hist[cs.zero_mask()] = 0
    data = Dataset.from_histogram(hist, dom)
    cs.add(Invariant(Marginal(dom, ["d"]), Marginal(dom, ["d"]).answer(data), "d-margin"))
    options = dict(rounds=6, repeat_passes=3, boost=4.0, constraints=cs)
    reference = _run_with_state(ReferenceState, monkeypatch, data, W, 1, rng=make_random(6), **options)
    assert _same_bits(reference, mwem(data, W, 1, rng=make_random(6), **options))


def test_marginal_layout_is_the_stable_sort_by_marginal_cell(small):
    dom = small.domain
    for attrs in (["a"], ["b", "d"], ["a", "c", "d"], list(dom.attrs)):
        mi, q = MarginalIndex(dom, attrs), Marginal(dom, attrs)
        cell = np.argmax(q.to_dense(), axis=0)  # the marginal cell of every domain cell
        assert np.array_equal(mi.order, np.argsort(cell, kind="stable"))
        assert np.array_equal(mi.index, cell) and np.array_equal(mi.order[mi.position], np.arange(dom.size))


# ---- issue 28: MWEM over structured range workloads ------------------------------------------------
def test_kronecker_of_intervals_is_scored_as_its_boxes():
    from dpopt.algorithms.mwem import as_boxes
    from dpopt.model.queries import AllRanges, Identity, Kronecker, Prefix

    dom = Domain(("a", "b"), (5, 4))
    sub_a, sub_b = dom.project(["a"]), dom.project(["b"])
    for factors in ([AllRanges(sub_a, "a"), AllRanges(sub_b, "b")], [Prefix(sub_a, "a"), Identity(sub_b)],
                    [(np.ones((1, 5)), "a"), AllRanges(sub_b, "b")]):
        kron = Kronecker(factors, dom)
        box = as_boxes(kron)
        assert box is not None and box.num_rows == kron.num_rows
        np.testing.assert_array_equal(box.to_dense(), kron.to_dense())  # same rows, same order
    # not intervals: a gap in a row, a weight, a factor over two attributes
    assert as_boxes(Kronecker([(np.array([[1, 0, 1, 0, 0]]), "a"), AllRanges(sub_b, "b")], dom)) is None
    assert as_boxes(Kronecker([(2 * np.eye(5), "a"), AllRanges(sub_b, "b")], dom)) is None
    assert as_boxes(Kronecker([(np.eye(20), ("a", "b"))], dom)) is None


def test_every_box_of_a_grid_as_candidates(monkeypatch):
    """All boxes of a 12 x 10 grid (4,290 candidates) as a Kronecker product and as explicit
    boxes give the same run; with the measured boxes kept apart (compact terms) the updates are
    those of the previous state, bit for bit (no boost: the loss, summed over fewer rows, is
    not used)."""
    import dpopt.estimate.engines.mw_step as mw_step
    from dpopt.model.queries import AllRanges, Kronecker
    from tests.reference_mw_step import MWState as ReferenceState

    dom = Domain(("a", "b"), (12, 10))
    gen = np.random.default_rng(28)
    data = Dataset.from_histogram(gen.poisson(gen.gamma(0.5, 20, dom.size)), dom)
    kron = Kronecker([AllRanges(dom.project(["a"]), "a"), AllRanges(dom.project(["b"]), "b")], dom)
    lo_a, hi_a = np.triu_indices(12)
    lo_b, hi_b = np.triu_indices(10)
    ia, ib = np.indices((lo_a.size, lo_b.size)).reshape(2, -1)
    explicit = RangeQueries(dom, ["a", "b"], np.stack([lo_a[ia], lo_b[ib]], 1), np.stack([hi_a[ia], hi_b[ib]], 1))
    options = dict(rounds=8, repeat_passes=3, final_passes=4)
    first = mwem(data, kron, 1, rng=make_random(9), **options)
    assert _same_bits(first, mwem(data, explicit, 1, rng=make_random(9), **options))
    monkeypatch.setattr(mw_step, "COMPACT_ROWS", 100)
    compact = mwem(data, kron, 1, rng=make_random(9), **options)
    assert _same_bits(first, compact)
    assert _same_bits(first, _run_with_state(ReferenceState, monkeypatch, data, explicit, 1, rng=make_random(9),
                                             **options))
    # the fit improves on the uniform start over all 4,290 boxes
    truth = explicit.answer(data)
    uniform = explicit.matvec(np.full(dom.size, data.total / dom.size))
    assert np.abs(explicit.matvec(compact.x) - truth).mean() < 0.8 * np.abs(uniform - truth).mean()
