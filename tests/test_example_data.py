"""Tests of dpopt.datasets.census, the generated example person file."""

from __future__ import annotations

import ast
import itertools
import os

import numpy as np
import pandas as pd
import pytest

from dpopt.datasets import census
from dpopt.datasets.census import (
    CENSUS_ATTRS,
    STRUCTURAL_ZEROS,
    census_domain,
    county_parent,
    generate_census,
    state_totals,
    structural_zero_mask_of_records,
    structural_zero_rule_masks,
    structural_zero_rules,
    write_example_data,
)
from dpopt.errors import HIDDEN_VALUES, DataError, DomainError, confidential_values_shown
from dpopt.model.domain import Domain


@pytest.fixture(scope="module")
def people() -> pd.DataFrame:
    return generate_census(20_000, seed=3, household_ids=True)


def all_cells(domain: Domain) -> pd.DataFrame:
    """One record per cell of the domain (brute force over every combination of labels)."""
    rows = list(itertools.product(*(domain.labels[a] for a in domain.attrs)))
    return pd.DataFrame(rows, columns=list(domain.attrs))


def eval_predicate(df: pd.DataFrame, predicate: str) -> np.ndarray:
    """Evaluate a predicate string with pandas, independently of the module's own check."""
    return df.eval(predicate).to_numpy(dtype=bool)


# ---- domain and geography ----------------------------------------------------------------------


def test_census_domain_labels_and_order():
    dom = census_domain(4, 3)
    assert dom.attrs == CENSUS_ATTRS
    assert dom.labels["state"] == ("S01", "S02", "S03", "S04")
    assert dom.labels["county"][:4] == ("S01-C1", "S01-C2", "S01-C3", "S02-C1")
    assert dom.sizes == (4, 12, 6, 2, 6, 5)
    assert dom.labels["age_group"] == ("0-14", "15-17", "18-24", "25-44", "45-64", "65+")
    assert dom.labels["sex"] == ("F", "M")
    assert "group quarters" in dom.labels["relationship"]
    assert "group quarters" in dom.labels["household_type"]


def test_county_parent_every_county_in_exactly_one_state():
    dom = census_domain(5, 4)
    parent = county_parent(dom)
    assert set(parent) == set(dom.labels["county"])
    assert len(set(dom.labels["county"])) == 20  # globally unique
    for state in dom.labels["state"]:
        own = [c for c, s in parent.items() if s == state]
        assert len(own) == 4 and all(c.startswith(state + "-") for c in own)


def test_wide_labels_stay_unique_and_nested():
    dom = census_domain(120, 11)
    assert dom.labels["state"][0] == "S001" and dom.labels["state"][-1] == "S120"
    assert dom.labels["county"][0] == "S001-C01" and dom.labels["county"][-1] == "S120-C11"
    parent = county_parent(dom)
    assert len(parent) == 120 * 11 and set(parent.values()) == set(dom.labels["state"])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_states": 0}, "num_states"),
        ({"num_states": -2}, "num_states"),
        ({"num_states": 2.0}, "num_states"),
        ({"num_states": True}, "num_states"),
        ({"counties_per_state": 0}, "counties_per_state"),
        ({"counties_per_state": "3"}, "counties_per_state"),
    ],
)
def test_census_domain_rejects_bad_sizes(kwargs, name):
    with pytest.raises(DomainError, match=name):
        census_domain(**kwargs)


def test_county_parent_rejects_bad_domains():
    with pytest.raises(DomainError, match="county"):
        county_parent(Domain.from_dict({"state": ["S01"], "age": 3}))
    with pytest.raises(DomainError, match="S09-C1"):
        county_parent(Domain.from_dict({"state": ["S01"], "county": ["S01-C1", "S09-C1"]}))
    with pytest.raises(DomainError, match="Domain"):
        county_parent({"state": ["S01"]})


# ---- structural-zero rules ---------------------------------------------------------------------

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare,
    ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Name, ast.Load, ast.Constant, ast.List,
)


def test_predicates_are_boolean_expressions_over_domain_labels():
    dom = census_domain(3, 2)
    rules = structural_zero_rules(dom)
    assert len(rules) == len(STRUCTURAL_ZEROS) + 3
    for predicate, reason in rules:
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason
        tree = ast.parse(predicate, mode="eval")
        for node in ast.walk(tree):
            assert isinstance(node, _ALLOWED_NODES), (predicate, type(node).__name__)
        for cmp in (n for n in ast.walk(tree) if isinstance(n, ast.Compare)):
            # attr == 'label' / attr in ['a', 'b']: the attribute exists, the labels are its own.
            assert isinstance(cmp.left, ast.Name) and cmp.left.id in dom.attrs, predicate
            (right,) = cmp.comparators
            values = [e.value for e in right.elts] if isinstance(right, ast.List) else [right.value]
            assert values and all(v in dom.labels[cmp.left.id] for v in values), predicate


