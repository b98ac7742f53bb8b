"""The audit domain: what :func:`dpopt.audit.domain.shrink` keeps of a spec's domain and rules.

Checked against brute force: every cell of the audit domain is enumerated and compared with the
same cell of the spec's domain (a structural zero there exactly when one here), every kept
parent has a kept child, the limit counts the cells that can hold a record.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpopt.audit.domain import restricted_rules, shrink
from dpopt.datasets.census import census_domain, county_parent, structural_zero_constraints
from dpopt.errors import SpecError
from dpopt.model.constraints import ConstraintSet, Hierarchy, StructuralZeros
from dpopt.model.domain import Domain


def census_rules(states=4, counties=3):
    domain = census_domain(states, counties)
    rules = structural_zero_constraints(domain, name="census rule {}")
    rules.append(Hierarchy("state", "county", county_parent(domain), name="geography"))
    return domain, rules


def full_codes(shrunk, small_cell):
    """The spec's codes of an audit-domain cell."""
    codes = shrunk.domain.unravel(np.array([small_cell]))[0]
    return {a: shrunk.kept[a][c] for a, c in zip(shrunk.domain.attrs, codes)}


def impossible_in_full(domain, rules, codes) -> bool:
    for rule in rules:
        attrs, mask = rule.pattern(domain)
        shape = [domain.size_of(a) for a in attrs]
        if mask.reshape(shape)[tuple(codes[a] for a in attrs)]:
            return True
    return False


@pytest.mark.parametrize("limit", [8, 16, 32])
def test_census_audit_domain_keeps_children_zeros_and_the_limit(limit):
    domain, rules = census_rules()
    shrunk = shrink(domain, rules, limit)
    small = shrunk.domain
    assert small.size <= 256 and 0 < shrunk.possible <= limit
    # every kept state keeps at least one of its own counties, and every kept county its state
    parent = county_parent(domain)
    states, counties = set(small.labels["state"]), small.labels["county"]
    assert states == {parent[c] for c in counties}
    assert len(states) >= 2  # a top-down geography with more than one parent
    # the restricted rules mark exactly the cells the spec's rules mark (brute force over the cells)
    cs = ConstraintSet(small, restricted_rules(shrunk))
    zero = cs.zero_mask().ravel()
    for cell in range(small.size):
        assert zero[cell] == impossible_in_full(domain, rules, full_codes(shrunk, cell)), cell
    assert int((~zero).sum()) == shrunk.possible
    # no value without a cell that can hold a record
    possible = (~zero).reshape(small.shape)
    for axis in range(len(small.attrs)):
        others = tuple(i for i in range(len(small.attrs)) if i != axis)
        assert possible.any(axis=others).all()


def test_census_audit_domain_keeps_household_structural_zeros_when_they_fit():
    domain, rules = census_rules()
    shrunk = shrink(domain, rules, 16)
    kept_rules = {r.name for r in restricted_rules(shrunk) if isinstance(r, StructuralZeros)}
    # a householder under 15, a spouse outside a married couple, a child living alone
    assert {"census rule 1", "census rule 2", "census rule 3"} <= kept_rules
    missing = next(n for n in shrunk.notes if n.startswith("structural zeros without a cell"))
    assert all(f"census rule {i}" not in missing.split(": ")[1].split(", ") for i in (1, 2, 3))


def test_a_domain_that_fits_is_kept_whole_and_a_larger_one_grows_evenly():
    domain = Domain.from_dict({"s": ["A", "B", "C"], "t": 4, "u": 2})
    whole = shrink(domain, (), 24)
    assert whole.domain == domain and whole.describe() is None
    small = shrink(domain, (), 8).domain
    assert small.sizes == (2, 2, 2) and small.labels["s"] == ("A", "B")


def test_an_attribute_without_labels_keeps_its_first_codes():
    domain = Domain.from_dict({"age": 90, "sex": ["F", "M"]})
    zeros = StructuralZeros("age < 3 and sex == 'M'", name="no young men")
    shrunk = shrink(domain, [zeros], 6)
    assert shrunk.kept["age"] == tuple(range(len(shrunk.kept["age"])))
    (rule,) = restricted_rules(shrunk)
    small = shrunk.domain
    attrs, mask = rule.pattern(small)
    expected = [(a < 3 and s == 1) for a, s in itertools.product(range(small.size_of("age")), range(2))]
    assert list(mask) == expected


def test_attributes_left_with_one_value_can_be_dropped():
    domain = Domain.from_dict({f"b{i}": 2 for i in range(8)})
    shrunk = shrink(domain, (), 16)
    assert shrunk.single_valued == ("b4", "b5", "b6", "b7")
    dropped = shrunk.without_single_valued()
    assert dropped.domain.attrs == ("b0", "b1", "b2", "b3") and dropped.dropped == ("b4", "b5", "b6", "b7")
    assert "dropped: b4, b5, b6, b7" in dropped.describe()


def test_a_domain_whose_every_cell_is_ruled_out_is_refused():
    domain = Domain.from_dict({"a": ["x", "y"], "b": ["p", "q"]})
    with pytest.raises(SpecError, match="no cell of the audit domain can hold a record"):
        shrink(domain, [StructuralZeros("a == 'x' or a == 'y'", name="everything")], 4)
    with pytest.raises(SpecError, match="at least 2"):
        shrink(domain, (), 1)
