"""The smooth estimate in marginal space (issue 27): the dense smooth engine's estimate, exactly,
from message passing on a junction tree.

Independent references: the dense engine (``reconstruct(..., "smooth")``) on domains small
enough to hold the table, brute-force marginals and products ``C diag(x) Cᵀ v`` of the full
table for the junction tree, and the optimality conditions of the one-way prior's projection.
"""

from __future__ import annotations

import math
import time
from itertools import combinations

import numpy as np
import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.errors import DomainError, ParameterError, SpecError
from dpopt.estimate import reconstruct
from dpopt.estimate.marginal_space import estimate_marginals
from dpopt.estimate.marginal_space.graphical.junction_tree import JunctionTree, elimination_cliques
from dpopt.estimate.marginal_space.graphical.smooth import _one_way, attribute_priors, estimate_smooth
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total


def _measure(data, sets, sigmas, seed):
    gen = np.random.default_rng(seed)  # test noise, not privacy noise
    out = []
    for t, s in zip(sets, sigmas):
        q = Marginal(data.domain, t)
        y = np.asarray(data.marginal(t), float) + gen.normal(0.0, s, q.num_rows)
        out.append(Measurement(q, y, "gaussian", s, s**2, label=", ".join(t)))
    return out


@pytest.fixture(scope="module")
def case():
    """8 binary attributes, a chain of triples plus a pair that closes a cycle (not decomposable:
    the junction tree fills an edge), noise from well below to well above the counts."""
    data = random_sparse_network(8, seed=1).sample(1500, 2)
    names = data.domain.attrs
    sets = [tuple(names[i:i + 3]) for i in range(6)] + [(names[0], names[6])]
    ms = _measure(data, sets, [2.0, 5.0, 40.0, 9.0, 80.0, 3.0, 25.0], 0)
    return data, sets, ms


def _dense_marginals(domain, x, sets):
    return {tuple(s): Marginal(domain, s).matvec(x) for s in sets}


def _product_table(parts, total):
    p = np.full(1, total)
    for part in parts:  # C order over the attributes: the table's layout
        p = np.multiply.outer(p, part / total).ravel()
    return p


def _dense_like(est, ms, domain, **options):
    """The dense engine with the prior the marginal-space estimate used (its default included):
    the product table of :func:`attribute_priors`, or the engine's own uniform prior."""
    prior = None
    if est.info["prior"] != "uniform":
        axes = [tuple(sorted(domain.axes(m.query.attrs))) for m in ms]
        values = [np.asarray(m.values, float) for m in ms]
        variances = [float(m.variance) for m in ms]
        total = est.info["prior_total"]
        parts = attribute_priors(est.info["prior"], total, axes, values, variances, list(domain.sizes),
                                 est.info["lambda"], est.info["steps"])
        prior = _product_table([p for p, _ in parts], total)
    return reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "smooth", prior=prior, **options)


@pytest.mark.parametrize("steps,total", [(3, "auto"), (1, "auto"), (3, "free"), (2, "free")])
def test_equals_dense_smooth(case, steps, total):
    data, sets, ms = case
    est = estimate_marginals(ms, objective="smooth", total=total, smooth={"steps": steps}, exact_cells=0)
    assert est.status is Status.OPTIMAL, est.message
    dense = _dense_like(est, ms, data.domain, steps=steps, total="estimate" if total == "auto" else "free")
    assert dense.status is Status.OPTIMAL, dense.message
    assert est.info["lambda"] == pytest.approx(dense.info["lambda"], rel=1e-14)
    got = est.marginals(sets)
    for s, want in _dense_marginals(data.domain, dense.x, sets).items():
        np.testing.assert_allclose(got[s], want, rtol=1e-8, atol=1e-8 * dense.x.sum())
    # every subset read from the residuals is the dense table's too
    for s in [(data.domain.attrs[0],), tuple(data.domain.attrs[3:5])]:
        np.testing.assert_allclose(est.marginal(s), Marginal(data.domain, s).matvec(dense.x), rtol=1e-8)
    assert est.total == pytest.approx(dense.x.sum(), rel=1e-10)
    # the certificate's primal, from clique marginals alone, is the dense objective at its optimum
    cert = est.info["certificate"]
    assert cert["ok"] and abs(cert["gap"]) <= 1e-9
    assert cert["primal"] == pytest.approx(dense.fun, rel=1e-8)
    assert est.fun == pytest.approx(dense.info["chi2"], rel=1e-8)


def test_one_way_prior_equals_dense_with_that_prior(case):
    data, sets, ms = case
    est = estimate_smooth(ms, prior="one-way")
    assert est.success, est.message
    axes = [tuple(sorted(data.domain.axes(m.query.attrs))) for m in ms]
    values = [np.asarray(m.values, float) for m in ms]
    variances = [float(m.variance) for m in ms]
    sizes = list(data.domain.sizes)
    total = est.info["prior_total"]
    p = np.full(1, total)
    for a, n in enumerate(sizes):  # C order over the attributes: the table's layout
        p = np.multiply.outer(p, _one_way(a, n, total, axes, values, variances, sizes) / total).ravel()
    dense = reconstruct(ms, ConstraintSet(data.domain, [NonNegativity()]), "smooth", prior=p)
    assert dense.success
    for s, want in _dense_marginals(data.domain, dense.x, sets).items():
        np.testing.assert_allclose(est.marginals(sets)[s], want, rtol=1e-8, atol=1e-8 * dense.x.sum())