def test_nesting_rules_are_built_from_county_parent():
    dom = census_domain(3, 2)
    parent = county_parent(dom)
    nesting = structural_zero_rules(dom)[len(STRUCTURAL_ZEROS):]
    for (predicate, reason), state in zip(nesting, dom.labels["state"]):
        own = [c for c in dom.labels["county"] if parent[c] == state]
        assert predicate == f"state == '{state}' and county not in {own!r}"
        assert state in reason and "nesting" in reason


def test_direct_rule_check_agrees_with_predicates_on_every_cell():
    dom = census_domain(2, 2)
    cells = all_cells(dom)
    assert len(cells) == dom.size
    rules = structural_zero_rules(dom)
    masks = structural_zero_rule_masks(cells, dom)
    assert len(masks) == len(rules)
    for (predicate, _), mask in zip(rules, masks):
        np.testing.assert_array_equal(mask, eval_predicate(cells, predicate), err_msg=predicate)
    # Closed-form cell counts of each rule: (forbidden combinations) x (free attributes).
    geo, n_age, n_sex, n_rel, n_type = 2 * 4, 6, 2, 6, 5
    expected = [
        2 * 1 * n_sex * n_type * geo,  # householder/spouse x 0-14
        1 * (n_type - 1) * n_age * n_sex * geo,  # spouse x not married couple
        (n_rel - 1) * 1 * n_age * n_sex * geo,  # alone x not householder
        3 * 1 * n_age * n_sex * geo,  # nonfamily x spouse/child/other relative
        1 * (n_type - 1) * n_age * n_sex * geo,  # gq relationship x not gq type
        (n_rel - 1) * 1 * n_age * n_sex * geo,  # not gq relationship x gq type
        1 * 2 * n_age * n_sex * n_rel * n_type,  # state S01 x the 2 counties of S02
        1 * 2 * n_age * n_sex * n_rel * n_type,
    ]
    assert [int(m.sum()) for m in masks] == expected
    any_rule = np.logical_or.reduce([eval_predicate(cells, p) for p, _ in rules])
    np.testing.assert_array_equal(structural_zero_mask_of_records(cells, dom), any_rule)


def test_rule_check_reads_plain_string_columns(people):
    as_text = people[list(CENSUS_ATTRS)].astype(str)
    dom = census_domain(4, 3)
    bad = as_text.iloc[:3].copy()
    bad.loc[bad.index[0], "relationship"] = "spouse"
    bad.loc[bad.index[0], "household_type"] = "alone"
    mask = structural_zero_mask_of_records(bad)  # domain read off the records
    assert mask[0] and not mask[1:].any()
    # A county of a state absent from the state column is a nesting violation.
    moved = as_text.iloc[:4].copy()
    moved["state"] = "S01"
    moved["county"] = ["S01-C1", "S03-C2", "S01-C2", "S01-C3"]
    masks = structural_zero_rule_masks(moved)
    assert len(masks) == len(STRUCTURAL_ZEROS) + 2  # states S01 and S03
    np.testing.assert_array_equal(masks[len(STRUCTURAL_ZEROS)], [False, True, False, False])
    np.testing.assert_array_equal(
        structural_zero_mask_of_records(as_text, dom), structural_zero_mask_of_records(people)
    )


def test_rule_check_rejects_bad_records(people):
    dom = census_domain(4, 3)
    with pytest.raises(DataError, match="'sex'"):
        structural_zero_mask_of_records(people.drop(columns="sex"), dom)
    wrong = people[list(CENSUS_ATTRS)].astype(str).iloc[:5].copy()
    wrong.loc[wrong.index[2], "age_group"] = "70-74"
    with pytest.raises(DataError, match="'age_group'") as hidden:  # the value only when asked (issue #24 item 6)
        structural_zero_mask_of_records(wrong, dom)
    assert "70-74" not in str(hidden.value) and HIDDEN_VALUES in str(hidden.value)
    with confidential_values_shown(), pytest.raises(DataError, match="'age_group'.*70-74"):
        structural_zero_mask_of_records(wrong, dom)
    wrong = people[list(CENSUS_ATTRS)].astype(object).iloc[:5].copy()
    wrong.loc[wrong.index[1], "county"] = None
    with pytest.raises(DataError, match="'county'"):
        structural_zero_mask_of_records(wrong, dom)
    with pytest.raises(DataError, match="DataFrame"):
        structural_zero_mask_of_records(people.to_numpy(), dom)
    other = Domain.from_dict({**census_domain(1, 1).to_dict(), "sex": ["M", "F"]})
    with pytest.raises(DomainError, match="'sex'"):
        structural_zero_rules(other)


