"""The geography model: every way of declaring a hierarchy, its validation, and unit histograms by group-by."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.datasets.census import census_domain, county_parent, generate_census
from dpopt.errors import DataError, DomainError, confidential_values_shown
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography


def census_geography(states=3, counties=2):
    domain = census_domain(states, counties)
    return domain, Geography.from_columns(domain, ["state", "county"], parents="separator")


def test_separator_labels_name_the_parents():
    domain, geo = census_geography(3, 2)
    assert geo.names == ("nation", "state", "county")
    assert geo.sizes == (1, 3, 6)
    parent = county_parent(domain)
    for i, county in enumerate(geo.units[2]):
        assert geo.units[1][geo.parents[2][i]] == parent[county]
    assert geo.attrs == ("state", "county")
    assert "county (6; 2-2 per state)" in geo.describe()
    order, starts = geo.children(1)
    assert [list(geo.units[2][order[starts[p]:starts[p + 1]]]) for p in range(3)] == \
        [[f"S0{s}-C1", f"S0{s}-C2"] for s in (1, 2, 3)]


def test_nested_codes_make_every_combination_a_unit():
    domain = Domain.from_dict({"a": 2, "b": 3, "c": 2})
    geo = Geography.from_columns(domain, ["a", "b"], parents="nested", root="top")
    assert geo.sizes == (1, 2, 6)
    assert list(geo.units[2]) == ["0/0", "0/1", "0/2", "1/0", "1/1", "1/2"]
    assert list(geo.parents[2]) == [0, 0, 0, 1, 1, 1]
    codes = np.array([[1, 2, 0], [0, 1, 1]])
    assert list(geo.leaf_of_records(codes, domain)) == [5, 1]


def test_parent_tables_and_their_errors():
    domain = Domain.from_dict({"state": ["A", "B"], "county": ["x", "y", "z"], "sex": 2})
    geo = Geography.from_columns(domain, ["state", "county"], parents=[{"x": "A", "y": "B", "z": "B"}])
    assert list(geo.parents[2]) == [0, 1, 1]
    with pytest.raises(DomainError, match="unit 'z' of level 'county' has no parent"):
        Geography.from_columns(domain, ["state", "county"], parents=[{"x": "A", "y": "B"}])
    with pytest.raises(DomainError, match="names parent 'C', which is not a unit of level 'state'"):
        Geography.from_columns(domain, ["state", "county"], parents=[{"x": "A", "y": "B", "z": "C"}])
    with pytest.raises(DomainError, match="names 'w', which is not a value of 'county'"):
        Geography.from_columns(domain, ["state", "county"], parents=[{"x": "A", "y": "B", "z": "B", "w": "A"}])
    with pytest.raises(DomainError, match="unit 'A' of level 'state' has no child in level 'county'"):
        Geography.from_columns(domain, ["state", "county"], parents=[{"x": "B", "y": "B", "z": "B"}])


def test_separator_errors_name_the_unit():
    domain = Domain.from_dict({"state": ["S1", "S2"], "county": ["S1-a", "S3-b", "nodash"], "x": 2})
    with pytest.raises(DomainError, match="unit 'S3-b' of level 'county' names parent 'S3'"):
        Geography.from_columns(domain, ["state", "county"])
    domain = Domain.from_dict({"state": ["S1"], "county": ["S1-a", "nodash"], "x": 2})
    with pytest.raises(DomainError, match="'nodash' of level 'county' has no '-'"):
        Geography.from_columns(domain, ["state", "county"])


def test_code_prefixes_name_the_ancestors():
    tracts = ["01001000100", "01001000200", "01003000100", "02005000100"]
    domain = Domain.from_dict({"tract": tracts, "sex": ["F", "M"]})
    geo = Geography.from_code(domain, "tract", [2, 5, 11], ["state", "county", "tract"])
    assert geo.sizes == (1, 2, 3, 4)
    assert list(geo.units[1]) == ["01", "02"] and list(geo.units[2]) == ["01001", "01003", "02005"]
    assert list(geo.parents[3]) == [0, 0, 1, 2] and list(geo.parents[2]) == [0, 0, 1]
    with pytest.raises(DomainError, match="code '0100' of 'tract' has 4 characters, not the 11"):
        Geography.from_code(Domain.from_dict({"tract": ["0100", "01001000100"], "x": 2}), "tract", [2, 5, 11],
                            ["state", "county", "tract"])
    with pytest.raises(DomainError, match="positive and increasing"):
        Geography.from_code(domain, "tract", [5, 2, 11], ["state", "county", "tract"])


def test_code_leaves_follow_sorted_codes_whatever_the_label_order():
    domain = Domain.from_dict({"tract": ["02005000100", "01001000100"], "sex": 2})
    geo = Geography.from_code(domain, "tract", [2, 11], ["state", "tract"])
    assert list(geo.units[2]) == ["01001000100", "02005000100"]
    assert list(geo.leaf_codes[:, 0]) == [1, 0]  # the leaf "01001000100" is label code 1
    assert list(geo.leaf_of_records(np.array([[0, 1], [1, 0]]), domain)) == [1, 0]


def test_crosswalk_table_and_its_errors():
    table = pd.DataFrame({"state": ["A", "A", "B"], "county": ["x", "y", "z"], "tract": ["1", "2", "3"]})
    geo = Geography.from_table(table, ["state", "county", "tract"])
    assert geo.sizes == (1, 2, 3, 3)
    assert geo.frame().to_dict("list")["county"] == ["x", "y", "z"]
    twice = pd.DataFrame({"state": ["A", "B"], "county": ["x", "x"], "tract": ["1", "2"]})
    with pytest.raises(DomainError, match="unit 'x' of level 'county' has two parents"):
        Geography.from_table(twice, ["state", "county", "tract"])
    dup = pd.DataFrame({"state": ["A", "A"], "county": ["x", "x"], "tract": ["1", "1"]})
    with pytest.raises(DomainError, match="leaf '1' of level 'tract' is on two rows"):
        Geography.from_table(dup, ["state", "county", "tract"])
    with pytest.raises(DomainError, match=r"columns \['tract'\] are missing"):
        Geography.from_table(table[["state", "county"]], ["state", "county", "tract"])
    holes = table.assign(county=[None, "y", "z"])
    with pytest.raises(DomainError, match="column 'county' has 1 empty entries"):
        Geography.from_table(holes, ["state", "county", "tract"])


def test_crosswalk_binds_to_the_domain():
    domain = Domain.from_dict({"county": ["z", "x", "y"], "age": 3})
    table = pd.DataFrame({"state": ["A", "A", "B"], "county": ["x", "y", "z"]})
    geo = Geography.from_table(table, ["state", "county"], domain=domain)
    assert geo.attrs == ("county",)
    assert list(geo.leaf_codes[:, 0]) == [1, 2, 0]  # leaves x, y, z are codes 1, 2, 0 of the domain
    with pytest.raises(DomainError, match="value 'w' of attribute 'county' is not a unit"):
        Geography.from_table(table, ["state", "county"], domain=Domain.from_dict({"county": ["x", "w"], "a": 2}))


def test_edge_lists_refuse_cycles_roots_and_ragged_depth():
    edges = pd.DataFrame({"unit": ["US", "A", "B", "a1", "b1"], "parent": [None, "US", "US", "A", "B"]})
    geo = Geography.from_edges(edges, ["nation", "state", "county"])
    assert geo.sizes == (1, 2, 2) and list(geo.parents[2]) == [0, 1]
    cycle = pd.DataFrame({"unit": ["US", "A", "B", "C"], "parent": [None, "US", "C", "B"]})
    with pytest.raises(DomainError, match="lies on a cycle"):
        Geography.from_edges(cycle, ["nation", "state", "county"])
    two_roots = pd.DataFrame({"unit": ["US", "CA"], "parent": [None, None]})
    with pytest.raises(DomainError, match="exactly one unit must have no parent"):
        Geography.from_edges(two_roots, ["nation", "state"])
    ragged = pd.DataFrame({"unit": ["US", "A", "B", "a1"], "parent": [None, "US", "US", "A"]})
    with pytest.raises(DomainError, match="'B' is a leaf at level 'state'"):
        Geography.from_edges(ragged, ["nation", "state", "county"])
    orphan = pd.DataFrame({"unit": ["US", "A"], "parent": [None, "X"]})
    with pytest.raises(DomainError, match="names parent 'X', which is not a unit"):
        Geography.from_edges(orphan, ["nation", "state"])
    twice = pd.DataFrame({"unit": ["US", "A", "A"], "parent": [None, "US", "US"]})
    with pytest.raises(DomainError, match="unit 'A' is listed twice"):
        Geography.from_edges(twice, ["nation", "state"])


def test_constructor_validation():
    with pytest.raises(DomainError, match="root level 'n' must hold exactly one unit"):
        Geography(("n", "s"), (["a", "b"], ["x"]), ([-1, -1], [0]))
    with pytest.raises(DomainError, match="unit 'x' appears twice in level 's'"):
        Geography(("n", "s"), (["n"], ["x", "x"]), ([-1], [0, 0]))
    with pytest.raises(DomainError, match="at least two levels"):
        Geography(("n",), (["n"],), ([-1],))
    with pytest.raises(DomainError, match="level name 'n' is used twice"):
        Geography(("n", "n"), (["n"], ["x"]), ([-1], [0]))


def test_unit_histograms_match_a_pandas_group_by():
    domain, geo = census_geography(3, 4)
    frame = generate_census(3000, num_states=3, counties_per_state=4, seed=5)
    data = Dataset.from_frame(frame, domain)
    hist = geo.leaf_histograms(data)
    chars = geo.characteristics(domain)
    assert chars.attrs == ("age_group", "sex", "relationship", "household_type")
    expected = frame.groupby(["county", *chars.attrs], observed=True).size()
    assert hist.sum() == 3000 and hist.nnz == len(expected)
    county_row = {c: i for i, c in enumerate(geo.units[2])}
    for (county, *values), n in expected.items():
        cell = chars.cell_index({a: chars.code_of(a, v) for a, v in zip(chars.attrs, values)})
        assert hist[county_row[county], cell] == n
    levels = geo.level_histograms(hist)
    state = frame.groupby("state", observed=True).size()
    assert [int(levels[1][i].sum()) for i in range(3)] == [int(state[s]) for s in geo.units[1]]
    assert int(levels[0].sum()) == 3000


def test_empty_units_cost_nothing():
    domain = Domain.from_dict({"unit": 1000, "x": 4})
    geo = Geography.from_columns(domain, ["unit"], parents="nested")
    data = Dataset(np.array([[3, 1], [3, 1], [997, 0]]), domain)
    hist = geo.leaf_histograms(data)
    assert hist.shape == (1000, 4) and hist.nnz == 2 and hist[3, 1] == 2


def test_records_that_do_not_nest_are_refused_naming_the_columns():
    domain, geo = census_geography(2, 2)
    frame = generate_census(200, num_states=2, counties_per_state=2, seed=1)
    frame.loc[:4, "state"] = "S02"
    frame.loc[:4, "county"] = "S01-C1"
    data = Dataset.from_frame(frame, domain)
    with pytest.raises(DataError, match=r"^geography: records name units that do not nest .* \(the values are confidential"):
        geo.leaf_histograms(data)
    with confidential_values_shown(), pytest.raises(DataError, match=r"state 'S02', county 'S01-C1'") as info:
        geo.leaf_histograms(data)
    assert "5" not in str(info.value)  # the row count is never said


def test_offsets_place_every_leaf_cell_in_the_full_domain():
    domain = Domain.from_dict({"x": 2, "state": ["A", "B"], "y": 3, "county": ["A-1", "B-1", "B-2"]})
    geo = Geography.from_columns(domain, ["state", "county"])
    leaf_offset, cell_offset = geo.offsets(domain)
    chars = geo.characteristics(domain)
    for leaf in range(3):
        for cell in range(chars.size):
            c = chars.cell_values(cell)
            codes = {"state": geo.leaf_codes[leaf, 0], "county": geo.leaf_codes[leaf, 1], **c}
            assert leaf_offset[leaf] + cell_offset[cell] == domain.cell_index(codes)


@st.composite
def trees(draw):
    depth = draw(st.integers(1, 3))
    fan = [draw(st.integers(1, 4)) for _ in range(depth)]
    rows = []

    def walk(prefix, k):
        if k == depth:
            rows.append(prefix)
            return
        for i in range(draw(st.integers(1, fan[k]))):
            walk(prefix + [f"{'/'.join(prefix)}.{i}" if prefix else str(i)], k + 1)

    walk([], 0)
    return pd.DataFrame(rows, columns=[f"l{k}" for k in range(depth)])


@settings(max_examples=40, deadline=None)
@given(trees())
def test_tables_edges_and_aggregation_agree(table):
    levels = list(table.columns)
    geo = Geography.from_table(table, levels)
    again = Geography.from_table(geo.frame()[levels], levels)
    assert again.sizes == geo.sizes
    edges = [{"unit": "root", "parent": None}]
    for k, col in enumerate(levels):
        parent = table[levels[k - 1]] if k else pd.Series(["root"] * len(table))
        edges += [{"unit": u, "parent": p} for u, p in dict(zip(table[col], parent)).items()]
    by_edges = Geography.from_edges(pd.DataFrame(edges), ["root", *levels])
    assert by_edges.sizes == geo.sizes
    leaves = geo.sizes[-1]
    counts = sp.csr_matrix(np.arange(leaves * 3).reshape(leaves, 3))
    hist = geo.level_histograms(counts)
    for k in range(geo.depth - 1):
        # each unit's counts are the sum of its children's
        child = hist[k + 1].toarray()
        summed = np.zeros_like(hist[k].toarray())
        np.add.at(summed, geo.parents[k + 1], child)
        assert np.array_equal(summed, hist[k].toarray())