def test_one_way_estimate_is_the_projected_inverse_variance_average():
    rng = np.random.default_rng(3)
    sizes = [4, 3, 5]
    axes = [(0, 1), (0, 2), (0,)]
    values = [rng.normal(5, 20, 12), rng.normal(5, 20, 20), rng.normal(10, 20, 4)]
    variances = [4.0, 9.0, 1.0]
    total = 60.0
    m = _one_way(0, 4, total, axes, values, variances, sizes)
    # by hand: each set's sums onto attribute 0, with variance sigma² D_S / n_0 per cell
    parts = [values[0].reshape(4, 3).sum(1), values[1].reshape(4, 5).sum(1), values[2]]
    w = np.array([1 / (4.0 * 3), 1 / (9.0 * 5), 1 / 1.0])
    mean = sum(wi * pi for wi, pi in zip(w, parts)) / w.sum()
    floor = 1 / math.sqrt(w.sum())  # s_a: larger measured sets hold attribute 0
    assert m.sum() == pytest.approx(total) and (m >= floor - 1e-12).all()
    # KKT of min ||m - mean||² on {m >= floor, sum m = total}: m - mean = -tau off the floor,
    # and mean - floor <= -tau on it
    free = m > floor + 1e-12
    tau = float(np.mean(mean[free] - m[free]))
    np.testing.assert_allclose(m[free] - mean[free], -tau, atol=1e-10)
    assert (mean[~free] - floor <= tau + 1e-10).all()


def test_a_one_way_measured_alone_is_floored_at_one_sd_of_its_total_against_brute_force():
    # a skewed 8-value attribute, one-way marginals only (the pure-ε fallback's design), s.d.
    # 30 per cell: near-empty cells whose noisy counts fall below zero, so the floor binds. Brute
    # force over every set of cells left above the floor (each gives the one point of
    # {m >= f, sum m = N} that shifts those cells equally and holds the others at f; the
    # least-squares point is the best feasible one), with f = s_a / sqrt(n_a): the floors then hold
    # n_a f = sqrt(n_a) s_a at most, one s.d. of the one-way's total (module notes, *Priors*)
    v = np.array([610.0, 240, 95, -41, 12, -18, 3, -25])
    values, sizes, axes, variances, total = [v], [8], [(0,)], [900.0], 880.0
    m = _one_way(0, 8, total, axes, values, variances, sizes)
    floor = 30.0 / math.sqrt(8)
    best, best_cost = None, np.inf
    for mask in range(1, 2**8):
        free = np.array([(mask >> j) & 1 for j in range(8)], dtype=bool)
        tau = (v[free].sum() - (total - (~free).sum() * floor)) / free.sum()
        x = np.where(free, v - tau, floor)
        cost = float(np.sum((x - v) ** 2))
        if (x >= floor - 1e-12).all() and cost < best_cost:
            best, best_cost = x, cost
    np.testing.assert_allclose(m, best, rtol=0, atol=1e-9)
    at_floor = np.isclose(m, floor, rtol=0, atol=1e-9)
    assert at_floor.sum() >= 3 and m[at_floor].sum() <= math.sqrt(8) * 30.0 + 1e-9


def test_the_floor_is_one_sd_per_cell_when_a_larger_set_is_measured():
    # the same one-way answers, now with a pair on (0, 1) as well (very noisy: the average barely
    # moves): the steps may lift a cell the pair shows, so each cell keeps one s.d.; and an
    # attribute that no larger set holds keeps it too once any larger set is measured (module notes)
    v = np.array([610.0, 240, 95, -41, 12, -18, 3, -25])
    pair = np.repeat(v / 2, 2)  # sums onto attribute 0 give v
    sizes, total = [8, 2], 880.0
    alone = _one_way(0, 8, total, [(0,)], [v], [900.0], sizes)
    held = _one_way(0, 8, total, [(0,), (0, 1)], [v, pair], [900.0, 1e8], sizes)
    sd_held = 1 / math.sqrt(1 / 900.0 + 1 / (1e8 * 2))
    assert alone.min() == pytest.approx(30.0 / math.sqrt(8), rel=1e-12)
    assert held.min() == pytest.approx(sd_held, rel=1e-12)
    assert alone.sum() == pytest.approx(total) and held.sum() == pytest.approx(total)
    beside = _one_way(0, 8, total, [(0,), (1, 2)], [v, np.full(4, 220.0)], [900.0, 1.0], [8, 2, 2])
    assert beside.min() == pytest.approx(30.0, rel=1e-12)


def test_one_way_measurements_only_equal_dense_with_the_lower_floor():
    # the fallback's design on a small skewed domain (6, 5 and 2 values, 2,000 records): one-way
    # marginals only, noise s.d. 60 per cell, so near-empty cells fall below zero; the estimate is
    # the dense engine's with the product prior of attribute_priors, whose factors sit at
    # s_a / sqrt(n_a) on the cells the projection empties
    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain

    gen = np.random.default_rng(5)  # test data and noise, not privacy noise
    domain = Domain(("a", "b", "c"), (6, 5, 2))
    codes = np.stack([gen.choice(6, 2000, p=[0.6, 0.3, 0.07, 0.02, 0.007, 0.003]),
                      gen.choice(5, 2000, p=[0.5, 0.45, 0.04, 0.008, 0.002]), gen.choice(2, 2000, p=[0.7, 0.3])], 1)
    data = Dataset(codes, domain)
    ms = _measure(data, [("a",), ("b",), ("c",)], [60.0, 60.0, 60.0], 4)
    est = estimate_smooth(ms)
    assert est.success, est.message
    axes, values, variances = [(0,), (1,), (2,)], [np.asarray(m.values, float) for m in ms], [3600.0] * 3
    total = est.info["prior_total"]
    parts = attribute_priors("per-attribute", total, axes, values, variances, [6, 5, 2], est.info["lambda"], 3)
    assert [b for _, b in parts] == est.info["prior_weights"] and parts[0][1] == 1.0
    assert parts[0][0].min() == pytest.approx(60.0 / math.sqrt(6), rel=1e-12)  # the floor binds on "a"
    dense = reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "smooth",
                        prior=_product_table([p for p, _ in parts], total))
    assert dense.success
    for t, want in _dense_marginals(domain, dense.x, [("a",), ("b",), ("c",)]).items():
        np.testing.assert_allclose(est.marginals([t])[t], want, rtol=1e-8, atol=1e-8 * dense.x.sum())


