"""Release specs: parsing, validation messages that name the key (and line), line numbers."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import pytest

from dpopt.errors import InconsistentConstraintsError, SpecError
from dpopt.release import plan
from dpopt.spec import (
    all_section_keys,
    format_path,
    key_lines,
    list_models,
    load_spec,
    parse_spec_text,
    resolve_spec_path,
)

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "models" / "quickstart.toml"
SHARED = REPO.parent / "shared" / "data"


def small_spec(**changes) -> dict:
    """A small valid spec as a dict (3 x 2 x 4 domain, given data)."""
    spec = {
        "name": "small",
        "domain": {"attributes": {"a": ["x", "y", "z"], "b": 2, "c": 4}},
        "data": {"source": "file"},
        "privacy": {"accounting": "pure", "epsilon": 1},
        "measure": [
            {"query": "marginal", "attrs": ["a", "b"], "mechanism": "laplace", "share": 0.5},
            {"query": "marginal", "attrs": ["c"], "mechanism": "laplace", "share": 0.5},
        ],
        "constraints": {"nonnegative": True, "integer": True},
    }
    for dotted, value in changes.items():
        node = spec
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node.setdefault(k, {})
        node[keys[-1]] = value
    return spec


# ---- loading -----------------------------------------------------------------------------------


def test_quickstart_loads_with_exact_shares():
    spec = load_spec(QUICKSTART)
    assert spec.name == "quickstart"
    assert spec.domain.builtin == "census"
    assert spec.privacy.accounting == "pure" and spec.privacy.epsilon == 1
    assert sum(m.share for m in spec.measures) == 1
    assert [m.share for m in spec.measures] == [Fraction(7, 20), Fraction(1, 4), Fraction(3, 10), Fraction(1, 10)]
    assert spec.constraints.nonnegative and spec.constraints.integer
    assert spec.data_invariants and spec.data_invariants[0].name == "state totals"


def test_builtin_name_resolves_to_models_dir():
    assert resolve_spec_path("quickstart") == REPO / "models" / "quickstart.toml"
    assert "quickstart" in [p.stem for p in list_models()]
    with pytest.raises(SpecError, match="no-such-spec"):
        resolve_spec_path("no-such-spec")


@pytest.mark.parametrize("path", sorted((REPO / "models").glob("*.toml")), ids=lambda p: p.stem)
def test_every_builtin_spec_loads_and_plans_without_data(path):
    spec = load_spec(path)
    data = None
    if spec.data.source == "file" and spec.data.path is None:
        prefix = spec.name.split('_')[0]  # czech_barak reads czech.csv, kdd99_dualquery kdd99_dq.csv.gz
        candidates = sorted(SHARED.glob(f"{prefix}.csv")) or sorted(SHARED.glob(f"{prefix}*.csv*"))
        if not candidates:
            pytest.skip(f"no {prefix} data in {SHARED}")
        data = candidates[0]
    p = plan(spec, data=data)
    if p.measures:  # algorithm specs (barak, mwem) spend the budget themselves
        assert sum(m.share for m in p.measures) == 1
    assert p.describe().startswith(f"release {spec.name!r}")


def test_float_shares_are_read_as_decimals():
    # 0.1 + 0.2 + 0.7 != 1 in floating point, but the decimals sum to exactly 1.
    spec = small_spec()
    spec["measure"] = [dict(spec["measure"][1], share=s, label=f"m{i}") for i, s in enumerate((0.1, 0.2, 0.7))]
    assert sum(m.share for m in load_spec(spec).measures) == 1
    spec["measure"] = [dict(spec["measure"][1], share="1/3", label=f"m{i}") for i in range(3)]
    assert [m.share for m in load_spec(spec).measures] == [Fraction(1, 3)] * 3
    spec["measure"] = [dict(spec["measure"][1], share=0.333, label=f"m{i}") for i in range(3)]
    with pytest.raises(SpecError, match=r"measure\[\*\]\.share.*999/1000"):
        load_spec(spec)


def test_dict_spec_errors_name_the_key_without_a_line():
    with pytest.raises(SpecError) as err:
        load_spec(small_spec(privacy__epsilon="lots"))
    msg = str(err.value)
    assert "key 'privacy.epsilon'" in msg and "line" not in msg


# ---- every bad-input class -----------------------------------------------------------------------

BAD = [
    ("unknown top-level", {"extras": {}}, "key 'extras'", "unknown key"),
    ("unknown section key", {"privacy__epsllon": 1}, "key 'privacy.epsllon'", "did you mean 'epsilon'"),
    ("unknown measure key", {"measure__1__shares": 1}, "key 'measure[2].shares'", "unknown key"),
    ("wrong type int", {"constraints__nonnegative": "yes"}, "key 'constraints.nonnegative'", "true or false"),
    ("wrong type share", {"measure__0__share": [0.5]}, "key 'measure[1].share'", "number"),
    ("bool is not int", {"privacy__seed": True}, "key 'privacy.seed'", "integer"),
    ("negative epsilon", {"privacy__epsilon": -1}, "key 'privacy.epsilon'", "> 0"),
    ("delta under pure", {"privacy__delta": 1e-6}, "key 'privacy.delta'", "does not apply"),
    ("unknown accounting", {"privacy__accounting": "renyi"}, "key 'privacy.accounting'", "choose one of"),
    ("gaussian under pure", {"measure__0__mechanism": "gaussian"}, "key 'measure[1].mechanism'", "not pure-DP"),
    ("unknown query", {"measure__0__query": "cube"}, "key 'measure[1].query'", "choose one of"),
    ("param of other kind", {"measure__0__k": 2}, "key 'measure[1].k'", "does not apply to query = 'marginal'"),
    ("shares do not sum", {"measure__1__share": 0.4}, "measure[*].share", "sum to 9/10"),
    ("duplicate label", {"measure__0__label": "x", "measure__1__label": "x"}, "key 'measure[2].label'", "already used"),
    ("unknown objective", {"reconstruct": {"objective": "l3"}}, "key 'reconstruct.objective'", "l2"),
    ("unknown backend", {"reconstruct": {"backend": "gurobi"}}, "key 'reconstruct.backend'", "installed backends"),
    ("backend of other objective", {"reconstruct": {"objective": "entropy", "backend": "highs"}},
     "key 'reconstruct.backend'", "'mw'"),
    ("example data need census", {"data__source": "example"}, "key 'data.source'", "census"),
    ("synthetic without integer", {"constraints__integer": False, "output": {"synthetic": True}},
     "key 'output.synthetic'", "integer"),
    ("invariant without values", {"constraints__invariants": [{"query": "total"}]},
     "key 'constraints.invariants[1]'", "from_data"),
    ("zero rule without where", {"constraints__structural_zeros": [{"reason": "r"}]},
     "key 'constraints.structural_zeros[1].where'", "missing required key"),
    ("domain twice", {"domain__builtin": "census"}, "key 'domain'", "exactly one"),
    ("bad size", {"domain__attributes__b": 0}, "key 'domain.attributes.b'", "size"),
    ("missing privacy", {"privacy": None}, "key 'privacy'", "missing required key"),
    ("missing share", {"measure__1__share": None}, "key 'measure[2].share'", "missing required key"),
]


@pytest.mark.parametrize("name, changes, key, words", BAD, ids=[b[0] for b in BAD])
def test_bad_specs_name_the_key(name, changes, key, words):
    spec = small_spec(**changes)
    if spec.get("privacy", 1) is None:
        del spec["privacy"]
    if spec["measure"][1].get("share", 1) is None:
        del spec["measure"][1]["share"]
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    msg = str(err.value)
    assert key in msg, msg
    assert words in msg, msg
    assert "\n" not in msg


def test_unknown_backend_lists_the_installed_ones():
    from dpopt.estimate import installed_backends

    with pytest.raises(SpecError) as err:
        load_spec(small_spec(reconstruct={"backend": "gurobi"}))
    for name in installed_backends():
        assert repr(name) in str(err.value)


def test_public_conflicting_constraints_are_found_at_plan_time():
    spec = small_spec()
    spec["constraints"]["invariants"] = [
        {"name": "everyone", "query": "total", "values": [10]},
        {"name": "by c", "query": "marginal", "attrs": ["c"], "values": [1, 2, 3, 5]},
    ]
    with pytest.raises(InconsistentConstraintsError) as err:
        plan(spec, data=_tiny_frame())
    msg = str(err.value)
    assert "key 'constraints'" in msg and "everyone" in msg and "by c" in msg
    assert "before reading any data" in msg


def test_bad_predicate_names_the_where_key():
    spec = small_spec(constraints__structural_zeros=[{"where": "a == 'nope'", "reason": "r"}])
    with pytest.raises(SpecError) as err:
        plan(spec, data=_tiny_frame())
    assert "key 'constraints.structural_zeros[1].where'" in str(err.value)


def test_unknown_attribute_names_the_attrs_key():
    spec = small_spec(measure__0__attrs=["a", "d"])
    with pytest.raises(SpecError) as err:
        plan(spec, data=_tiny_frame())
    assert "key 'measure[1].attrs'" in str(err.value) and "'d'" in str(err.value)


def test_file_source_without_path_asks_for_data():
    with pytest.raises(SpecError, match=r"key 'data.path'.*--data"):
        plan(small_spec())


def _tiny_frame():
    import pandas as pd

    return pd.DataFrame({"a": ["x", "y", "z", "x"], "b": [0, 1, 0, 1], "c": [0, 1, 2, 3]})


# ---- TOML line numbers ---------------------------------------------------------------------------


TOML = """\
name = "x"  # a comment with = and [brackets]
[domain]
builtin = "census"