# ---- the generated file ------------------------------------------------------------------------


def test_same_seed_same_frame_different_seed_different_frame():
    a = generate_census(5_000, seed=11)
    pd.testing.assert_frame_equal(a, generate_census(5_000, seed=11))
    b = generate_census(5_000, seed=12)
    assert not a.equals(b)
    assert not state_totals(a).equals(state_totals(b))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 100, 1_000, 12_345, 100_000])
def test_exact_row_count(n):
    df = generate_census(n, seed=n)
    assert len(df) == n
    assert list(df.columns) == list(CENSUS_ATTRS)


def test_exact_row_count_other_geography():
    df = generate_census(3_333, num_states=7, counties_per_state=1, seed=5)
    assert len(df) == 3_333
    assert list(df["state"].cat.categories) == list(census_domain(7, 1).labels["state"])


@pytest.mark.parametrize("seed, n, geo", [(0, 10_000, (4, 3)), (1, 50_000, (6, 5)), (2, 997, (2, 1))])
def test_no_record_falls_in_a_structural_zero(seed, n, geo):
    df = generate_census(n, num_states=geo[0], counties_per_state=geo[1], seed=seed)
    dom = census_domain(*geo)
    for predicate, reason in structural_zero_rules(dom):
        hits = eval_predicate(df, predicate)
        assert not hits.any(), f"{hits.sum()} records break: {reason}"
    assert not structural_zero_mask_of_records(df, dom).any()


def test_every_county_inside_its_state(people):
    parent = county_parent(census_domain(4, 3))
    assert (people["county"].astype(str).map(parent) == people["state"].astype(str)).all()


def test_columns_are_categoricals_of_the_domain(people):
    dom = census_domain(4, 3)
    for attr in CENSUS_ATTRS:
        col = people[attr]
        assert isinstance(col.dtype, pd.CategoricalDtype)
        assert tuple(col.cat.categories) == dom.labels[attr]
        assert not col.isna().any()
        assert set(col.astype(str).unique()) <= set(dom.labels[attr])


def test_households_are_coherent_units(people):
    hh = people[people["household_id"] >= 0]
    gq = people[people["household_id"] < 0]
    assert (gq["relationship"] == "group quarters").all()
    assert not (hh["relationship"] == "group quarters").any()
    n_households = hh["household_id"].nunique()
    assert (people["relationship"] == "householder").sum() == n_households
    ids = hh["household_id"].to_numpy()
    assert (np.diff(ids) >= 0).all()  # members are consecutive
    first = np.r_[True, ids[1:] != ids[:-1]]
    assert (hh["relationship"].to_numpy()[first] == "householder").all()  # householder first
    g = hh.groupby("household_id", observed=True)
    assert (g["household_type"].nunique() == 1).all()
    assert (g["county"].nunique() == 1).all()
    spouses = g["relationship"].apply(lambda r: int((r == "spouse").sum()))
    types = g["household_type"].first()
    sizes = g.size()
    assert (spouses[types == "married couple"] == 1).all()
    assert (spouses[types != "married couple"] == 0).all()
    assert (sizes[types == "alone"] == 1).all()
    assert (sizes[types.isin(["nonfamily", "other family"])] >= 2).all()


def test_plausible_shape(people):
    n = len(people)
    totals = state_totals(people)
    assert (totals > 0).all() and totals.sum() == n
    assert (people["county"].value_counts() > 0).all()
    gq_share = (people["relationship"] == "group quarters").mean()
    assert 0.02 < gq_share < 0.04  # 3 % expected; binomial sd at n = 20000 is 0.0012
    mean_size = (people["household_id"] >= 0).sum() / people["household_id"].max()
    assert 2.0 < mean_size < 3.2
    kids = people[people["relationship"] == "child"]
    assert (kids["age_group"] == "0-14").mean() > 0.4
    married = people[people["household_type"] == "married couple"]
    heads = married[married["relationship"] == "householder"]["sex"].to_numpy()
    spouses = married[married["relationship"] == "spouse"]["sex"].to_numpy()
    assert len(heads) == len(spouses) and (heads != spouses).mean() > 0.9
    codes = people["county"].cat.codes.to_numpy()
    assert (np.diff(codes) >= 0).all()  # grouped by county


@pytest.mark.parametrize("seed", range(5))
def test_state_sizes_are_uneven(seed):
    totals = state_totals(generate_census(20_000, seed=seed))
    assert totals.max() > 1.5 * totals.min()


