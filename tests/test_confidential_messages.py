"""No confidential value in any message unless asked, and no row count ever (issue #24 item 6).

Every error path (and warning) that touches the data is driven with data whose counts are
distinctive (419, 115 and 66 rows, 600 in all) and whose offending values are distinctive
words; each message is grepped for those counts and words. By default neither may appear;
with ``show_confidential=True`` (``--show-confidential``) the values may, the counts still not.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.errors import DataError, DataWarning, DpoptError, confidential_values_shown
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.release import plan, run
from dpopt.release.pipeline import load_data

#: Row counts drawn from the data (and their total): none may appear in any message.
COUNTS = (419, 115, 66, 600, 534, 181)
#: Offending values in the data: none may appear unless the user asks.
VALUES = ("Zorblax", "Quimby", "Vexil")
DOMAIN = Domain.from_dict({"kind": ["alpha", "beta"], "grp": 3})


def _column(values=VALUES) -> list:
    """600 rows: 419, 115 and 66 of three values."""
    return [values[0]] * 419 + [values[1]] * 115 + [values[2]] * 66


def _frame(kind=None, grp=None) -> pd.DataFrame:
    return pd.DataFrame({"kind": kind if kind is not None else ["alpha"] * 419 + ["beta"] * 181,
                         "grp": grp if grp is not None else [0] * 419 + [1] * 115 + [2] * 66})


def _leaks(text: str, tmp=None) -> list[str]:
    """The counts and values a message gives away (paths under ``tmp`` are not the message's content)."""
    if tmp is not None:
        text = text.replace(str(tmp), "<tmp>")
    found = [str(n) for n in COUNTS if re.search(rf"(?<![\d.]){n}(?![\d.])", text)]
    return found + [v for v in VALUES if v in text]


def _counts_in(text: str, tmp=None) -> list[str]:
    return [x for x in _leaks(text, tmp) if x not in VALUES]


def _error(call, tmp=None, **kwargs) -> str:
    with pytest.raises(DpoptError) as info:
        call(**kwargs)
    return str(info.value)


SPEC = {
    "name": "secret",
    "domain": {"attributes": {"kind": ["alpha", "beta"], "grp": 3}},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "measure": [{"query": "marginal", "attrs": ["kind"], "mechanism": "laplace", "share": 1}],
    "constraints": {"nonnegative": True},
    "output": {"synthetic": False, "plots": False},
}


def _spec(**constraints) -> dict:
    return {**SPEC, "constraints": {**SPEC["constraints"], **constraints}}


# ---- the readers: every data error, through the Python API and the CLI ------------------------------------------
def _frames() -> dict:
    """One frame per data error of the readers."""
    ambiguous = pd.DataFrame({"kind": ["alpha"] * 600, "grp": [0] * 600})
    return {
        "labels outside the domain": _frame(kind=_column()),
        "codes outside the domain": _frame(grp=_column((7, 8, 9))),
        "missing values": _frame(kind=["alpha"] * 419 + [None] * 181),
        "negative counts": _frame().assign(count=[-5] * 419 + [1] * 181),
        "non-integer counts": _frame().assign(count=[2.5] * 115 + [1] * 485),
        "missing counts": _frame().assign(count=[np.nan] * 66 + [1] * 534),
        "ambiguous number": ambiguous.assign(kind=[1.0] * 600),
    }


@pytest.mark.parametrize("case", list(_frames()))
def test_reader_errors_hold_no_count_and_values_only_when_asked(case):
    frame = _frames()[case]
    domain = Domain.from_dict({"kind": ["1", "alpha"], "grp": 3}) if case == "ambiguous number" else DOMAIN
    weight = {"weight_column": "count"} if "count" in frame.columns else {}
    hidden = _error(Dataset.from_frame, frame=frame, domain=domain, **weight)
    assert not _leaks(hidden), (case, hidden)
    assert "confidential" in hidden or case == "missing values" or case == "missing counts", hidden
    shown = _error(Dataset.from_frame, frame=frame, domain=domain, show_confidential=True, **weight)
    assert not _counts_in(shown), (case, shown)
    if case == "labels outside the domain":
        assert all(v in shown for v in VALUES) and "'Quimby', 'Vexil', 'Zorblax'" in shown  # sorted, not by count
    if case == "codes outside the domain":
        assert "'7', '8', '9'" in shown
    if case.endswith("counts") and case != "missing counts":
        assert ("'-5'" in shown) if case == "negative counts" else ("'2.5'" in shown), shown
        assert "'-5'" not in hidden and "'2.5'" not in hidden


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_files_read_by_the_cli_and_run_keep_values_back_unless_asked(tmp_path, capsys, fmt):
    path = tmp_path / f"people.{fmt}"
    frame = _frame(kind=_column())
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "secret"\n[domain.attributes]\nkind = ["alpha", "beta"]\ngrp = 3\n'
                    '[privacy]\naccounting = "pure"\nepsilon = 1\n[[measure]]\nquery = "marginal"\n'
                    'attrs = ["kind"]\nmechanism = "laplace"\nshare = 1\n[output]\nsynthetic = false\nplots = false\n')
    for flag in ([], ["--show-confidential"]):
        assert main(["run", str(spec), "--data", str(path), "--out", str(tmp_path / "out"), *flag]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "column 'kind' holds values outside the domain" in err, err
        assert not _counts_in(err, tmp_path), err
        assert all(v in err for v in VALUES) == bool(flag), err
    assert not (tmp_path / "out").exists()
    hidden = _error(run, spec=SPEC, data=path)
    assert not _leaks(hidden, tmp_path), hidden
    shown = _error(run, spec=SPEC, data=path, show_confidential=True)
    assert "'Zorblax'" in shown and not _counts_in(shown, tmp_path)


def test_bytes_that_are_not_text_are_not_quoted(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"kind,grp\n" + b"alpha,0\n" * 419 + "Zorblax\u00e9,1\n".encode("latin-1"))
    hidden = _error(run, spec=SPEC, data=path)
    assert "is not utf-8 text" in hidden and "Zorblax" not in hidden and "\\xe9" not in hidden, hidden
    assert not _counts_in(hidden, tmp_path)


# ---- after reading: structural zeros, geography, invariants from the data, warnings ------------------------------
def test_records_in_structural_zero_cells_name_the_rule_not_the_count():
    spec = _spec(structural_zeros=[{"where": "grp == 2", "name": "no group two"}])
    message = _error(run, spec=spec, data=_frame())
    assert "'structural_zero:no group two'" in message and not _leaks(message), message
    assert not _counts_in(_error(run, spec=spec, data=_frame(), show_confidential=True))


def test_invariants_from_the_data_that_contradict_public_constraints_keep_their_values_back():
    spec = _spec(invariants=[{"name": "total", "query": "total", "from_data": True}],
                 inequalities=[{"name": "cap", "query": "total", "upper": 100}])
    message = _error(run, spec=spec, data=_frame())
    assert "cannot all hold" in message and not _leaks(message), message


def test_records_that_do_not_nest_in_the_geography_keep_their_units_back():
    from dpopt.datasets.census import census_domain, generate_census
    from dpopt.model.geography import Geography

    domain = census_domain(2, 2)
    frame = generate_census(600, num_states=2, counties_per_state=2, seed=1).astype(str)
    frame.loc[:418, "state"], frame.loc[:418, "county"] = "S02", "S01-C1"
    geography = Geography.from_columns(domain, ["state", "county"], parents="separator")
    data = Dataset.from_frame(frame, domain)
    hidden = _error(geography.leaf_histograms, data=data)
    assert "do not nest" in hidden and not _counts_in(hidden) and "S01-C1" not in hidden, hidden
    with confidential_values_shown():
        shown = _error(geography.leaf_histograms, data=data)
    assert "S01-C1" in shown and not _counts_in(shown), shown


def test_the_topdown_reader_and_the_census_helpers_keep_values_back(tmp_path):
    from dpopt.algorithms.topdown.readers import read_unit_counts
    from dpopt.datasets.census import census_domain, generate_census, state_totals, structural_zero_mask_of_records
    from dpopt.model.geography import Geography

    domain = census_domain(2, 2)
    frame = generate_census(600, num_states=2, counties_per_state=2, seed=1).astype(str)
    frame.loc[:418, "sex"] = "Zorblax"
    path = tmp_path / "people.csv"
    frame.to_csv(path, index=False)
    geography = Geography.from_columns(domain, ["state", "county"], parents="separator")
    for call in (lambda: read_unit_counts(path, geography, domain),
                 lambda: structural_zero_mask_of_records(frame, domain)):
        with pytest.raises(DataError) as info:
            call()
        assert "'sex'" in str(info.value) and not _leaks(str(info.value), tmp_path), str(info.value)
    frame.loc[:418, "state"] = "Quimby"
    with pytest.raises(DataError) as info:
        state_totals(frame, domain)
    assert not _leaks(str(info.value)), str(info.value)


def test_codes_checked_by_predicates_and_the_binary_encoding_keep_values_back():
    from dpopt.model.predicates import Predicate
    from dpopt.model.queries.binary import binary_encoding

    codes = np.array([[0, 77]] * 419 + [[0, 0]] * 181)
    encoding = binary_encoding(DOMAIN)
    bits = np.array([[0, 1, 1]] * 419 + [[0, 0, 0]] * 181)  # grp's unused code 3
    for call in (lambda: Predicate.parse("grp == 1").evaluate(codes, DOMAIN),
                 lambda: Dataset(codes, DOMAIN),
                 lambda: encoding.encode_codes(codes),
                 lambda: encoding.decode_codes(bits)):
        with pytest.raises(DataError) as info:
            call()
        message = str(info.value)
        assert "'grp'" in message and not _leaks(message) and "77" not in message and "code 3" not in message, message
        with confidential_values_shown(), pytest.raises(DataError) as info:
            call()
        assert not _counts_in(str(info.value)) and ("'77'" in str(info.value) or "'3'" in str(info.value))


def test_warnings_before_spending_compare_with_the_count_but_never_state_it():
    p = plan({**SPEC, "privacy": {"accounting": "pure", "epsilon": 1e-4}}, data=_frame())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_data(p)
    messages = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert len(messages) == 1 and "exceeds the number of records" in messages[0], messages
    assert not _leaks(messages[0]), messages[0]
