"""The upward pass and the budget split of a top-down release, against brute-force least squares and
closed forms; the release's outputs of every measured table and its warning on sparse levels."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpopt.algorithms.topdown import GeographySpec, LevelMeasure, TopDown, TopDownParams
from dpopt.algorithms.topdown.engine import LevelQuery, run_levels
from dpopt.algorithms.topdown.constraints import ZeroRules
from dpopt.algorithms.topdown.executors import SerialExecutor
from dpopt.algorithms.topdown.solve import SolveOptions
from dpopt.algorithms.topdown.split import SplitEntry, choose_split, hierarchy_error
from dpopt.algorithms.topdown.upward import estimates
from dpopt.errors import ParameterError
from dpopt.estimate import reconstruct
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.explicit import SparseQuery
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom

RHO = Budget.zcdp(Fraction(1, 2))


class _Law:
    """The two attributes of a noise law the upward pass reads."""

    def __init__(self, variance):
        self.variance, self.scale, self.family = variance, float(np.sqrt(variance)), "discrete_gaussian"


def _query(level, label, query, variance):
    return LevelQuery(level, label, query, _Law(variance), Fraction(1), f"{level}: {label}")


def unbalanced():
    """nation → 3 states with 1, 2 and 3 counties; 3 cells per unit."""
    import pandas as pd

    edges = [("N", ""), ("A", "N"), ("B", "N"), ("C", "N"), ("A1", "A"), ("B1", "B"), ("B2", "B"),
             ("C1", "C"), ("C2", "C"), ("C3", "C")]
    return Geography.from_edges(pd.DataFrame(edges, columns=["unit", "parent"]), ("nation", "state", "county"))


def subtree_blue(geography, queries, noisy, level, unit, key_rows):
    """Brute force: the best linear unbiased estimate of ``Q x_unit`` (one query's rows) from that query's
    measurements in the unit's subtree, by generalised least squares over the subtree's leaves."""
    anc = geography.ancestors()
    leaves = np.flatnonzero(anc[level] == unit)
    Q = key_rows.toarray()
    rows_A, rows_y, rows_w = [], [], []
    for q in queries:
        if q.level < level or q.query.to_sparse().shape != key_rows.shape or (q.query.to_sparse() != key_rows).nnz:
            continue
        for d in range(geography.sizes[q.level]):
            under = anc[q.level][leaves] == d
            if under.any():  # d lies in the unit's subtree
                rows_A.append(np.kron(under[None, :].astype(float), Q))
                rows_y.append(noisy[q.level][q.label][d])
                rows_w.append(np.full(Q.shape[0], 1.0 / q.law.variance))
    A, y, w = np.vstack(rows_A), np.concatenate(rows_y), np.concatenate(rows_w)
    target = np.kron(np.ones((1, leaves.size)), key_rows.toarray())
    H = np.linalg.pinv(A.T @ (w[:, None] * A))
    coef = target @ H @ A.T * w[None, :]
    return coef @ y, np.diag(coef @ np.diag(1.0 / w) @ coef.T)


def test_the_upward_pass_is_each_querys_best_linear_unbiased_estimate_from_the_subtree():
    """Per query, Hay et al.'s recursion is the exact BLUE of every unit's answers from that query's
    measurements in its subtree, in any tree (unequal numbers of children here), with the stated variance."""
    geography = unbalanced()
    chars = Domain.from_dict({"c": 3})
    ident, total, part = Identity(chars), Total(chars), SparseQuery(chars, np.array([[1.0, 1.0, 0.0]]), ["c<2"])
    queries = [_query(0, "detailed", ident, 4.0), _query(1, "detailed", ident, 2.0), _query(1, "total", total, 1.0),
               _query(2, "detailed", ident, 1.0), _query(2, "total", total, 3.0), _query(2, "part", part, 0.5)]
    gen = np.random.default_rng(3)  # test input (any answers: the estimates are linear in them)
    noisy = [{q.label: gen.normal(10, 3, (geography.sizes[k], q.query.num_rows)) for q in queries if q.level == k}
             for k in range(geography.depth)]
    fitted = estimates(geography, queries, noisy)
    for k in range(geography.depth):
        for e in fitted[k]:
            for u in range(geography.sizes[k]):
                value, variance = subtree_blue(geography, queries, noisy, k, u, e.query.to_sparse())
                np.testing.assert_allclose(e.values[u], value, rtol=1e-9, atol=1e-9)
                np.testing.assert_allclose(np.full(value.size, e.variance[u]), variance, rtol=1e-9)
    # The nation has every query asked anywhere below, its own first; the counties only their own answers.
    assert [e.label for e in fitted[0]] == ["detailed", "total", "part"]
    assert all(e.own for e in fitted[2]) and not fitted[0][0].own
    # Without the upward pass, every level keeps exactly its own answers.
    plain = estimates(geography, queries, noisy, upward=False)
    assert [[e.label for e in lv] for lv in plain] == [["detailed"], ["detailed", "total"], ["detailed", "total", "part"]]
    assert all(np.array_equal(e.values, noisy[k][e.label]) for k, lv in enumerate(plain) for e in lv)


def big_case():
    """A balanced tree (2 states × 2 counties), 4 cells per unit, large counts: x >= 0 never binds."""
    domain = Domain.from_dict({"g1": 2, "g2": 2, "c": 4})
    geography = Geography.from_columns(domain, ["g1", "g2"], parents="nested")
    chars = geography.characteristics(domain)
    gen = np.random.default_rng(7)  # test input, not privacy noise
    counts = gen.integers(5000, 9000, size=domain.size)
    codes = domain.unravel(np.arange(domain.size))
    return domain, geography, chars, Dataset(codes, domain, counts)


def test_the_root_is_the_least_squares_fit_of_every_level_measurement():
    """Where x >= 0 does not bind, the root's fit after the upward pass is the generalised least squares
    estimate of the root's table from every measurement of every level (one joint solve over the leaves)."""
    domain, geography, chars, data = big_case()
    measures = (LevelMeasure("detailed", "nation", Identity(chars), None, Fraction(1, 5)),
                LevelMeasure("detailed", "g1", Identity(chars), None, Fraction(1, 5)),
                LevelMeasure("c<2", "g1", Marginal(chars, ("c",)), None, Fraction(1, 5)),
                LevelMeasure("detailed", "g2", Identity(chars), None, Fraction(1, 5)),
                LevelMeasure("total", "g2", Total(chars), None, Fraction(1, 5)))
    algorithm = TopDown(TopDownParams(GeographySpec(geography=geography), measures, executor="serial"))
    constraints = ConstraintSet(domain, [NonNegativity()])
    plan = algorithm.plan(domain, constraints, RHO)
    queries = list(plan.details.queries)
    outcome = run_levels(geography, chars, geography.leaf_histograms(data), queries, [], ZeroRules(np.zeros(chars.size,
                         dtype=bool)), RHO.accountant(), SeededRandom(2), executor=SerialExecutor(),
                         options=SolveOptions(keep_fractional=True))
    assert outcome.status is Status.OPTIMAL
    root = outcome.levels[0].solutions[0].fractional.ravel()
    # The same answers as measurements over the full domain (leaf i, cell c is domain cell 4 i + c).
    anc = geography.ancestors()
    ms = []
    for q in queries:
        rows = np.kron(np.eye(geography.sizes[q.level])[:, anc[q.level]], q.query.to_sparse().toarray())
        noisy = outcome.levels[q.level].noisy[q.label].ravel()
        ms.append(Measurement(SparseQuery(domain, rows), noisy, q.law.family, q.law.scale, q.law.variance,
                              label=q.ledger_label))
    joint = reconstruct(ms, ConstraintSet(domain, [NonNegativity()]), "l2", integer=False)
    assert joint.success
    # Clarabel certifies a relative gap of 1e-8; the root's cells (around 10^4) agree to 1e-3.
    np.testing.assert_allclose(root, joint.x.reshape(geography.sizes[-1], chars.size).sum(axis=0), atol=2e-3)


# ---- the budget split -----------------------------------------------------------------------------------
def test_the_expected_error_of_each_table_is_the_least_squares_covariance_on_a_balanced_tree():
    """hierarchy_error against the covariance of the joint least-squares estimate, (Aᵀ Σ⁻¹ A)⁻¹, computed
    with explicit matrices over every leaf: exact on a balanced tree (2 × 3 children, 2 × 3 cells)."""
    domain = Domain.from_dict({"g1": 2, "g2": 3, "a": 2, "b": 3})
    geography = Geography.from_columns(domain, ["g1", "g2"], parents="nested")
    chars = geography.characteristics(domain)
    plan = [(0, Identity(chars), 0.1, 2), (0, Marginal(chars, ("a",)), 0.2, 2), (1, Marginal(chars, ("b",)), 0.3, 2),
            (2, Identity(chars), 0.3, 2), (2, Total(chars), 0.1, 2)]
    entries = [SplitEntry(f"q{i}", k, q, 1.0, 2.0, p) for i, (k, q, _, p) in enumerate(plan)]
    shares = [s for _, _, s, _ in plan]
    got = hierarchy_error(geography, chars, entries, shares)
    anc = geography.ancestors()
    blocks, weights = [], []
    for (k, q, s, p) in plan:
        Q = q.to_sparse().toarray()
        blocks.append(np.kron(np.eye(geography.sizes[k])[:, anc[k]], Q))
        weights.append(np.full(blocks[-1].shape[0], s**p / 2.0))
    A, w = np.vstack(blocks), np.concatenate(weights)
    cov = np.linalg.inv(A.T @ (w[:, None] * A))
    want = [np.trace(b @ cov @ b.T) for b in blocks]  # each table's error: its rows over every unit of its level
    np.testing.assert_allclose(got, want, rtol=1e-9)


def census_entries(power):
    from dpopt.datasets.census import census_domain

    domain = census_domain(3, 3)
    geography = Geography.from_columns(domain, ["state", "county"])
    chars = geography.characteristics(domain)
    queries = {"detailed": Identity(chars), "age x sex": Marginal(chars, ("age_group", "sex")),
               "relationship": Marginal(chars, ("relationship",))}
    return geography, chars, [SplitEntry(f"{level}: {label}", k, q, 1.0, 2.0, power)
                              for k, level in enumerate(geography.names) for label, q in queries.items()]


@pytest.mark.parametrize("power", [1, 2])
def test_the_chosen_split_is_exact_and_no_worse_than_even_or_leaf_only_splits(power):
    geography, chars, entries = census_entries(power)
    choice = choose_split(geography, chars, entries)
    assert sum(choice.shares.values()) == 1 and all(isinstance(s, Fraction) for s in choice.shares.values())
    assert all(s == 0 or s.denominator <= 1000 for s in choice.shares.values())

    def objective(shares):
        return float(np.sum(np.log(hierarchy_error(geography, chars, entries, shares))))

    chosen = objective([float(choice.shares[e.key]) for e in entries])
    assert chosen == pytest.approx(choice.objective, rel=1e-12)
    even = objective(np.full(len(entries), 1 / len(entries)))
    leaves = objective([1 / 3 if e.level == 2 else 0.0 for e in entries])
    assert chosen <= even + 1e-9 and chosen <= leaves + 1e-6
    if power == 2:
        # Laplace noise: precision grows with epsilon squared, so nine counties' measurements summed beat any
        # share spent on the states or the nation for these tables: everything goes to the counties.
        assert all(choice.shares[e.key] == 0 for e in entries if e.level < 2)
    else:
        # Gaussian noise under zCDP: precision grows with rho, and the upper levels' tables are worth a share.
        assert all(choice.shares[e.key] > 0 for e in entries if e.level == 0 and "detailed" in e.key)


def test_the_split_model_gradient_matches_finite_differences():
    from dpopt.algorithms.topdown.split import _Model

    geography, chars, entries = census_entries(2)
    model = _Model(geography, chars, entries)
    s = np.random.default_rng(1).uniform(0.05, 1.0, len(entries))  # a test point
    s /= s.sum()
    value, grad = model.value_and_gradient(s)
    step = 1e-7
    numeric = [(model.value_and_gradient(s + step * e)[0] - model.value_and_gradient(s - step * e)[0]) / (2 * step)
               for e in np.eye(len(entries))]
    np.testing.assert_allclose(grad, numeric, rtol=1e-5)
    assert np.isfinite(value)


# ---- the spec: a split chosen by expected error, outputs, warnings ---------------------------------------
AUTO_SPEC = """
name = "td-auto"
algorithm = "topdown"
[domain]
builtin = "census"
states = 2
counties_per_state = 2
[data]
rows = {rows}
[privacy]
accounting = "pure"
epsilon = {epsilon}
[geography]
levels = ["state", "county"]
[[measure]]
level = "nation"
query = "marginal"
attrs = ["age_group"]
[[measure]]
level = "state"
query = "identity"
[[measure]]
level = "county"
query = "identity"
[[measure]]
level = "county"
query = "marginal"
attrs = ["sex"]
weight = 2
[topdown]
executor = "serial"
[constraints]
nonnegative = true
integer = true
structural_zeros = [{{ builtin = true }}]
[output]
formats = ["csv"]
summary = []
plots = false
"""


def test_a_spec_without_shares_gets_the_split_by_expected_error():
    from dpopt.release import plan
    from dpopt.spec import parse_spec_text

    text = AUTO_SPEC.format(rows=3000, epsilon=1)
    p = plan(parse_spec_text(text))
    shares = {s.label: s.share for s in p.algorithm_plan.steps}
    assert sum(shares.values()) == 1 and set(shares) <= {"nation: marginal(age_group)", "state: identity",
                                                         "county: identity", "county: marginal(sex)"}
    assert shares["county: identity"] > 0 and shares["county: marginal(sex)"] > 0
    lines = "\n".join(p.algorithm_plan.lines)
    assert "budget split chosen before any data by expected error" in lines
    assert "county: marginal(sex): share" in lines and "weight 2" in lines
    assert "level nation: detailed cells known to noise s.d." in lines


def test_the_check_command_prints_the_chosen_split(tmp_path, capsys):
    from dpopt.cli import main

    path = tmp_path / "auto.toml"
    path.write_text(AUTO_SPEC.format(rows=3000, epsilon=1))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "budget split chosen before any data by expected error" in out and "expected RMS error per answer" in out


def test_a_sparse_level_is_warned_of_from_the_release_itself(tmp_path):
    from dpopt.release import run
    from dpopt.spec import parse_spec_text

    sparse = run(parse_spec_text(AUTO_SPEC.format(rows=300, epsilon="0.1")), seed=3)
    dense = run(parse_spec_text(AUTO_SPEC.format(rows=60000, epsilon=4)), seed=3)
    assert sparse.success and dense.success
    split = sparse.report["algorithm"]["split"]
    assert sum(Fraction(v) for v in split["shares"].values()) == 1 and set(split["expected_rmse"]) == set(split["shares"])
    warned = [n for n in sparse.notes if "above their average released count per cell" in n]
    assert warned and not [n for n in dense.notes if "above their average released count per cell" in n]
    # The average is the release's own: its root total over units and allowed cells (no confidential value).
    from dpopt.algorithms.topdown.constraints import zero_rules

    geography, chars = sparse.geography, sparse.characteristics
    allowed = int((~zero_rules(sparse.plan.constraints, geography, chars).shared).sum())
    county = next(n for n in warned if n.startswith("level 'county'"))
    average = sparse.level_tables["nation"].sum() / (geography.sizes[2] * allowed)
    assert f"({average:.3g})" in county

