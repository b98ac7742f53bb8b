"""Answer tables written as one long file (issue 30): ``output.marginals_layout``.

The long frame is checked against the tables it stacks (every table's rows come back, column by
column, with empty cells where a table has no such attribute); a release writes the layout its
option asks for, and the manifest, ``report.json`` and summary list exactly what was written.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from dpopt.atomic import MANIFEST_NAME, read_manifest
from dpopt.model.domain import Domain
from dpopt.release import run
from dpopt.release.outputs import MAX_TABLE_FILES, long_answers, read_released

pytestmark = pytest.mark.filterwarnings("ignore::dpopt.release.pipeline.NotPrivateWarning")

DOMAIN = Domain.from_dict({"sex": ["F", "M"], "age": 3, "region": ["N", "S", "E", "W"]})


def _tables() -> dict[str, pd.DataFrame]:
    return {
        "sex": pd.DataFrame({"sex": pd.Categorical(["F", "M"]), "count": [3, 4], "noisy": [2.5, 4.5]}),
        "age, region": pd.DataFrame({"age": np.repeat(np.arange(3), 4),
                                     "region": pd.Categorical(np.tile(["N", "S", "E", "W"], 3)),
                                     "count": np.arange(12), "noisy": np.arange(12) + 0.25}),
        "workload": pd.DataFrame({"row": ["q0", "q1"], "count": [7.5, 1.0]}),
    }


def test_the_long_frame_holds_every_table_row_for_row():
    tables = _tables()
    long = long_answers(tables, DOMAIN)
    assert list(long.columns) == ["table", "sex", "age", "region", "count", "noisy", "row"]
    assert list(long["table"].astype(str)) == [k for k, f in tables.items() for _ in range(len(f))]
    assert str(long["age"].dtype) == "Int64" and long["count"].dtype == np.float64  # ints with gaps stay ints
    for label, frame in tables.items():
        part = long[long["table"] == label].reset_index(drop=True)
        for column in long.columns[1:]:
            if column in frame.columns:
                assert part[column].astype(object).tolist() == frame[column].astype(object).tolist()
            else:
                assert part[column].isna().all()


def test_the_long_file_reads_back(tmp_path):
    long = long_answers(_tables(), DOMAIN)
    long.to_csv(tmp_path / "m.csv", index=False)
    back = read_released(tmp_path / "m.csv")
    assert back["table"].tolist() == long["table"].astype(str).tolist()
    assert back["region"].fillna("").tolist() == long["region"].fillna("").tolist()
    long.to_parquet(tmp_path / "m.parquet", index=False)
    assert read_released(tmp_path / "m.parquet")["age"].equals(long["age"])


@pytest.mark.parametrize("rows", [1, 5, 14, None])
def test_the_long_frame_in_pieces_is_the_same_frame_and_file(tmp_path, rows):
    """Pieces of whole tables, at most ``rows`` rows each (the 12-row table alone when rows < 12),
    with one set of columns and dtypes: together they are long_answers, and appended to one CSV
    or Parquet file they read back as the whole frame written at once. The text column ``row``
    is empty in every piece before the last and still typed as text there (one schema for all)."""
    from dpopt.release.outputs import _write_long_pieces, long_answer_chunks

    tables = _tables()
    whole = long_answers(tables, DOMAIN)
    pieces = list(long_answer_chunks(tables, DOMAIN, rows=rows))
    assert len(pieces) == {1: 3, 5: 3, 14: 2, None: 1}[rows]
    assert all(list(p.columns) == list(whole.columns) and p.dtypes.equals(whole.dtypes) for p in pieces)
    pd.testing.assert_frame_equal(pd.concat(pieces, ignore_index=True), whole)
    _write_long_pieces(long_answer_chunks(tables, DOMAIN, rows=rows), [tmp_path / "m.csv", tmp_path / "m.parquet"],
                       "NOT PRIVATE: test")  # both files from one pass over the pieces
    whole.to_csv(tmp_path / "w.csv", index=False)
    assert (tmp_path / "m.csv").read_text().splitlines()[1:] == (tmp_path / "w.csv").read_text().splitlines()
    back = read_released(tmp_path / "m.parquet")
    pd.testing.assert_frame_equal(back, whole.assign(table=whole["table"]), check_categorical=False)
    import pyarrow.parquet as pq

    from dpopt.release.outputs import NOT_PRIVATE_METADATA_KEY

    assert pq.read_schema(tmp_path / "m.parquet").metadata[NOT_PRIVATE_METADATA_KEY] == b"NOT PRIVATE: test"


SPEC = {
    "domain": {"attributes": {"a": 2, "b": 3, "c": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "output": {"formats": ["csv", "parquet"], "summary": ["md"], "plots": False},
}


@pytest.fixture(scope="module")
def frame():
    gen = np.random.default_rng(30)  # test input, not privacy noise
    return pd.DataFrame({"a": gen.integers(0, 2, 400), "b": gen.integers(0, 3, 400), "c": gen.integers(0, 2, 400)})


@pytest.mark.parametrize("algorithm, layout, expect", [
    ("polynomial", "auto", "long"),  # no table: one long file
    ("polynomial", "files", "files"),
    ("mwem", "auto", "files"),  # a table and few marginals: one file each
    ("mwem", "long", "long"),
])
def test_a_release_writes_the_layout_asked_and_lists_what_it_wrote(tmp_path, frame, algorithm, layout, expect):
    raw = copy.deepcopy(SPEC)
    raw["algorithm"] = algorithm
    raw[algorithm] = {"marginals": 2, "rounds": 3} if algorithm == "mwem" else {"workload": 2}
    raw["output"]["marginals_layout"] = layout
    out = tmp_path / "out"
    release = run(raw, data=frame, out=out, seed=2)
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert sorted([*read_manifest(out)["files"], MANIFEST_NAME]) == on_disk
    assert sorted(release.report["files"]) == sorted(on_disk)
    summary = (out / "summary.md").read_text()
    assert all(name in summary for name in on_disk if name != MANIFEST_NAME)
    tables = [p for p in on_disk if p.startswith("marginals")]
    if expect == "long":
        assert tables == ["marginals.csv", "marginals.parquet"]
        long = read_released(out / "marginals.parquet")
        assert sorted(set(long["table"])) == sorted(release.marginals)
        assert len(long) == sum(len(f) for f in release.marginals.values())
    else:
        assert len(tables) == 2 * len(release.marginals) and all(t.startswith("marginals/") for t in tables)
    assert len(release.marginals) <= MAX_TABLE_FILES
    if algorithm == "polynomial":  # the algorithm's Python objects are named, not printed, in report.json
        assert {"plan", "table", "evaluated"} <= set(release.report["algorithm"]["python_only"])
        assert "DataFrame" not in (out / "report.json").read_text()


def test_auto_writes_a_release_with_more_than_the_file_limit_long(tmp_path):
    """A release with a table but more answer tables than MAX_TABLE_FILES: one long file."""
    gen = np.random.default_rng(31)  # test input, not privacy noise
    names = [f"x{i}" for i in range(11)]  # 55 pair marginals
    data = pd.DataFrame({n: gen.integers(0, 2, 300) for n in names})
    raw = copy.deepcopy(SPEC)
    raw.update(algorithm="mwem", mwem={"marginals": 2, "rounds": 2})
    raw["domain"] = {"attributes": {n: 2 for n in names}}
    release = run(raw, data=data, out=tmp_path / "out", seed=3)
    assert release.table is not None and len(release.marginals) == 55 > MAX_TABLE_FILES
    assert not (tmp_path / "out" / "marginals").exists()
    assert len(read_released(tmp_path / "out" / "marginals.csv")) == sum(len(f) for f in release.marginals.values())


def test_a_bad_layout_names_the_key(frame):
    from dpopt.errors import SpecError

    raw = copy.deepcopy(SPEC)
    raw.update(algorithm="polynomial", polynomial={"workload": 2})
    raw["output"]["marginals_layout"] = "wide"
    with pytest.raises(SpecError, match="marginals_layout"):
        run(raw, data=frame)