@pytest.mark.parametrize("steps", [3, 1])
def test_per_attribute_prior_against_its_closed_form(steps):
    # attribute 0: skewed, a near-empty cell (16) below λ s_a² (2^{1/K} − 1) (136 at K = 3): its
    # one-way; attribute 1: every cell above it (929 against 207 / 796): uniform; attribute 2:
    # its smallest cell (473) just below the bound at K = 3 (507): its one-way; attribute 3: in no
    # measured set: uniform
    sizes = [4, 3, 5, 2]
    axes = [(0, 1), (0, 2), (1,), (2,)]
    values = [np.array([900.0, 880, 910, 150, 160, 140, 20, 30, 10, 5, -8, 3]),
              np.array([400.0, 700, 500, 600, 520, 100, 90, 110, 95, 85, 10, 20, 5, 15, 10, 0, 3, -4, 5, 2]),
              np.array([1100.0, 1210, 1040]), np.array([660.0, 700, 640, 690, 610])]
    variances = [100.0, 400.0, 9e4, 2500.0]
    total, lam = 2800.0, 2.0
    got = attribute_priors("per-attribute", total, axes, values, variances, sizes, lam, steps)
    # by hand: each set's sums onto the attribute have variance σ² D_S / n_a per one-way cell
    precision = {0: 1 / (100.0 * 3) + 1 / (400.0 * 5), 1: 1 / (100.0 * 4) + 1 / 9e4, 2: 1 / (400.0 * 4) + 1 / 2500.0}
    chosen = []
    for a, w in precision.items():
        m = _one_way(a, sizes[a], total, axes, values, variances, sizes)
        kept = (lam / w / (m + lam / w)) ** steps  # κ_j^K, equation (7), s_a² = 1/w
        one_way = bool((kept > 0.5).any())
        np.testing.assert_allclose(got[a][0], m if one_way else np.full(sizes[a], total / sizes[a]), rtol=1e-12)
        assert got[a][1] == (1.0 if one_way else 0.0)
        chosen.append(one_way)
    assert chosen == [True, False, True]
    np.testing.assert_array_equal(got[3][0], np.full(2, total / 2))
    assert got[3][1] == 0.0
    for p, _ in got:  # every factor positive, with the prior's total
        assert (p > 0).all() and p.sum() == pytest.approx(total, rel=1e-12)
    # the other priors: every factor uniform, or every measured attribute's its one-way
    for other, ends in (("uniform", [0, 0, 0, 0]), ("one-way", [1, 1, 1, 0])):
        assert [b for _, b in attribute_priors(other, total, axes, values, variances, sizes, lam, steps)] == ends


@pytest.mark.parametrize("steps", [3, 1])
def test_per_attribute_prior_equals_dense_with_that_prior(case, steps):
    # five triples of the case, and x7 alone by a one-way at σ = 200: λ s_7² is far above its
    # counts, so x7 takes its one-way while the well-measured attributes stay uniform
    data, sets, ms = case
    x7 = data.domain.attrs[7]
    ms, sets = ms[:5] + _measure(data, [(x7,)], [200.0], 9), sets[:5] + [(x7,)]
    prior = "per-attribute"
    est = estimate_smooth(ms, prior=prior, steps=steps)
    assert est.info["prior_weights"][7] == 1.0 and sum(est.info["prior_weights"]) < len(data.domain) - 2
    assert est.success, est.message
    axes = [tuple(sorted(data.domain.axes(m.query.attrs))) for m in ms]
    values = [np.asarray(m.values, float) for m in ms]
    variances = [float(m.variance) for m in ms]
    total = est.info["prior_total"]
    parts = attribute_priors(prior, total, axes, values, variances, list(data.domain.sizes), est.info["lambda"], steps)
    assert [b for _, b in parts] == est.info["prior_weights"]
    dense = reconstruct(ms, ConstraintSet(data.domain, [NonNegativity()]), "smooth", steps=steps,
                        prior=_product_table([p for p, _ in parts], total))
    assert dense.success and dense.info["lambda"] == pytest.approx(est.info["lambda"], rel=1e-14)
    for s, want in _dense_marginals(data.domain, dense.x, sets).items():
        np.testing.assert_allclose(est.marginals(sets)[s], want, rtol=1e-8, atol=1e-8 * dense.x.sum())
    assert est.info["certificate"]["primal"] == pytest.approx(dense.fun, rel=1e-8)


