"""Predicates: parsing, masks over marginals and full domains, records, and every bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpopt.errors import DataError, DomainError, QueryError, confidential_values_shown
from dpopt.model.domain import Domain
from dpopt.model.predicates import Predicate, as_predicate
from tests.test_queries import all_cells

DOM = Domain.from_dict(
    {
        "sex": ["F", "M"],
        "age": [5, 15, 25, 35, 45, 65],
        "rel": ["householder", "spouse", "child", "other"],
        "n": 4,  # no labels: codes are the values
    }
)
CELLS = all_cells(DOM)


def cell_values(codes) -> dict:
    """Labels (or codes) of one cell, for Python's own evaluation of a predicate."""
    return {a: DOM.labels_of(a)[int(c)] for a, c in zip(DOM.attrs, codes)}


def brute_full_mask(fn) -> np.ndarray:
    return np.array([bool(fn(**cell_values(c))) for c in CELLS])


CASES = [
    ("age < 15 and rel == 'spouse'", lambda sex, age, rel, n: age < 15 and rel == "spouse"),
    ("rel in ['householder', 'spouse'] and age < 15", lambda sex, age, rel, n: rel in ("householder", "spouse") and age < 15),
    ("not (sex == 'F' or age >= 65)", lambda sex, age, rel, n: not (sex == "F" or age >= 65)),
    ("15 <= age < 45", lambda sex, age, rel, n: 15 <= age < 45),
    ("40 > age", lambda sex, age, rel, n: age < 40),
    ("rel not in ('child',) or n != 2", lambda sex, age, rel, n: rel != "child" or n != 2),
    ("n >= 2 and n <= 2.5", lambda sex, age, rel, n: 2 <= n <= 2.5),
    ("age == 25 or age == 65.0", lambda sex, age, rel, n: age in (25, 65)),
    ("n > -1", lambda sex, age, rel, n: True),
    ("n < 0", lambda sex, age, rel, n: False),
    ("sex != 'M' and not not (rel == 'other')", lambda sex, age, rel, n: sex != "M" and rel == "other"),
    ("age in {5, 65} and sex in ['M']", lambda sex, age, rel, n: age in (5, 65) and sex == "M"),
]


@pytest.mark.parametrize("text, fn", CASES)
def test_parsed_masks_equal_brute_force(text, fn):
    pred = Predicate.parse(text)
    assert str(pred) == text
    full = brute_full_mask(fn)
    assert np.array_equal(pred.full_mask(DOM), full)
    # The marginal mask over the predicate's attributes, broadcast back, is the full mask.
    attrs = DOM.canonical(pred.attrs)
    sub = pred.mask(DOM).reshape([DOM.size_of(a) for a in attrs])
    expanded = np.broadcast_to(
        sub.reshape([DOM.size_of(a) if a in attrs else 1 for a in DOM.attrs]), DOM.shape
    ).reshape(-1)
    assert np.array_equal(expanded, full)
    # Records: evaluate() agrees with the mask at each record's cell.
    rng = np.random.default_rng(len(text))
    codes = np.stack([rng.integers(0, s, 200) for s in DOM.sizes], axis=1)
    assert np.array_equal(pred.evaluate(codes, DOM), full[DOM.ravel(codes)])
    # The text round-trips.
    assert np.array_equal(Predicate.parse(str(pred)).full_mask(DOM), full)


def test_ordered_comparisons_on_string_labels_compare_codes():
    pred = Predicate.parse("rel < 'child'")  # codes of householder, spouse
    assert np.array_equal(pred.mask(DOM), [True, True, False, False])
    assert np.array_equal(Predicate.parse("rel >= 2").mask(DOM), [False, False, True, True])


def test_attrs_order_and_binding():
    pred = Predicate.parse("rel == 'child' and sex == 'F' and rel != 'spouse'")
    assert pred.attrs == ("rel", "sex")  # order of appearance while unbound
    bound = pred.bind(DOM)
    assert bound.attrs == ("sex", "rel") and bound.domain is DOM
    assert bound.mask().shape == (8,)
    assert np.array_equal(bound.mask(), pred.mask(DOM))
    assert as_predicate("sex == 'F'", DOM).attrs == ("sex",)
    assert as_predicate(pred) is pred


def test_from_dict_and_combinators():
    d = Predicate.from_dict({"rel": ["spouse", "child"], "sex": "M", "n": np.int64(3)})
    assert str(d) == "rel in ['spouse', 'child'] and sex == 'M' and n == 3"
    want = brute_full_mask(lambda sex, age, rel, n: rel in ("spouse", "child") and sex == "M" and n == 3)
    assert np.array_equal(d.full_mask(DOM), want)
    codes = Predicate.from_dict({"rel": [1, 2], "sex": 1, "n": 3})  # codes are accepted too
    assert np.array_equal(codes.full_mask(DOM), want)
    a, b = Predicate.parse("age < 15"), Predicate.parse("sex == 'F'")
    assert np.array_equal((a & b).full_mask(DOM), a.full_mask(DOM) & b.full_mask(DOM))
    assert np.array_equal((a | b).full_mask(DOM), a.full_mask(DOM) | b.full_mask(DOM))
    assert np.array_equal((~a).full_mask(DOM), ~a.full_mask(DOM))
    assert np.array_equal(Predicate.parse(str(~(a | b))).full_mask(DOM), ~(a | b).full_mask(DOM))