def test_household_ids_column_is_optional():
    plain = generate_census(500, seed=4)
    with_ids = generate_census(500, seed=4, household_ids=True)
    assert "household_id" not in plain.columns
    pd.testing.assert_frame_equal(plain, with_ids[list(CENSUS_ATTRS)])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_people": -1}, "num_people"),
        ({"num_people": 10.0}, "num_people"),
        ({"num_people": True}, "num_people"),
        ({"num_people": "10"}, "num_people"),
        ({"seed": -1}, "seed"),
        ({"seed": None}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"household_ids": "yes"}, "household_ids"),
    ],
)
def test_generate_census_rejects_bad_input(kwargs, name):
    with pytest.raises(DataError, match=name):
        generate_census(**kwargs)
    with pytest.raises(DomainError, match="num_states"):
        generate_census(10, num_states=0)


def test_draw_matches_per_row_inverse_cdf():
    """The one-search categorical draw against a per-element brute force with the same uniforms."""
    probs = np.array([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    cum = census._integer_cdf(probs)
    assert cum[:, -1].tolist() == [1 << 32] * 3
    rows = np.random.Generator(np.random.PCG64(1)).integers(0, 3, size=3000)
    got = census._draw(np.random.Generator(np.random.PCG64(2)), cum, rows, 3000)
    u = np.random.Generator(np.random.PCG64(2)).integers(0, 1 << 32, size=3000, dtype=np.int64)
    brute = [int(np.searchsorted(cum[r], x, side="right")) for r, x in zip(rows, u)]
    np.testing.assert_array_equal(got, brute)
    assert not ((rows == 0) & ((got == 0) | (got == 3))).any()  # zero-probability labels
    assert (got[rows == 2] == 3).all()


# ---- invariants ----------------------------------------------------------------------------------


def test_state_totals_against_counting(people):
    totals = state_totals(people)
    assert totals.name == "persons" and totals.index.name == "state"
    assert list(totals.index) == ["S01", "S02", "S03", "S04"]
    for state, count in totals.items():
        assert count == int((people["state"].astype(str) == state).sum())
    text = people[["state"]].astype(str)
    pd.testing.assert_series_equal(state_totals(text), totals)


def test_state_totals_keep_empty_states_of_the_domain():
    df = pd.DataFrame({"state": ["S02", "S02", "S04"]})
    totals = state_totals(df, census_domain(4, 1))
    assert totals.to_dict() == {"S01": 0, "S02": 2, "S03": 0, "S04": 1}
    assert state_totals(df).to_dict() == {"S02": 2, "S04": 1}


def test_state_totals_rejects_bad_records():
    with pytest.raises(DataError, match="'state'"):
        state_totals(pd.DataFrame({"county": ["S01-C1"]}))
    with pytest.raises(DataError, match="'state'") as hidden:  # the value only when asked (issue #24 item 6)
        state_totals(pd.DataFrame({"state": ["S01", "S07"]}), census_domain(4, 1))
    assert "S07" not in str(hidden.value) and HIDDEN_VALUES in str(hidden.value)
    with confidential_values_shown(), pytest.raises(DataError, match="S07"):
        state_totals(pd.DataFrame({"state": ["S01", "S07"]}), census_domain(4, 1))
    with pytest.raises(DataError, match="DataFrame"):
        state_totals(["S01"])


# ---- writing the file ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_write_example_data_round_trip(tmp_path, fmt):
    path = tmp_path / f"people.{fmt}"
    out = write_example_data(path, 2_000, 9, format=fmt)
    assert out == path and path.is_file()
    assert sorted(os.listdir(tmp_path)) == [path.name]  # no temporary file left
    back = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    expected = generate_census(2_000, seed=9)
    assert list(back.columns) == list(CENSUS_ATTRS)
    pd.testing.assert_frame_equal(
        back.astype(str), expected.astype(str), check_dtype=False
    )
    assert not structural_zero_mask_of_records(back).any()


def test_write_example_data_replaces_an_existing_file(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text("old\n")
    write_example_data(path, 50, 1)
    assert len(pd.read_csv(path)) == 50
    assert os.listdir(tmp_path) == ["people.csv"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-dir" / "people.csv"
    with pytest.raises(DataError, match="no-such-dir"):
        write_example_data(missing, 100, 0)
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="format"):
        write_example_data(tmp_path / "people.xlsx", 100, 0, format="xlsx")
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="directory"):
        write_example_data(tmp_path, 100, 0)

    # A write that breaks half-way keeps the old file and removes its temporary file.
    path = tmp_path / "people.csv"
    path.write_text("old\n")

    def broken_to_csv(self, fh, **kwargs):
        fh.write(b"state,county\nS01,")
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken_to_csv)
    with pytest.raises(OSError, match="disk full"):
        write_example_data(path, 100, 0)
    assert os.listdir(tmp_path) == ["people.csv"]
    assert path.read_text() == "old\n"