def test_the_prior_rule_reads_the_noisy_answers_only(case, monkeypatch):
    # The rule is post-processing: with every way of reading records disabled, measurements
    # rebuilt from the queries, noise and answers alone give the same prior and estimate; moving
    # noisy answers moves the prior.
    from dpopt.model.data import Dataset

    data, sets, ms = case
    before = estimate_smooth(ms, prior="per-attribute")
    for name in ("marginal", "histogram", "binary_marginal_counts", "marginal_frame", "to_frame", "_bincount"):
        monkeypatch.setattr(Dataset, name, lambda *a, **k: pytest.fail("the prior read the data"))
    rebuilt = [Measurement(m.query, np.array(m.values, dtype=float), m.noise, m.scale, m.variance,
                           label=m.label) for m in ms]
    again = estimate_smooth(rebuilt, prior="per-attribute")
    assert again.info["prior_weights"] == before.info["prior_weights"]
    for s, m in before.marginals(sets).items():
        np.testing.assert_array_equal(again.marginals(sets)[s], m)
    # x7 measured alone at σ = 30 (besides five triples): an even split is resolved (uniform
    # factor), a near-empty cell is not (its one-way): the answers decide, through m_7
    x7 = data.domain.attrs[7]
    one_way = Marginal(data.domain, (x7,))
    weights = []
    for y in ([750.0, 750.0], [1499.0, 1.0]):
        extra = Measurement(one_way, np.array(y), "gaussian", 30.0, 900.0, label=x7)
        est = estimate_smooth(rebuilt[:5] + [extra], prior="per-attribute")
        weights.append(est.info["prior_weights"][7])
        bound = 900.0 * est.info["lambda"] * (2 ** (1 / 3) - 1)  # λ s_7² (2^{1/K} − 1): s_7 = 30
        assert 30.0 < bound < 700.0  # between the floor s_7 and the even split's cells
    assert weights == [0.0, 1.0]


def _full_log_table(tree, factors):
    """``Σ_c factors[c]`` over the full domain (each clique's array broadcast to every attribute)."""
    full = np.zeros(tree.sizes)
    for c, f in zip(tree.cliques, factors):
        full = full + f.reshape([n if a in c else 1 for a, n in enumerate(tree.sizes)])
    return full


def _brute_tree_check(sizes, sets, seed):
    """Junction-tree marginals and forward-mode products against the full table."""
    rng = np.random.default_rng(seed)
    tree = JunctionTree(sizes, sets, 10**6)
    for s in sets:
        tree.holder(s)  # every set is in a clique
    factors = [rng.normal(0, 1, shape) for shape in tree.shapes]
    x = np.exp(_full_log_table(tree, factors))
    mu, mu_sep, log_z = tree.calibrate(factors)
    assert log_z == pytest.approx(math.log(x.sum()), rel=1e-12)
    for c, m in zip(tree.cliques, mu):
        other = tuple(a for a in range(len(sizes)) if a not in c)
        np.testing.assert_allclose(m, x.sum(axis=other), rtol=1e-11)
    g = [rng.normal(0, 1, shape) for shape in tree.shapes]
    full_g = _full_log_table(tree, g)
    weighted = tree.tangent(mu, mu_sep, g)
    for c, w in zip(tree.cliques, weighted):
        other = tuple(a for a in range(len(sizes)) if a not in c)
        np.testing.assert_allclose(w, (x * full_g).sum(axis=other), rtol=1e-9, atol=1e-12 * x.sum())
    return tree


def test_junction_tree_against_the_full_table():
    # a 4-cycle of pairs (filled to two triangles), a triple, a separate component and a loose attribute
    sizes = [2, 3, 2, 4, 3, 2, 2, 3]
    sets = [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4, 5), (6,), (7, 6)]
    tree = _brute_tree_check(sizes, sets, 0)
    assert max(len(c) for c in tree.cliques) == 3
    _brute_tree_check([3, 2, 2, 3, 2], [(0, 1, 2), (2, 3), (3, 4), (0, 4)], 1)


@pytest.mark.parametrize("every_root", [False, True])
def test_out_of_clique_marginals_against_the_full_table(monkeypatch, every_root):
    # every pair, triple and four-set of a tree with a filled cycle, attributes held by several
    # cliques, a separate component (an empty separator) and a long branch, read by elimination
    # over the smallest subtree (from the default root, or the best of every root), against the
    # full table; with messages shared between sets and without
    from dpopt.estimate.marginal_space.graphical import junction_tree

    if every_root:
        monkeypatch.setattr(junction_tree, "SMALL_READ", 0)
    sizes = [2, 3, 2, 4, 3, 2, 2, 3, 5, 2]
    sets = [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4, 5), (6,), (7, 6), (5, 8), (8, 9)]
    tree = JunctionTree(sizes, sets, 10**6)
    rng = np.random.default_rng(3)
    factors = [rng.normal(0, 2, shape) for shape in tree.shapes]
    x = np.exp(_full_log_table(tree, factors))
    mu, _, _ = tree.calibrate(factors)
    wanted = [s for k in (2, 3, 4) for s in combinations(range(len(sizes)), k)]
    outside = [s for s in wanted if not any(set(s) <= set(c) for c in tree.cliques)]
    assert len(outside) > 300
    shared = tree.set_marginals(mu, tree.read_plans(outside))
    alone = tree.set_marginals(mu, outside, cache_cells=0)
    for s in wanted:
        want = x.sum(axis=tuple(a for a in range(len(sizes)) if a not in s))
        got = shared[s] if s in shared else tree.set_marginals(mu, [s])[s]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13 * x.sum())
        if s in alone:
            np.testing.assert_allclose(alone[s], want, rtol=1e-10, atol=1e-13 * x.sum())