def test_attribute_names_that_are_not_identifiers():
    dom = Domain.from_dict({"marital-status": ["single", "married"], "in": 3})
    pred = Predicate.from_dict({"marital-status": "married", "in": [0, 2]})
    assert str(pred) == "attr('marital-status') == 'married' and attr('in') in [0, 2]"
    parsed = Predicate.parse(str(pred))
    assert np.array_equal(parsed.full_mask(dom), [False, False, False, True, False, True])


# ---- random predicates against Python's own evaluation --------------------------------------
_ATOMS = st.one_of(
    st.builds(lambda op, v: f"age {op} {v}", st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), st.sampled_from([5, 15, 25, 35, 45, 65])),
    st.builds(lambda op, v: f"n {op} {v}", st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), st.integers(0, 3)),
    st.builds(lambda v: f"sex == {v!r}", st.sampled_from(["F", "M"])),
    st.builds(
        lambda neg, vs: f"rel {'not in' if neg else 'in'} {sorted(vs)!r}",
        st.booleans(),
        st.sets(st.sampled_from(["householder", "spouse", "child", "other"]), min_size=1),
    ),
)
_EXPRS = st.recursive(
    _ATOMS,
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) or ({b})", inner, inner),
        st.builds(lambda a: f"not ({a})", inner),
    ),
    max_leaves=6,
)


@pytest.mark.filterwarnings("ignore:Generating overly large repr")  # the recursive strategy's own repr
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPRS)
def test_random_predicates_equal_python_evaluation(text):
    code = compile(text, "<predicate>", "eval")
    want = np.array([bool(eval(code, {}, cell_values(c))) for c in CELLS])  # the test's oracle
    pred = Predicate.parse(text)
    assert np.array_equal(pred.full_mask(DOM), want)
    attrs = DOM.canonical(pred.attrs)
    marg = pred.mask(DOM).reshape([DOM.size_of(a) for a in attrs])
    picked = marg[tuple(CELLS[:, DOM.axis(a)] for a in attrs)]
    assert np.array_equal(picked, want)


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, error, match",
    [
        ("zz == 1", DomainError, "unknown attribute 'zz'"),
        ("sex == 'X'", DomainError, "value 'X' is not in the domain of attribute 'sex'"),
        ("rel in ['spouse', 'cousin']", DomainError, "value 'cousin' is not in the domain of attribute 'rel'"),
        ("age < 'old'", DomainError, "attribute 'age' has numeric labels"),
        ("age == 16", DomainError, "value 16 is not in the domain of attribute 'age'"),
        ("n == 4", DomainError, "value 4 is not in the domain of attribute 'n'"),
        ("age <", QueryError, "not a valid expression"),
        ("sex == F", QueryError, "between two names .* quote string values"),
        ("sex in [F]", QueryError, "a bare name where a value was expected"),
        ("age < n", QueryError, "a comparison between two names"),
        ("1 < 2", QueryError, "a comparison without an attribute"),
        ("__import__('os').system('true')", QueryError, "expected a comparison"),
        ("age", QueryError, "expected a comparison"),
        ("age + 1 < 3", QueryError, "a comparison without an attribute"),
        ("sex in 'F'", QueryError, "'in' needs a list, tuple or set literal"),
        ("'F' in sex", QueryError, "'in' needs the attribute on its left"),
        ("sex == ['F']", QueryError, r"'==' with a list \(use 'in'\)"),
        ("sex in []", QueryError, "'in' with an empty list"),
        ("sex is 'F'", QueryError, "unsupported operator Is"),
        ("rel in [len('x')]", QueryError, "expected a string, number or boolean literal"),
        ("sex == 'F' ; 1", QueryError, "not a valid expression"),
    ],
)
def test_bad_predicates_raise_naming_the_problem(text, error, match):
    with pytest.raises(error, match=match):
        Predicate.parse(text).mask(DOM)


def test_bad_inputs_to_constructors_and_evaluation():
    with pytest.raises(QueryError, match="non-empty mapping"):
        Predicate.from_dict({})
    with pytest.raises(QueryError, match="the value list of 'rel' is empty"):
        Predicate.from_dict({"rel": []})
    with pytest.raises(DomainError, match="unknown attribute 'zz'"):
        Predicate.from_dict({"zz": 1}, DOM)
    with pytest.raises(QueryError, match="must be a string"):
        Predicate.parse(3)
    with pytest.raises(QueryError, match="no domain given and none bound"):
        Predicate.parse("sex == 'F'").mask()
    with pytest.raises(QueryError, match="a predicate must be a Predicate, a string or a dict"):
        as_predicate(42)
    pred = Predicate.parse("sex == 'F'")
    with pytest.raises(DataError, match=r"records must have shape \(n, 4\)"):
        pred.evaluate(np.zeros((3, 2), dtype=int), DOM)
    with pytest.raises(DataError, match=r"column 'sex' holds codes outside 0..1 \(the values are confidential"):
        pred.evaluate(np.array([[2, 0, 0, 0]]), DOM)
    with confidential_values_shown(), pytest.raises(DataError, match="column 'sex' holds codes outside 0..1: '2'$"):
        pred.evaluate(np.array([[2, 0, 0, 0]]), DOM)
    with pytest.raises(DataError, match="codes must be integers"):
        pred.evaluate(np.zeros((1, 4)), DOM)
    with pytest.raises(QueryError, match="cannot combine a Predicate with str"):
        pred & "age < 3"
