"""ConstraintSet: zero masks, residuals, and the pre-check that names conflicting constraints."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import InconsistentConstraintsError, QueryError
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Marginal, Total


@pytest.fixture
def geo():
    return Domain.from_dict(
        {"state": ["A", "B"], "county": ["A1", "A2", "B1"], "age": ["0-14", "15+"], "rel": ["head", "spouse", "child"]}
    )


def parent_of():
    return {"A1": "A", "A2": "A", "B1": "B"}


def brute_zero_mask(domain, rule):
    cells = domain.unravel(np.arange(domain.size))
    labels = {a: np.array(domain.labels_of(a), dtype=object)[cells[:, i]] for i, a in enumerate(domain.attrs)}
    return rule(labels)


def test_structural_zero_and_hierarchy_masks(geo):
    cs = ConstraintSet(geo)
    cs.add(StructuralZeros("age == '0-14' and rel in ['head', 'spouse']", name="young_heads", reason="no heads under 15"))
    cs.add(Hierarchy("state", "county", parent_of()))
    expected = brute_zero_mask(geo, lambda v: ((v["age"] == "0-14") & np.isin(v["rel"], ["head", "spouse"])))
    expected |= brute_zero_mask(geo, lambda v: np.array([parent_of()[c] != s for c, s in zip(v["county"], v["state"])]))
    assert np.array_equal(cs.zero_mask(), expected)
    cs.check()  # consistent


def test_hierarchy_needs_every_child(geo):
    with pytest.raises(InconsistentConstraintsError, match="child values \\['B1'\\] of 'county' have no parent"):
        ConstraintSet(geo).add(Hierarchy("state", "county", {"A1": "A", "A2": "A"}))


def test_invariant_on_structural_zero_is_named(geo):
    cs = ConstraintSet(geo)
    cs.add(StructuralZeros("age == '0-14' and rel == 'spouse'", name="child_spouse"))
    q = Marginal(geo, ["age", "rel"])
    values = np.array([5, 3, 2, 4, 4, 4], dtype=float)  # cell (0-14, spouse) = 3 but it is a zero
    cs.add(Invariant(q, values, name="age_rel"))
    with pytest.raises(InconsistentConstraintsError, match="invariant 'age_rel' needs 3.*structural_zero:child_spouse"):
        cs.check()


def test_hierarchy_that_does_not_add_up(geo):
    cs = ConstraintSet(geo, [Hierarchy("state", "county", parent_of()), NonNegativity()])
    cs.add(Invariant(Marginal(geo, ["state"]), [10, 5], name="state_totals"))
    cs.add(Invariant(Marginal(geo, ["county"]), [4, 4, 7], name="county_totals"))  # same total, but A: 8 != 10
    with pytest.raises(InconsistentConstraintsError) as err:
        cs.check()
    msg = str(err.value)
    for key in ("hierarchy:geography", "invariant:state_totals", "invariant:county_totals"):
        assert key in msg
    assert "nonnegative" not in msg  # the deletion filter drops what is not needed


def test_negative_and_fractional_invariants(geo):
    cs = ConstraintSet(geo, [NonNegativity()])
    cs.add(Invariant(Total(geo), [-1.0], name="total"))
    with pytest.raises(InconsistentConstraintsError, match="invariant 'total' has the negative value -1"):
        cs.check()
    cs = ConstraintSet(geo, [Integrality()])
    cs.add(Invariant(Total(geo), [2.5], name="total"))
    with pytest.raises(InconsistentConstraintsError, match="non-integer value 2.5"):
        cs.check()


def test_inequality_against_invariant(geo):
    cs = ConstraintSet(geo, [NonNegativity()])
    cs.add(Invariant(Total(geo), [100.0], name="total"))
    cs.add(LinearInequality(Marginal(geo, ["state"]), upper=[30.0, 30.0], name="caps"))
    with pytest.raises(InconsistentConstraintsError, match="'invariant:total', 'inequality:caps'"):
        cs.check()


def test_duplicate_and_mismatched_constraints(geo):
    cs = ConstraintSet(geo, [NonNegativity()])
    with pytest.raises(InconsistentConstraintsError, match="declared twice"):
        cs.add(NonNegativity())
    other = Domain.from_dict({"x": 2})
    with pytest.raises(QueryError, match="its query is over"):
        cs.add(Invariant(Total(other), [1.0], name="t"))
    with pytest.raises(QueryError, match="2 values for a query with 1 rows"):
        Invariant(Total(geo), [1.0, 2.0], name="t")
    with pytest.raises(InconsistentConstraintsError, match="lower bound above upper bound"):
        LinearInequality(Total(geo), lower=3.0, upper=2.0, name="bad")


def test_residuals_and_invariant_from_data(geo, rng):
    cells = rng.integers(0, geo.size, 200)
    data = Dataset.from_histogram(np.bincount(cells, minlength=geo.size), geo)
    cs = ConstraintSet(geo, [NonNegativity(), Integrality()])
    cs.invariant_from_data(Marginal(geo, ["state"]), data, "state_totals")
    assert cs.invariants[0].from_data
    x = data.histogram().astype(float)
    assert all(r["satisfied"] for r in cs.residuals(x))
    x[0] -= 0.5
    worst = {r["constraint"]: r["max_violation"] for r in cs.residuals(x)}
    assert worst["integer:cells"] == pytest.approx(0.5)
    assert worst["invariant:state_totals"] == pytest.approx(0.5)


def test_zero_pattern_attrs_follow_the_mask(geo):
    """A predicate naming attributes out of domain order still pairs attrs and mask correctly."""
    rule = StructuralZeros("rel == 'spouse' and age == '0-14'", name="z")
    attrs, mask = rule.pattern(geo)
    assert attrs == ("age", "rel")
    sub = geo.project(attrs)
    expected = np.zeros(sub.shape, dtype=bool)
    expected[0, 1] = True
    assert np.array_equal(mask, expected.ravel())