def test_out_of_clique_marginals_with_zero_separator_cells():
    # whole slices whose cells underflow to exactly 0 (separator cells 0 too): the messages there
    # are 0, not NaN, and every pair and triple still equals the full table's
    sizes = [2, 3, 2, 4, 3, 2]
    tree = JunctionTree(sizes, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], 10**6)
    factors = [np.random.default_rng(1).normal(0, 1, s) for s in tree.shapes]
    for f in factors[:3]:
        f[0] = -1e3
    mu, mu_sep, _ = tree.calibrate(factors)
    assert any((m == 0).any() for m in mu_sep[1:])
    x = np.exp(_full_log_table(tree, factors))
    sets = [s for k in (2, 3) for s in combinations(range(6), k) if not any(set(s) <= set(c) for c in tree.cliques)]
    got = tree.set_marginals(mu, sets)
    for s in sets:
        np.testing.assert_allclose(got[s], x.sum(axis=tuple(a for a in range(6) if a not in s)), rtol=1e-10,
                                   atol=1e-13 * x.sum())


def test_out_of_clique_read_limit_and_deadline():
    # a chain of pairs over ten attributes of 10 values: the tree holds 900 cells, the triple at
    # its ends needs 1,000; refused before the solve, naming the set; a passed deadline reads nothing
    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain

    domain = Domain.from_dict({f"a{i}": 10 for i in range(10)})
    data = Dataset(np.random.default_rng(0).integers(0, 10, (2000, 10)), domain)
    pairs = [(f"a{i}", f"a{i + 1}") for i in range(9)]
    ms = _measure(data, pairs, [5.0] * 9, 2)
    with pytest.raises(DomainError, match=r"^reading the marginal on \(a0, a5, a9\) off the junction tree needs an "
                                          r"array of 1,000 cells, above max_cells = 900$"):
        estimate_smooth(ms, pairs + [("a0", "a5", "a9")], max_cells=900, time_limit=1e-9)  # before the solve
    est = estimate_smooth(ms, pairs + [("a0", "a5", "a9")], max_cells=1000)
    assert est.success and est.info["read"]["largest_array_cells"] == 1000
    tree = JunctionTree([10] * 10, [(i, i + 1) for i in range(9)], 1000)
    mu, _, _ = tree.calibrate([np.zeros(s) for s in tree.shapes])
    assert tree.set_marginals(mu, [(0, 5, 9)], deadline=time.perf_counter() - 1) is None


def test_the_plan_sees_the_largest_read(monkeypatch):
    # the read's largest array from public quantities: auto's rule takes least squares when it is
    # above MAX_CLIQUE_CELLS, naming the set, and with room it takes smooth as before
    from dpopt.estimate.marginal_space import estimator
    from dpopt.estimate.marginal_space.graphical.smooth import read_cells
    from dpopt.model.domain import Domain

    domain = Domain.from_dict({f"a{i}": 10 for i in range(10)})
    pairs = [(f"a{i}", f"a{i + 1}") for i in range(9)]
    axes = [(i, i + 1) for i in range(9)]
    assert read_cells(domain.sizes, axes, axes + [(0, 5, 9)]) == (1000, (0, 5, 9))
    assert read_cells(domain.sizes, axes, axes) == (0, ())
    assert read_cells(domain.sizes, axes, axes + [(0, 5, 9)], 10**5) == (10**5, ())  # the bound: 100 x 1,000
    assert estimator.choose_objective(domain, pairs, pairs + [("a0", "a5", "a9")]).objective == "smooth"
    monkeypatch.setattr(estimator, "MAX_CLIQUE_CELLS", 999)
    choice = estimator.choose_objective(domain, pairs, pairs + [("a0", "a5", "a9")])
    assert choice.objective == "l2" and "(a0, a5, a9)" in choice.reason and "1,000 cells" in choice.reason


def test_asked_smooth_with_a_read_too_large_is_refused_in_the_plan(monkeypatch):
    # the spec face: the same check refuses an asked-for 'smooth' before any budget is spent,
    # naming the key and the set (the read's size stood in for: binary sets cannot reach the limit)
    from dpopt.estimate.marginal_space.graphical import smooth
    from dpopt.release import plan

    net = random_sparse_network(24, seed=4)
    names = net.domain.attrs
    spec = {"name": "read-limit", "algorithm": "marginal_space",
            "domain": {"attributes": {a: 2 for a in names}}, "data": {"source": "file"},
            "privacy": {"accounting": "zcdp", "rho": 0.5},
            "measure": [{"query": "marginal", "attrs": [names[i], names[i + 1]], "mechanism": "gaussian",
                         "share": "1/23"} for i in range(23)],
            "marginal_space": {"records": False, "objective": "smooth",
                               "workload": [[names[0], names[6], names[23]]]},
            "output": {"formats": ["csv"], "plots": False}}
    data = net.sample(300, 5)
    assert "smooth: asked for" in plan(spec, data=data).describe()
    real = smooth.read_cells
    monkeypatch.setattr(smooth, "read_cells", lambda sizes, measured, work, limit=None: (2**40, real(sizes, measured,
                                                                                                 work)[1]))
    with pytest.raises(SpecError, match=r"marginal_space\.objective.*\(x000, x006, x023\) off its junction tree"
                                        r" with an array of 1,099,511,627,776 cells") as err:
        plan(spec, data=data)
    assert "\n" not in str(err.value)


def test_elimination_keeps_a_chordal_graph():
    # a chain of triples is chordal: its cliques are the triples themselves
    sets = [(i, i + 1, i + 2) for i in range(10)]
    assert sorted(elimination_cliques([2] * 12, sets)) == sorted(sets)