[[measure]]
query = "marginal"
attrs = ["a", "b"]

[[measure]]
"share" = 0.5
label = 'lit#eral'
[constraints]
structural_zeros = [
  { where = "relationship in ['householder', 'spouse'] and x == '#{'", reason = "r" },
  { builtin = true },
]
[domain.attributes]
a.b = 3
s = \"\"\"multi
line = 3 [not a key]
\"\"\"
z = 1
"""


def test_key_lines_follow_tables_arrays_and_inline_tables():
    lines = key_lines(TOML)
    assert lines[("name",)] == 1
    assert lines[("domain", "builtin")] == 3
    assert lines[("measure", 0, "attrs")] == 7
    assert lines[("measure", 1, "share")] == 10
    assert lines[("measure", 1, "label")] == 11
    assert lines[("constraints", "structural_zeros", 0, "reason")] == 14
    assert lines[("constraints", "structural_zeros", 1, "builtin")] == 15
    assert lines[("domain", "attributes", "a", "b")] == 18
    assert lines[("domain", "attributes", "z")] == 22
    assert ("domain", "attributes", "line") not in lines


def test_file_errors_carry_the_line(tmp_path):
    text = QUICKSTART.read_text().replace('label = "county x household_type"', 'lable = "county x household_type"')
    path = tmp_path / "bad.toml"
    path.write_text(text)
    expected = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("lable"))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert f"spec {path}, line {expected}, key 'measure[4].lable'" in str(err.value)


def test_invalid_toml_is_a_spec_error(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[privacy\naccounting = 'pure'\n")
    with pytest.raises(SpecError, match=r"broken.toml: invalid TOML.*line 1"):
        load_spec(path)


def test_format_path_counts_entries_from_one():
    assert format_path(("measure", 1, "share")) == "measure[2].share"
    assert format_path(("constraints", "invariants", 0)) == "constraints.invariants[1]"


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "people.csv").write_text("a,b,c\nx,0,0\n")
    text = (
        '[domain.attributes]\na = ["x", "y"]\nb = 2\nc = 2\n[data]\npath = "people.csv"\n'
        '[privacy]\naccounting = "pure"\nepsilon = 1\n'
        '[[measure]]\nquery = "total"\nmechanism = "laplace"\nshare = 1\n'
    )
    spec = parse_spec_text(text, source=tmp_path / "sub" / "s.toml")
    assert spec.data.path == (tmp_path / "sub" / "people.csv").resolve()
    assert spec.data.format == "csv"


def test_section_keys_cover_the_quickstart():
    spec = load_spec(QUICKSTART)
    for section, table in spec.raw.items():
        if isinstance(table, dict):
            assert set(table) <= set(all_section_keys()[section])


def test_load_spec_is_idempotent_and_does_not_mutate():
    raw = small_spec()
    before = copy.deepcopy(raw)
    spec = load_spec(raw)
    assert load_spec(spec) is spec
    assert raw == before