def test_wide_chain_without_the_table():
    # 40 binary attributes (10^12 cells): chain pairs, certified, total held at the measured N̂
    data = random_sparse_network(40, seed=2).sample(3000, 4)
    names = data.domain.attrs
    sets = [(names[i], names[i + 1]) for i in range(39)]
    ms = _measure(data, sets, [30.0] * 39, 5)
    est = estimate_marginals(ms, objective="smooth")
    assert est.success, est.message
    assert est.info["largest_clique_cells"] == 4 and est.info["cliques"] == 39
    n_hat = np.mean([m.values.sum() for m in ms])  # equal variances and sizes: the plain mean
    assert est.total == pytest.approx(n_hat, rel=1e-9)
    marg = est.marginals(sets)
    for (a, b), (b2, c) in zip(sets, sets[1:]):  # consistent on shared attributes, positive
        np.testing.assert_allclose(marg[(a, b)].reshape(2, 2).sum(0), marg[(b2, c)].reshape(2, 2).sum(1), rtol=1e-9)
    assert min(m.min() for m in marg.values()) > 0


def test_clique_limit_names_the_largest_clique():
    data = random_sparse_network(12, seed=1).sample(500, 2)
    names = data.domain.attrs
    sets = list(combinations(names, 2))  # all pairs measured: one clique of 2^12 cells
    ms = _measure(data, sets, [5.0] * len(sets), 1)
    with pytest.raises(DomainError, match=r"largest clique: .* with 4,096 cells"):
        estimate_marginals(ms, sets, objective="smooth", max_cells=1000, exact_cells=0)


def test_refusals(case):
    data, sets, ms = case
    exact = Measurement.exact(Marginal(data.domain, sets[0]), data.marginal(sets[0]).astype(float), "exact")
    with pytest.raises(ParameterError, match="exact"):
        estimate_smooth(ms + [exact])
    inv = Invariant(Total(data.domain), np.array([1500.0]), name="n")
    with pytest.raises(ParameterError, match="invariants"):
        estimate_smooth(ms, constraints=ConstraintSet(data.domain, [NonNegativity(), inv]))
    with pytest.raises(ParameterError, match="invariants"):
        estimate_marginals(ms, objective="smooth", total=1500)
    with pytest.raises(ParameterError, match="shrink"):
        estimate_marginals(ms, objective="smooth", shrink=True)
    with pytest.raises(ParameterError, match="prior"):
        estimate_smooth(ms, prior="flat")
    with pytest.raises(ParameterError, match="objective"):
        estimate_marginals(ms, objective="entropy")


@pytest.mark.parametrize("measured", [6, 5])
def test_unmeasured_workload_sets_off_the_tree(case, measured):
    # sets no clique holds (pairs and a triple across the chain) are read off the tree: still the
    # dense estimate's marginals; with 5 triples measured, x7 is in no measured set (it was
    # in no clique then, and reading it failed)
    data, sets, ms = case
    names = data.domain.attrs
    extra = [(names[1], names[5]), (names[0], names[4], names[7]), (names[2], names[6]), (names[7],)]
    est = estimate_marginals(ms[:measured], sets[:measured] + extra, objective="smooth", exact_cells=0)
    assert est.success, est.message
    dense = _dense_like(est, ms[:measured], data.domain)
    got = est.marginals(extra + [(names[0], names[4])])
    for s, want in _dense_marginals(data.domain, dense.x, extra + [(names[0], names[4])]).items():
        np.testing.assert_allclose(got[s], want, rtol=1e-8, atol=1e-8 * dense.x.sum())


@pytest.mark.parametrize("prior", ["uniform", "one-way", "per-attribute"])
def test_small_domains_are_solved_as_a_table_with_the_same_estimate(case, prior):
    data, sets, ms = case
    table = estimate_marginals(ms, objective="smooth", smooth={"prior": prior})
    tree = estimate_marginals(ms, objective="smooth", smooth={"prior": prior}, exact_cells=0)
    assert table.info["polytope"] == "table" and tree.info["polytope"] == "junction tree"
    assert table.success and tree.success and table.table is not None
    for s, m in tree.marginals(sets).items():
        np.testing.assert_allclose(table.marginals(sets)[s], m, rtol=1e-8, atol=1e-8 * tree.total)


def test_records_follow_the_smooth_estimate():
    # records drawn from the smooth estimate of a 30-attribute chain keep its pair marginals to
    # within the controlled rounding of sampling.py (a couple of records per cell)
    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import make_random

    data = random_sparse_network(30, seed=2).sample(20000, 4)
    names = data.domain.attrs
    sets = [(names[i], names[i + 1]) for i in range(29)]
    est = estimate_marginals(_measure(data, sets, [30.0] * 29, 1), objective="smooth")
    assert est.success
    codes = est.records(rng=make_random(5))
    assert abs(len(codes) - est.total) <= 1
    records, marg = Dataset(codes, data.domain), est.marginals(sets)
    assert max(np.abs(records.marginal(s) - marg[s]).max() for s in sets) <= 2.0


def test_time_limit_releases_nothing(case):
    data, sets, ms = case
    est = estimate_smooth(ms, time_limit=1e-9)
    assert est.status is Status.TIME_LIMIT and not est.success and est.incumbent


def test_near_exact_noise_certifies_and_equals_dense():
    # sigma = 0.1 on counts of 10^4: the Newton residual cannot fall below the marginal sums'
    # rounding, so residuals at rounding level count as converged (this ran to ITERATION_LIMIT)
    data = random_sparse_network(12, seed=3).sample(50_000, 103)
    names = data.domain.attrs
    sets = [tuple(names[i:i + 3]) for i in range(10)]
    ms = _measure(data, sets, [0.1] * 10, 2)
    est = estimate_marginals(ms, objective="smooth", exact_cells=0)
    assert est.status is Status.OPTIMAL, est.message
    dense = _dense_like(est, ms, data.domain)
    for s, want in _dense_marginals(data.domain, dense.x, sets).items():
        np.testing.assert_allclose(est.marginals(sets)[s], want, rtol=1e-7, atol=1e-7 * dense.x.sum())


# ---- rule (9): the per-attribute prior's risk rule with one-way marginals only ----------------------
def _skewed_one_way_case(seed=5, sigma=60.0):
    """One-way marginals only (the pure-ε fallback's design) on a small skewed domain."""
    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain

    gen = np.random.default_rng(seed)  # test data and noise, not privacy noise
    domain = Domain(("a", "b", "c"), (6, 5, 2))
    codes = np.stack([gen.choice(6, 2000, p=[0.6, 0.3, 0.07, 0.02, 0.007, 0.003]),
                      gen.choice(5, 2000, p=[0.5, 0.45, 0.04, 0.008, 0.002]), gen.choice(2, 2000, p=[0.7, 0.3])], 1)
    data = Dataset(codes, domain)
    return data, _measure(data, [("a",), ("b",), ("c",)], [sigma] * 3, 4)


@pytest.mark.parametrize("steps", [3, 1])
def test_one_way_fit_per_attribute_equals_the_estimate(steps):
    # with one-way marginals only the estimate is a product whose factor on each attribute is
    # that attribute's own K proximal steps from its prior factor (prior_risk notes)
    from dpopt.estimate.marginal_space.graphical.prior_risk import proximal_fit

    data, ms = _skewed_one_way_case()
    sizes = list(data.domain.sizes)
    for prior in ("uniform", "one-way"):
        est = estimate_smooth(ms, prior=prior, steps=steps)
        assert est.success, est.message
        total, lam = est.info["prior_total"], est.info["lambda"]
        for a, name in enumerate(data.domain.attrs):
            y = np.asarray(ms[a].values, float)
            start = (np.full(sizes[a], total / sizes[a]) if prior == "uniform" else
                     _one_way(a, sizes[a], total, [(0,), (1,), (2,)], [np.asarray(m.values, float) for m in ms],
                              [3600.0] * 3, sizes))
            fit, _ = proximal_fit(y, 3600.0, lam, steps, total, start)
            np.testing.assert_allclose(est.marginals([(name,)])[(name,)], fit, rtol=1e-8, atol=1e-8 * total)


def _one_way_prior_of(y, s2, total):
    """``m_a`` of a one-way measured alone (smooth._one_way, floor s/√n)."""
    return _one_way(0, y.size, total, [(0,)], [y], [s2], [y.size])


def _fit_of_y(y, s2, lam, steps, total, prior):
    from dpopt.estimate.marginal_space.graphical.prior_risk import proximal_fit

    start = np.full(y.size, total / y.size) if prior == "uniform" else _one_way_prior_of(y, s2, total)
    return proximal_fit(y, s2, lam, steps, total, start)[0]


def _brute_force_risk_difference(y, s2, lam, steps, total, h=1e-3):
    """``SURE_u − SURE_o`` and its delta-method s.d. with every derivative by central differences."""
    fits, divergence, grads = {}, {}, {}
    for prior in ("uniform", "one-way"):
        f = _fit_of_y(y, s2, lam, steps, total, prior)
        jac = np.empty((y.size, y.size))
        for j in range(y.size):
            e = np.zeros(y.size)
            e[j] = h
            jac[:, j] = (_fit_of_y(y + e, s2, lam, steps, total, prior) - _fit_of_y(y - e, s2, lam, steps, total, prior)) / (2 * h)
        fits[prior], divergence[prior] = f, np.trace(jac)
        grads[prior] = 2 * jac.T @ (f - y) - 2 * (f - y)
    sure = {p: np.sum((fits[p] - y) ** 2) - y.size * s2 + 2 * s2 * divergence[p] for p in fits}
    return sure["uniform"] - sure["one-way"], math.sqrt(s2) * np.linalg.norm(grads["uniform"] - grads["one-way"])


def test_proximal_fit_jacobian_against_central_differences():
    from dpopt.estimate.marginal_space.graphical.prior_risk import proximal_fit

    y, s2, lam, total = np.array([4100.0, -60, 900, 30, 2600, 380, 1]), 200.0**2, 0.05, 8000.0
    for prior in ("uniform", "one-way"):
        start = np.full(7, total / 7) if prior == "uniform" else _one_way_prior_of(y, s2, total)
        free = (start > 200.0 / math.sqrt(7) * (1 + 1e-12)).astype(float)
        jac0 = None if prior == "uniform" else (free, -free[:, None] / free.sum(), free[:, None])
        assert prior == "uniform" or 0 < free.sum() < 7  # the floor binds on some cells
        _, (d, U, V) = proximal_fit(y, s2, lam, 3, total, start, jac0)
        want = np.empty((7, 7))
        for j in range(7):
            e = np.zeros(7)
            e[j] = 1e-3
            want[:, j] = (_fit_of_y(y + e, s2, lam, 3, total, prior) - _fit_of_y(y - e, s2, lam, 3, total, prior)) / 2e-3
        np.testing.assert_allclose(np.diag(d) + U @ V.T, want, atol=1e-6)


def test_stein_risk_is_unbiased_for_the_uniform_factor_by_simulation():
    # Stein's identity for the uniform prior's fit under Gaussian noise: the mean of SURE over
    # draws equals the mean squared error, within 4 standard errors of the difference
    from dpopt.estimate.marginal_space.graphical.prior_risk import proximal_fit, stein_risk

    x, s2, lam, total = np.array([3000.0, 1200, 500, 250, 50]), 150.0**2, 0.05, 5000.0
    gen = np.random.default_rng(11)  # test noise, not privacy noise
    diffs = []
    for _ in range(600):
        y = x + gen.normal(0.0, 150.0, 5)
        fit, jac = proximal_fit(y, s2, lam, 3, total, np.full(5, total / 5))
        diffs.append(stein_risk(fit, jac, y, s2) - np.sum((fit - x) ** 2))
    diffs = np.array(diffs)
    assert abs(diffs.mean()) < 4 * diffs.std(ddof=1) / math.sqrt(diffs.size)


def _rule_case(lam):
    """Three attributes measured alone: a binary one far from an even split (adult's sex at pure
    ε 0.1: 16,100 / 32,500, s = 790), a near-uniform five-valued one, a skewed three-valued one."""
    sizes = [2, 5, 3]
    axes = [(0,), (1,), (2,)]
    values = [np.array([16100.0, 32500.0]), np.array([9700.0, 9900, 9600, 10100, 9000]),
              np.array([30000.0, 12000, 6800])]
    variances = [790.0**2, 700.0**2, 790.0**2]
    total = 48600.0
    return sizes, axes, values, variances, total, lam, attribute_priors("per-attribute", total, axes, values,
                                                                         variances, sizes, lam, 3)


def test_risk_rule_takes_the_one_way_where_rule_8_keeps_uniform_against_brute_force():
    # the binary attribute at λ = 0.02: every cell resolved, so rule (8) keeps the uniform
    # factor, but its bias (the cells sit 8,000 from N̂/2) makes its Stein risk exceed the
    # one-way's by more than one s.d.: rule (9) takes the one-way
    sizes, axes, values, variances, total, lam, got = _rule_case(0.02)
    s2 = variances[0]
    m = _one_way(0, 2, total, axes, values, variances, sizes)
    assert not float(m.min()) < lam * s2 * (2 ** (1 / 3) - 1)  # equation (8): uniform
    excess, sd = _brute_force_risk_difference(values[0], s2, lam, 3, total)
    assert excess > sd > 0
    assert got[0][1] == 1.0
    np.testing.assert_allclose(got[0][0], m, rtol=1e-12)


def test_risk_rule_never_removes_the_one_way_rule_8_takes():
    # the near-uniform five-valued attribute at λ = 0.10: rule (8) finds an unresolved cell and
    # takes the one-way; the risk estimate (squared error) prefers the uniform factor decisively,
    # but it weighs mass spread thinly over near-empty cells less than the L1 error does, which
    # is what rule (8) guards against: the one-way stays
    sizes, axes, values, variances, total, lam, got = _rule_case(0.10)
    s2 = variances[1]
    m = _one_way(1, 5, total, axes, values, variances, sizes)
    assert float(m.min()) < lam * s2 * (2 ** (1 / 3) - 1)  # equation (8): one-way
    excess, sd = _brute_force_risk_difference(values[1], s2, lam, 3, total)
    assert excess < -sd
    assert got[1][1] == 1.0


def test_risk_rule_keeps_rule_8_where_the_excess_is_within_its_sd():
    from dpopt.estimate.marginal_space.graphical.prior_risk import risk_difference

    sizes, axes, values, variances, total, lam, got = _rule_case(0.01)
    for a in range(3):
        n, s2 = sizes[a], variances[a]
        m = _one_way(a, n, total, axes, values, variances, sizes)
        rule8 = float(m.min()) < lam * s2 * (2 ** (1 / 3) - 1)
        excess, sd = risk_difference(values[a], s2, lam, 3, total, m, math.sqrt(s2 / n))
        want_excess, want_sd = _brute_force_risk_difference(values[a], s2, lam, 3, total)
        assert excess == pytest.approx(want_excess, rel=1e-5, abs=1e-4 * s2) and sd == pytest.approx(want_sd, rel=1e-5)
        assert got[a][1] == float(rule8 or excess > sd)
    # a binary attribute nearer an even split (20,000 / 29,100) at λ = 0.02: Δ > 0 (the one-way
    # by its sign) but within one s.d. of its estimate: rule (8)'s choice, uniform, stays
    y, s2, total = np.array([20000.0, 29100.0]), 790.0**2, 48600.0
    got = attribute_priors("per-attribute", total, [(0,)], [y], [s2], [2], 0.02, 3)
    m = _one_way(0, 2, total, [(0,)], [y], [s2], [2])
    assert not float(m.min()) < 0.02 * s2 * (2 ** (1 / 3) - 1)
    excess, sd = _brute_force_risk_difference(y, s2, 0.02, 3, total)
    assert 0 < excess < sd and got[0][1] == 0.0


def test_risk_rule_only_with_one_way_marginals_only():
    # the same binary attribute beside a measured pair: rule (8) decides (the risk rule is the
    # fallback's, where the fit is a product)
    sizes, axes, values, variances, total, lam, got = _rule_case(0.02)
    assert got[0][1] == 1.0
    pair = np.full(15, 3240.0)
    mixed = attribute_priors("per-attribute", total, axes + [(1, 2)], values + [pair], variances + [1e6], sizes, lam, 3)
    assert mixed[0][1] == 0.0
