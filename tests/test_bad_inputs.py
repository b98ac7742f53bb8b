"""Bad input, end to end: one line, the right exit code, nothing written, no draw, no user file touched.

Every case runs ``dpopt run`` in a workspace holding the user's own files (the spec, the
confidential CSV, an unrelated document) and checks five things:

* the error is one line, ``dpopt: error: ...``, matching the expected message;
* the exit code (1 for input errors, 2 for usage errors, 128 + the signal for a signal);
* nothing was written: no output directory, no temporary directory, no stray file;
* no random word was drawn (a counting source replaces the CSPRNG), i.e. no budget was spent
  on noise, except where the failure can only be known after the noise (said per case);
* every user file is byte for byte what it was.

The second part checks that the inputs which used to be read silently wrong are now read
right (labels as labels, "NA" as a value, the reader chosen by the file), and the third
sends real signals to a ``dpopt run`` subprocess at each phase. Set
``DPOPT_BAD_INPUT_TABLE=path.md`` to write the table of every case (case, message, exit
code, leftover files, user files kept) for the closing note.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpopt.atomic import MANIFEST_NAME, OutputExistsError, clean_stale_temporaries, read_manifest
from dpopt.cli import main
from dpopt.datasets.census import census_domain, generate_census
from dpopt.errors import DataError, InconsistentConstraintsError, PrivacyParameterError
from dpopt.model.constraints import ConstraintSet, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.randomness import SecureRandom, SeededRandom
from dpopt.release import run
from dpopt.release.outputs import NOT_PRIVATE_MARKER, NOT_PRIVATE_METADATA_KEY, read_released, synthesize
from dpopt.release.pipeline import NotPrivateWarning

REPO = Path(__file__).resolve().parents[1]
ROWS: list[dict] = []  # one per case, for the closing note's table

def _base() -> str:
    """test_cli's small census spec, reading the user's file, with labelled measurements and both formats."""
    from tests.test_cli import SMALL

    text = SMALL.replace('source = "example"\nrows = 800', 'path = "people.csv"')
    text = text.replace('[[measure]]\nquery = "marginal"\nattrs = ["county", "sex"]',
                        '[[measure]]\nlabel = "county x sex"\nquery = "marginal"\nattrs = ["county", "sex"]')
    text = text.replace('[[measure]]\nquery = "marginal"\nattrs = ["age_group"',
                        '[[measure]]\nlabel = "household"\nquery = "marginal"\nattrs = ["age_group"')
    return text.replace('formats = ["csv"]', 'formats = ["csv", "parquet"]')


BASE = _base()


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# ---- the workspace: the user's own files, watched ----------------------------------------------------
class Workspace:
    """A working directory with the user's spec, data and an unrelated document."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        people = generate_census(600, num_states=2, counties_per_state=2, seed=3)
        people.to_csv(self.work / "people.csv", index=False)
        (self.work / "notes.txt").write_text("my own notes, not dpopt's\n", encoding="utf-8")
        (self.work / "spec.toml").write_text(BASE, encoding="utf-8")

    def spec(self, text: str) -> str:
        (self.work / "spec.toml").write_text(text, encoding="utf-8")
        return "spec.toml"

    def snapshot(self) -> dict[str, str]:
        """Every file and directory under the workspace root, with a digest of each file's bytes."""
        out = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "<dir>"
        return out


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the workspace root; the user's files live in work/
    workspace = Workspace(tmp_path)
    monkeypatch.chdir(workspace.work)
    return workspace


@pytest.fixture
def draws(monkeypatch):
    """Count every uniform word drawn from either random source."""
    counter = {"words": 0}
    for cls in (SecureRandom, SeededRandom):
        original = cls.words

        def counting(self, n, _original=original):
            counter["words"] += int(n)
            return _original(self, n)

        monkeypatch.setattr(cls, "words", counting)
    return counter


@pytest.fixture(scope="module", autouse=True)
def table_of_cases():
    """Write the table of every case when DPOPT_BAD_INPUT_TABLE names a file."""
    yield
    target = os.environ.get("DPOPT_BAD_INPUT_TABLE")
    if not target or not ROWS:
        return
    lines = ["| case | message (first 160 characters) | exit code | leftover files | user files kept |",
             "|---|---|---|---|---|"]
    for row in ROWS:
        message = row["message"].replace("|", "\\|")
        message = message if len(message) <= 160 else message[:157] + "..."
        lines.append(f"| {row['case']} | `{message}` | {row['code']} | {row['leftovers']} | {row['kept']} |")
    Path(target).write_text("\n".join(lines) + "\n", encoding="utf-8")


def record(case: str, message: str, code, leftovers: list[str], kept: bool) -> None:
    message = re.sub(r"/\S*?/pytest-\d+/[^/'\s]+/(work/)?", "", message)  # the test's temporary workspace
    ROWS.append({"case": case, "message": message, "code": code,
                 "leftovers": ", ".join(leftovers) if leftovers else "none", "kept": "yes" if kept else "NO"})


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotPrivateWarning)  # the CLI says it in its own line instead
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse usage errors
            status = exc.code
    return status, capsys.readouterr().err


# ---- refused inputs ---------------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    prepare: Callable[[Workspace], list[str]]  # sets the workspace up; returns the dpopt arguments
    match: str
    code: int = 1
    after_noise: bool = False  # the failure is only known once the noise is drawn (the total of a release)
    env: dict | None = None  # environment for the run
    patch: Callable | None = None  # patch(monkeypatch) before the run


def spec_case(id: str, change: Callable[[str], str], match: str, extra: tuple = (), code: int = 1) -> Case:
    return Case(id, lambda w: ["run", w.spec(change(BASE)), "--out", "release", *extra], match, code)


def _gaussian(text: str, privacy: str) -> str:
    text = edit(text, 'accounting = "pure"\nepsilon = 1', privacy)
    return text.replace('mechanism = "laplace"', 'mechanism = "gaussian"')


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def _people_with(w: Workspace, change: Callable[[pd.DataFrame], pd.DataFrame], name: str = "people.csv") -> str:
    frame = pd.read_csv(w.work / "people.csv", dtype=str, keep_default_na=False)
    changed = change(frame)
    if name.endswith(".parquet"):
        changed.to_parquet(w.work / name, index=False)
    else:
        changed.to_csv(w.work / name, index=False)
    return name


def _labelled_spec(labels: list[str], data: str = "codes.parquet") -> str:
    return f"""\
name = "labelled"
[domain.attributes]
state = {json.dumps(labels)}
sex = ["F", "M"]
[data]
path = "{data}"
[privacy]
accounting = "pure"
epsilon = 1
[[measure]]
query = "identity"
mechanism = "laplace"
share = 1
[constraints]
nonnegative = true
[output]
plots = false
"""


def _big_domain(cells_per_attr: int, attrs: int, measures: str) -> str:
    names = [f"a{i}" for i in range(attrs)]
    return ('name = "big"\n[domain.attributes]\n' + "".join(f"{a} = {cells_per_attr}\n" for a in names)
            + '[data]\npath = "tiny.csv"\n[privacy]\naccounting = "pure"\nepsilon = 1\n' + measures
            + "[constraints]\nnonnegative = true\n[output]\nplots = false\n")


def _tiny_csv(w: Workspace, attrs: int) -> None:
    _write(w.work / "tiny.csv", ",".join(f"a{i}" for i in range(attrs)) + "\n" + ",".join("0" * attrs) + "\n")


def _prepare_changed_release(w: Workspace) -> list[str]:
    assert main(["run", "spec.toml", "--out", "release", "--quiet"]) == 0
    summary = w.work / "release" / "summary.md"
    summary.write_text(summary.read_text() + "\nmy edit\n", encoding="utf-8")
    return ["run", "spec.toml", "--out", "release", "--overwrite"]


def _prepare_user_dir(w: Workspace) -> list[str]:
    _write(w.work / "release" / "mine.txt", "the user's file")
    return ["run", "spec.toml", "--out", "release", "--overwrite"]


def _prepare_release_plus_user_file(w: Workspace) -> list[str]:
    assert main(["run", "spec.toml", "--out", "release", "--quiet"]) == 0
    _write(w.work / "release" / "mine.txt", "the user's file, beside a release")
    return ["run", "spec.toml", "--out", "release", "--overwrite"]


def _prepare_spec_dir(w: Workspace) -> list[str]:
    _write(w.work / "specs" / "spec.toml", BASE.replace('path = "people.csv"', 'path = "../people.csv"'))
    return ["run", "specs/spec.toml", "--out", "specs", "--overwrite"]


def _prepare_data_ancestor(w: Workspace) -> list[str]:
    _write(w.work / "inputs" / "2020" / "people.csv", (w.work / "people.csv").read_text())
    return ["run", "spec.toml", "--data", "inputs/2020/people.csv", "--out", "inputs", "--overwrite"]


def _prepare_big(cells: int, attrs: int, measures: str):
    def prepare(w: Workspace) -> list[str]:
        _tiny_csv(w, attrs)
        return ["run", w.spec(_big_domain(cells, attrs, measures)), "--out", "release"]

    return prepare


def _data_case(name: str, change: Callable[[pd.DataFrame], pd.DataFrame], spec: Callable[[str], str] | None = None):
    """Write a changed copy of the user's data as ``name`` and run on it (``--data``, or the spec's path)."""
    def prepare(w: Workspace) -> list[str]:
        _people_with(w, change, name)
        if spec is not None:
            return ["run", w.spec(spec(BASE)), "--out", "release"]
        return ["run", "spec.toml", "--out", "release", "--data", name]

    return prepare


def _parquet_case(labels: list[str], columns: dict):
    """A two-attribute spec with ``labels`` for ``state``, on a Parquet file of ``columns``."""
    def prepare(w: Workspace) -> list[str]:
        pd.DataFrame(columns).to_parquet(w.work / "codes.parquet", index=False)
        return ["run", w.spec(_labelled_spec(labels)), "--out", "release"]

    return prepare


def _file_case(name: str, content: bytes | str):
    def prepare(w: Workspace) -> list[str]:
        _write(w.work / name, content)
        return ["run", "spec.toml", "--out", "release", "--data", name]

    return prepare


def _limit_synthetic(monkeypatch) -> None:
    import dpopt.release.outputs as outputs

    monkeypatch.setattr(outputs, "MAX_SYNTHETIC_RECORDS", 100)


_MARGINAL = '[[measure]]\nlabel = "a0 x a1"\nquery = "marginal"\nattrs = ["a0", "a1"]\nmechanism = "laplace"\nshare = 1\n'
_IDENTITY_AND_MARGINAL = ('[[measure]]\nlabel = "cells"\nquery = "identity"\nmechanism = "laplace"\nshare = 0.5\n'
                          '[[measure]]\nlabel = "a0 x a1"\nquery = "marginal"\nattrs = ["a0", "a1"]\n'
                          'mechanism = "laplace"\nshare = 0.5\n')
_L1 = '[reconstruct]\nobjective = "l1"\n'
_ZERO_RULE = ('structural_zeros = [{ builtin = true }, { name = "no girls", where = "sex == \'F\' and '
              'age_group == \'0-14\'", reason = "a made-up rule" }]')

CASES = [
    # ---- the privacy budget ------------------------------------------------------------------------------------
    spec_case("epsilon = 0", lambda t: edit(t, "epsilon = 1", "epsilon = 0"), r"key 'privacy.epsilon': must be > 0"),
    spec_case("epsilon < 0", lambda t: edit(t, "epsilon = 1", "epsilon = -1"), r"key 'privacy.epsilon': must be > 0"),
    spec_case("epsilon = inf", lambda t: edit(t, "epsilon = 1", "epsilon = inf"),
              r"key 'privacy.epsilon': must be a number .* got inf"),
    spec_case("epsilon = nan", lambda t: edit(t, "epsilon = 1", "epsilon = nan"),
              r"key 'privacy.epsilon': must be a number .* got nan"),
    spec_case("epsilon = 1e-300", lambda t: edit(t, "epsilon = 1", "epsilon = 1e-300"),
              r"key 'privacy.epsilon': must lie in \[2\^-56 \(1.39e-17\), 2\^63 \(9.22e\+18\)\], got 1e-300"),
    spec_case("epsilon = 1e-20", lambda t: edit(t, "epsilon = 1", "epsilon = 1e-20"),
              r"key 'privacy.epsilon': must lie in \[2\^-56.*got 1e-20: below 2\^-56"),
    spec_case("epsilon = \"1e400\"", lambda t: edit(t, "epsilon = 1", 'epsilon = "1e400"'),
              r"key 'privacy.epsilon': must lie in .*got 1e\+400"),
    spec_case("epsilon share below the sampler's range", lambda t: edit(t, "epsilon = 1", "epsilon = 2e-17"),
              r"key 'privacy.epsilon': measurement 'county x sex' \(share 1/4 .*above the exact sampler's limit"),
    spec_case("rho = 1e-40", lambda t: _gaussian(t, 'accounting = "zcdp"\nrho = 1e-40'),
              r"key 'privacy.rho': must lie in \[2\^-113"),
    spec_case("rho = 0", lambda t: _gaussian(t, 'accounting = "zcdp"\nrho = 0'), r"key 'privacy.rho': must be > 0"),
    spec_case("delta = 0", lambda t: _gaussian(t, 'accounting = "approx"\nepsilon = 1\ndelta = 0'),
              r"key 'privacy.delta': must be in \(0, 1\)"),
    spec_case("delta = 1", lambda t: _gaussian(t, 'accounting = "approx"\nepsilon = 1\ndelta = 1'),
              r"key 'privacy.delta': must be in \(0, 1\)"),
    spec_case("delta = 1.5", lambda t: _gaussian(t, 'accounting = "approx"\nepsilon = 1\ndelta = 1.5'),
              r"key 'privacy.delta': must be in \(0, 1\)"),
    spec_case("delta = 5e-324", lambda t: _gaussian(t, 'accounting = "approx"\nepsilon = 1\ndelta = 5e-324'),
              r"key 'privacy.delta': must lie in \[2\^-1000"),
    spec_case("shares not summing to 1", lambda t: edit(t, "share = 0.75", "share = 0.7"),
              r"key 'measure\[\*\].share': .* sum to 19/20"),
    # ---- the spec ---------------------------------------------------------------------------------------------
    spec_case("TOML syntax error", lambda t: edit(t, "[privacy]", "[privacy"), r"spec .*spec.toml: invalid TOML"),
    Case("garbage spec file", lambda w: ["run", _write(w.work / "junk.toml", bytes(range(256))).name],
         r"spec .*junk.toml: cannot be read"),
    Case("missing spec file", lambda w: ["run", "nope.toml"], r"spec file 'nope.toml' does not exist"),
    spec_case("unknown key", lambda t: edit(t, 'mechanism = "laplace"\nshare = 0.75', 'mechansim = "laplace"\nshare = 0.75'),
              r"key 'measure\[2\].mechansim'.*did you mean 'mechanism'"),
    spec_case("wrong type", lambda t: edit(t, "nonnegative = true", 'nonnegative = "yes"'),
              r"key 'constraints.nonnegative': must be true or false"),
    spec_case("unknown attribute", lambda t: edit(t, '"county", "sex"', '"county", "gender"'),
              r"key 'measure\[1\].attrs'.*'gender'"),
    spec_case("duplicate attribute", lambda t: edit(t, '"county", "sex"', '"county", "county"'),
              r"key 'measure\[1\].attrs'.*'county'"),
    spec_case("codes of an unknown attribute", lambda t: edit(t, "counties_per_state = 2", 'counties_per_state = 2\ncodes = ["nope"]'),
              r"key 'domain': codes: unknown attribute 'nope'"),
    spec_case("unknown backend", lambda t: edit(t, 'objective = "l2"', 'objective = "l2"\nbackend = "gurobi"'),
              r"key 'reconstruct.backend': backend 'gurobi' is not"),
    spec_case("conflicting public constraints", lambda t: edit(t, "from_data = true }", 'values = [1, 2] },\n'
                                                                 '  { name = "all", query = "total", values = [4] }'),
              r"key 'constraints'.*'invariant:all'.*before reading any data"),
    spec_case("negative invariant", lambda t: edit(t, "from_data = true }", 'from_data = true },\n'
                                                     '  { name = "neg", query = "total", values = [-5] }'),
              r"invariant 'neg' has the negative value -5"),
    spec_case("non-integer invariant", lambda t: edit(t, "from_data = true }", 'from_data = true },\n'
                                                        '  { name = "half", query = "total", values = [2.5] }'),
              r"invariant 'half' has the non-integer value 2.5"),
    spec_case("structural-zero option without zeros",
              lambda t: edit(t, "structural_zeros = [{ builtin = true }]", 'structural_zero_records = "drop"'),
              r"key 'constraints.structural_zero_records': applies only when structural_zeros are declared"),
    spec_case("usage: negative --seed", lambda t: t, r"--seed: must be a non-negative integer", ("--seed", "-3"), 2),
    # ---- the data ---------------------------------------------------------------------------------------------
    spec_case("missing data file", lambda t: edit(t, 'path = "people.csv"', 'path = "missing.csv"'),
              r"key 'data.path': file 'missing.csv' does not exist"),
    spec_case("missing --data file", lambda t: t, r"--data: file 'missing.parquet' does not exist",
              ("--data", "missing.parquet")),
    Case("garbage CSV (binary)", _file_case("junk.csv", bytes(range(256)) * 4),
         r"data .*junk.csv: columns \['state', .*\] are missing from the data \(its header row holds"),
    Case("garbage named .parquet", _file_case("junk.parquet", "state,county\nS01,C01\n"),
         r"--data: '.*junk.parquet' is named like a Parquet file but is not one"),
    Case("truncated Parquet", _file_case("cut.parquet", b"PAR1" + bytes(100)), r"data .*cut.parquet: cannot be read"),
    Case("empty cell (missing value)", _data_case("holes.csv", lambda f: f.assign(sex=f["sex"].where(f.index != 5, ""))),
         r"column 'sex' holds missing values \(empty cells or NaN\)"),
    Case("declared missing marker", _data_case(
        "marked.csv", lambda f: f.assign(age_group=f["age_group"].where(f.index % 100 != 1, "?")),
        lambda t: edit(t, 'path = "people.csv"', 'path = "marked.csv"\nmissing_values = ["?"]')),
         r"column 'age_group' holds missing values \(empty cells or NaN\)"),
    Case("value outside the domain", _data_case("odd.csv", lambda f: f.assign(sex=f["sex"].where(f.index > 1, "X"))),
         r"column 'sex' holds values outside the domain \(the values are confidential and not shown: "
         r"--show-confidential .* lists them\); allowed values: \['F', 'M'\]"),
    Case("missing column", _data_case("nosex.csv", lambda f: f.drop(columns="sex")),
         r"columns \['sex'\] are missing from the data \(its header row holds \['state', 'county', 'age_group', "),
    Case("leading zeros lost (numbers in Parquet)", _parquet_case(
        [f"{i:02d}" for i in range(1, 16)], {"state": [6, 7, 6, 12], "sex": ["F", "M", "F", "M"]}),
         r"column 'state'.* labels such as '01' have leading zeros, which numbers lose"),
    Case("ambiguous float for a text label", _parquet_case(["1", "2"], {"state": [1.0, 2.0, 1.0], "sex": ["F", "M", "F"]}),
         r"column 'state' holds a number with a decimal point where the labels are text \(the values are "
         r"confidential.*\): it is ambiguous"),
    Case("codes where labels are declared", _parquet_case(["north", "south"], {"state": [0, 1, 1], "sex": ["F", "M", "F"]}),
         r"column 'state' holds values outside the domain.*declare them: \[domain\] codes = \['state'\]"),
    Case("records in a structural-zero cell", lambda w: ["run", w.spec(edit(
        BASE, "structural_zeros = [{ builtin = true }]", _ZERO_RULE)), "--out", "release"],
         r"records fall in cells that 'structural_zero:no girls' forbid; .*"
         r"structural_zero_records = \"drop\""),
    # ---- where the release goes ---------------------------------------------------------------------------------
    Case("--out . --overwrite (the working directory)", lambda w: ["run", "spec.toml", "--out", ".", "--overwrite"],
         r"--out: '\.' is the working directory"),
    Case("--out .. (an ancestor of the working directory)", lambda w: ["run", "spec.toml", "--out", "..", "--overwrite"],
         r"--out: '\.\.' is an ancestor of the working directory"),
    Case("--out the spec's directory", _prepare_spec_dir, r"--out: 'specs' is the spec's directory"),
    Case("--out an ancestor of the data's directory", _prepare_data_ancestor,
         r"--out: 'inputs' is an ancestor of the data's directory"),
    Case("--overwrite a directory of user files", _prepare_user_dir,
         r"--out: will not replace '.*release': it holds files dpopt did not write \(no dpopt-manifest.json\): 'mine.txt'"),
    Case("--overwrite a release beside a user file", _prepare_release_plus_user_file,
         r"--out: will not replace '.*release': besides a previous release it holds files dpopt did not write: 'mine.txt'"),
    Case("--overwrite a release the user edited", _prepare_changed_release,
         r"--out: will not replace '.*release': files of the previous release were changed .*'summary.md'"),
    # ---- sizes ---------------------------------------------------------------------------------------------------
    Case("10^8 cells (a 2-way marginal measured)", _prepare_big(10, 8, _MARGINAL), env={"DPOPT_MEMORY_LIMIT": "8G"},
         match=
         r"key 'domain': the released table needs about 23.\d GiB \(100,000,000 cells x 8 attributes\); .*above the "
         r"memory limit of 8.0 GiB \(DPOPT_MEMORY_LIMIT\); use fewer or coarser attributes"),
    # An L1 fit has no matrix-free path: its working set would be as wide as the domain.
    Case("10^7 cells, identity beside a marginal, L1 fit", _prepare_big(10, 7, _IDENTITY_AND_MARGINAL + _L1),
         env={"DPOPT_MEMORY_LIMIT": "64G"}, match=
         r"key 'measure\[1\]': measurement 'cells' needs about .* PiB \(10,000,100 measured rows make a dense working "
         r"set of up to 10,000,000 cells, working-set engine\).*drop the measurement 'cells' \(one row per cell\)"),
    # A least-squares fit takes the matrix-free path instead (issue #24 item 7); refused when even that does not fit.
    Case("10^7 cells, identity beside a marginal, matrix-free above the limit",
         _prepare_big(10, 7, _IDENTITY_AND_MARGINAL), env={"DPOPT_MEMORY_LIMIT": "4G"}, match=
         r"key 'measure\[1\]': the matrix-free solve needs about 4.0 GiB \(L-BFGS-B vectors over 10,000,000 cells "
         r"and 10,000,100 measured rows, matrix-free engine\).*above the memory limit of 4.0 GiB "
         r"\(DPOPT_MEMORY_LIMIT\); use fewer or coarser attributes: even the matrix-free solve holds vectors over every cell"),
    Case("DPOPT_THREADS not a positive integer", lambda w: ["run", "spec.toml", "--out", "release"],
         r"DPOPT_THREADS must be a positive integer, got 'two'", env={"DPOPT_THREADS": "two"}),
    Case("synthetic total above the limit", lambda w: ["run", "spec.toml", "--out", "release"],
         r"key 'output.synthetic': the released table totals 600 records, above the limit of 100 synthetic records",
         after_noise=True, patch=_limit_synthetic),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case, ws, draws, capsys, monkeypatch):
    for key, value in (case.env or {}).items():
        monkeypatch.setenv(key, value)
    if case.patch is not None:
        case.patch(monkeypatch)
    argv = case.prepare(ws)
    capsys.readouterr()  # what preparing printed is not the case's output
    before = ws.snapshot()
    drawn_before = draws["words"]
    status, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    after = ws.snapshot()
    leftovers = sorted(set(after) - set(before))
    kept = all(after.get(name) == digest for name, digest in before.items())
    message = lines[-1] if lines else ""
    record(case.id, message, status, leftovers, kept)
    assert status == case.code, err
    if case.code == 1:
        assert len(lines) == 1 and lines[0].startswith("dpopt: error: "), err
    else:  # argparse: its usage (wrapped), then one error line
        assert lines[0].startswith("usage: dpopt run") and lines[-1].startswith("dpopt run: error: "), err
        assert all(line.startswith(" ") for line in lines[1:-1]), err
    assert "Traceback" not in err
    assert re.search(case.match, message), (case.match, message)
    assert not leftovers, f"written: {leftovers}"
    assert kept, "a user file changed"
    if not case.after_noise:
        assert draws["words"] == drawn_before, "noise was drawn before the input was refused"


def test_usage_errors_exit_2(ws, capsys):
    before = ws.snapshot()
    status, err = run_cli(["run"], capsys)
    assert status == 2 and "the following arguments are required: SPEC" in err
    record("usage: no SPEC", err.strip().splitlines()[-1], status, sorted(set(ws.snapshot()) - set(before)),
           ws.snapshot() == before)


# ---- the values of the confidential data never appear in a message -----------------------------------------------
def test_data_invariant_conflict_names_the_constraint_not_the_count():
    domain = census_domain(2, 2)
    frame = generate_census(600, num_states=2, counties_per_state=2, seed=3)
    data = Dataset.from_frame(frame, domain)
    cs = ConstraintSet(domain, [StructuralZeros("age_group == '0-14'", name="no children")])
    cs.invariant_from_data(Marginal(domain, ("age_group",)), data, "ages")
    true_count = int((frame["age_group"] == "0-14").sum())
    with pytest.raises(InconsistentConstraintsError, match=r"invariant 'ages' needs a non-zero count in row "
                                                           r"'age_group=0-14'.*'structural_zero:no children'") as err:
        cs.check()
    assert str(true_count) not in str(err.value)
    record("from_data invariant against a structural zero (API)", str(err.value), "InconsistentConstraintsError",
           [], True)


def test_records_in_zero_cells_can_be_dropped_and_the_report_says_so_without_a_count(ws, capsys):
    ws.spec(edit(edit(BASE, "structural_zeros = [{ builtin = true }]", _ZERO_RULE),
                 "integer = true", 'integer = true\nstructural_zero_records = "drop"'))
    status, err = run_cli(["run", "spec.toml", "--out", "release", "--quiet"], capsys)
    assert status == 0, err
    frame = pd.read_csv(ws.work / "people.csv")
    dropped = int(((frame.sex == "F") & (frame.age_group == "0-14")).sum())
    assert dropped > 0
    report = json.loads((ws.work / "release" / "report.json").read_text())
    assert report["run"]["structural_zero_records"] == "drop"
    summary = (ws.work / "release" / "summary.md").read_text()
    assert "Records falling in structural-zero cells were dropped" in summary
    invariant = next(i for i in report["invariants"] if i["name"] == "state totals")
    assert sum(invariant["values"]) == len(frame) - dropped  # the invariant is taken after the drop
    assert str(dropped) not in summary.split("Records falling")[1].split("\n")[0]


# ---- what used to be read silently wrong ---------------------------------------------------------------------------
def _one_attribute_spec(labels, **data) -> dict:
    return {"name": "labels", "domain": {"attributes": {"v": list(labels)}},
            "privacy": {"accounting": "pure", "epsilon": 1},
            "measure": [{"query": "identity", "mechanism": "laplace", "share": 1}],
            "constraints": {"nonnegative": True, "integer": True},
            "output": {"plots": False, "synthetic": False}, **({"data": data} if data else {})}


def _released_near(table: pd.DataFrame, expected: dict, tolerance: int = 30) -> bool:
    got = dict(zip(table["v"].astype(str), table["count"]))
    return set(got) == set(expected) and all(abs(got[k] - v) <= tolerance for k, v in expected.items())


def test_integer_column_is_matched_to_text_labels_by_text_never_by_position(draws):
    frame = pd.DataFrame({"v": np.repeat([1, 2], [500, 120])})  # ints; labels are the texts "1", "2", "3"
    release = run(_one_attribute_spec(["1", "2", "3"]), data=frame)
    assert _released_near(release.table, {"1": 500, "2": 120, "3": 0})
    release = run(_one_attribute_spec(["1", "2"]), data=frame)  # was: "values outside the domain: '2', '1'"
    assert _released_near(release.table, {"1": 500, "2": 120})
    record("ints 1/2 against labels ['1','2','3'] (API)", "released under their own labels", 0, [], True)


def test_leading_zeros_lost_by_a_numeric_column_are_an_error_saying_so():
    labels = [f"{i:02d}" for i in range(1, 16)]
    frame = pd.DataFrame({"v": [6, 6, 7]})  # a STATE column read as int
    with pytest.raises(DataError, match=r"column 'v' holds values outside the domain \(the values are confidential.*"
                                        r"leading zeros, which numbers lose"):
        run(_one_attribute_spec(labels), data=frame)
    with pytest.raises(DataError, match=r"column 'v' holds values outside the domain: '6', '7';.*leading zeros"):
        run(_one_attribute_spec(labels), data=frame, show_confidential=True)


def test_labels_na_none_null_are_values_in_a_csv(tmp_path):
    labels = ["NA", "None", "null", "n/a", "1.0", "007"]
    counts = [300, 200, 100, 60, 40, 20]
    path = tmp_path / "people.csv"
    pd.DataFrame({"v": np.repeat(labels, counts)}).to_csv(path, index=False)
    release = run(_one_attribute_spec(labels), data=path, out=tmp_path / "release")
    table = read_released(tmp_path / "release" / "release.csv", dtype=str)
    assert list(table["v"]) == labels
    assert _released_near(table.astype({"count": int}), dict(zip(labels, counts)))
    assert release.report["run"]["data"] == str(path.absolute())  # the curator's copy keeps the path
    record("labels 'NA', 'None', 'null' in a CSV", "read as values", 0, [], True)


def test_data_reader_follows_the_data_file_not_the_spec(tmp_path):
    frame = generate_census(400, num_states=2, counties_per_state=2, seed=5)
    frame.to_csv(tmp_path / "people.csv", index=False)
    frame.to_parquet(tmp_path / "people.parquet", index=False)
    spec = tmp_path / "spec.toml"
    spec.write_text(BASE, encoding="utf-8")  # data.path ends in .csv
    from_parquet = run(spec, data=tmp_path / "people.parquet", seed=1)
    from_csv = run(spec, data=tmp_path / "people.csv", seed=1)
    assert np.array_equal(from_parquet.counts, from_csv.counts)
    # Content beats a wrong name: a Parquet file called .csv is still read as Parquet.
    (tmp_path / "really_parquet.csv").write_bytes((tmp_path / "people.parquet").read_bytes())
    assert np.array_equal(run(spec, data=tmp_path / "really_parquet.csv", seed=1).counts, from_csv.counts)
    record("--data people.parquet with a spec path ending .csv", "read as Parquet", 0, [], True)


def test_synthetic_expansion_refuses_before_allocating():
    domain = Domain.from_dict({"a": 1000, "b": 1000})  # 10^6 cells
    counts = np.full(domain.size, 10**6, dtype=np.int64)  # 10^12 records: terabytes if allocated
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"totals 1,000,000,000,000 records, above the limit of 50,000,000"):
        synthesize(domain, counts)
    assert time.perf_counter() - start < 5


# ---- no leak through files and messages; NOT private said everywhere -------------------------------------------------
def test_published_files_name_the_data_by_base_name_only(ws, capsys):
    status, _ = run_cli(["run", "spec.toml", "--data", str(ws.work / "people.csv"), "--out", "release", "-q"], capsys)
    assert status == 0
    for name in ("report.json", "summary.md", MANIFEST_NAME):
        text = (ws.work / "release" / name).read_text()
        assert str(ws.root) not in text, name
    report = json.loads((ws.work / "release" / "report.json").read_text())
    assert report["run"]["data"] == "people.csv" and report["spec"]["source"] == "spec.toml"
    assert "Data: people.csv." in (ws.work / "release" / "summary.md").read_text()
    assert not (ws.work / "release" / NOT_PRIVATE_MARKER).exists()  # a private run is not marked


@pytest.mark.parametrize("flags", [["--seed", "7"], ["--evaluate"]], ids=["seeded", "evaluated"])
def test_a_non_private_run_says_so_even_with_quiet_and_in_every_file(ws, capsys, flags):
    status, err = run_cli(["run", "spec.toml", "--out", "release", "-q", *flags], capsys)
    assert status == 0
    assert re.search(r"^dpopt: warning: the release in 'release' is NOT private: .*do not publish it$", err.strip())
    out = ws.work / "release"
    assert "NOT PRIVATE" in (out / NOT_PRIVATE_MARKER).read_text()
    csvs = sorted(out.rglob("*.csv"))
    parquets = sorted(out.rglob("*.parquet"))
    assert csvs and parquets
    for path in csvs:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# NOT PRIVATE: ") and "," not in first.split(":")[0], path
    for path in parquets:
        import pyarrow.parquet as pq

        assert b"NOT PRIVATE" in pq.read_schema(path).metadata[NOT_PRIVATE_METADATA_KEY], path
    table = read_released(out / "release.csv")
    assert list(table.columns)[-1] == "count" and len(table) == census_domain(2, 2).size
    assert read_manifest(out)["not_private"]


def test_the_python_api_warns_on_a_non_private_run():
    spec = _one_attribute_spec(["a", "b"])
    frame = pd.DataFrame({"v": ["a"] * 30 + ["b"] * 10})
    with pytest.warns(UserWarning, match=r"NOT private: the noise is seeded \(seed 3\)"):
        run(spec, data=frame, seed=3)
    with pytest.warns(UserWarning, match=r"NOT private: it is evaluated against the confidential data"):
        run(spec, data=frame, evaluate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotPrivateWarning)
        run(spec, data=frame)  # private: no warning


def test_verbose_reaches_every_solve_of_the_run_and_only_that_run(monkeypatch):
    import dpopt.estimate as estimate
    from dpopt.release.pipeline import solver_verbosity

    seen = []
    original = estimate.reconstruct

    def spy(*args, **kwargs):  # what the solve will use: the keyword, else the run's default
        seen.append(kwargs.get("verbose") if kwargs.get("verbose") is not None else estimate.SOLVER_VERBOSE.get())
        return original(*args, **kwargs)

    monkeypatch.setattr(estimate, "reconstruct", spy)
    run(_one_attribute_spec(["a", "b"]), data=pd.DataFrame({"v": ["a", "b"] * 5}), verbose=True)
    assert seen and all(seen)
    seen.clear()
    run(_one_attribute_spec(["a", "b"]), data=pd.DataFrame({"v": ["a", "b"] * 5}))
    assert seen and not any(seen)
    with solver_verbosity(True):
        assert estimate.SOLVER_VERBOSE.get() is True
    assert estimate.SOLVER_VERBOSE.get() is False


# ---- budget ranges: the conversions work at both ends of what they accept -------------------------------------------
def test_the_budget_ranges_are_honoured_at_both_ends():
    from dpopt.privacy.conversions import (
        _CONVERSION_DELTA,
        _CONVERSION_EPSILON,
        _CONVERSION_RHO,
        approx_dp_to_zcdp,
        zcdp_to_approx_dp,
    )
    from dpopt.privacy.samplers import discrete_gaussian, discrete_laplace, discrete_laplace_variance

    for delta in (*_CONVERSION_DELTA, Fraction(1, 10**6)):
        for eps in _CONVERSION_EPSILON:
            assert approx_dp_to_zcdp(eps, delta) > 0
        for rho in _CONVERSION_RHO:
            assert zcdp_to_approx_dp(rho, delta) >= 0
    with pytest.raises(PrivacyParameterError, match=r"epsilon must lie in \[2\^-480"):
        approx_dp_to_zcdp(Fraction(10) ** 30, Fraction(1, 10**6))  # was: brentq's "f(a) and f(b) ..."
    with pytest.raises(PrivacyParameterError, match=r"delta must lie in \[2\^-2000 \(8.7\de-603\)"):
        zcdp_to_approx_dp(1, Fraction(1, 10**700))  # was: OverflowError
    # The samplers draw at the ends of the spec's ranges (a count measured with the whole budget).
    assert discrete_laplace(Fraction(2**56), 10, SeededRandom(1)).dtype == np.int64
    assert discrete_laplace(Fraction(1, 2**63), 10, SeededRandom(1)).tolist() == [0] * 10
    assert discrete_gaussian(Fraction(2**112), 3, SeededRandom(1)).dtype == np.int64
    assert discrete_laplace_variance(Fraction(10) ** 200) == float("inf")  # was: ZeroDivisionError
    assert discrete_laplace_variance(Fraction(10) ** 9) == pytest.approx(2e18, rel=1e-12)


# ---- a property: random label sets land under their own labels -------------------------------------------------------
_NUMERIC = st.one_of(st.integers(-999, 9999).map(str), st.integers(0, 999).map(lambda i: f"{i:04d}"),
                     st.floats(-1e3, 1e3, allow_nan=False).map(repr), st.sampled_from(["1e3", "0x1F", "+5", ".5"]))
_MISSING_LOOKING = st.sampled_from(["NA", "N/A", "NaN", "nan", "None", "null", "NULL", "#N/A", "-", "TRUE", "false"])
_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=8)
_LABEL = st.one_of(_NUMERIC, _MISSING_LOOKING, _TEXT).filter(lambda s: s.strip() == s and s != "")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(labels=st.lists(_LABEL, min_size=2, max_size=5, unique=True),
       other=st.lists(_LABEL, min_size=1, max_size=3, unique=True), fmt=st.sampled_from(["csv", "parquet"]))
def test_random_label_sets_put_every_record_under_its_own_label(tmp_path_factory, labels, other, fmt):
    base = tmp_path_factory.mktemp("labels")
    cells = [(a, b) for a in labels for b in other]
    sizes = [40 * (1 + i) for i in range(len(cells))]  # distinct counts: a shifted label is off by >= 40
    frame = pd.DataFrame({"v": np.repeat([a for a, _ in cells], sizes), "w": np.repeat([b for _, b in cells], sizes)})
    path = base / f"people.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
    spec = {"name": "labels", "domain": {"attributes": {"v": labels, "w": other}},
            "privacy": {"accounting": "pure", "epsilon": 2},
            "measure": [{"query": "identity", "mechanism": "laplace", "share": 1}],
            "constraints": {"nonnegative": True, "integer": True},
            "output": {"plots": False, "synthetic": False, "formats": [fmt], "summary": []}}
    run(spec, data=path, out=base / "release")
    table = read_released(base / "release" / f"release.{fmt}", **({"dtype": str} if fmt == "csv" else {}))
    got = {(str(a), str(b)): int(c) for a, b, c in zip(table["v"], table["w"], table["count"])}
    assert set(got) == set(cells)
    for cell, size in zip(cells, sizes):
        assert abs(got[cell] - size) <= 15, (cell, size, got[cell])  # Laplace scale 1/2: |noise| > 15 w.p. < 1e-13


# ---- real signals at every phase ---------------------------------------------------------------------------------------
SIGNAL_CASES = [("load", "SIGTERM"), ("constraints", "SIGTERM"), ("algorithm", "SIGTERM"), ("report", "SIGTERM"),
                ("write", "SIGTERM"), ("write", "SIGINT"), ("write", "SIGHUP"), ("commit", "SIGTERM")]


def _start(ws: Workspace, phase: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "signal_harness.py"), phase, "--",
                             "run", "spec.toml", "--out", "release", "--quiet", *args],
                            cwd=ws.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(proc: subprocess.Popen, phase: str) -> None:
    """Read the subprocess's stdout up to its READY line (a solver may print its banner first)."""
    while True:
        line = proc.stdout.readline()
        if not line or line.startswith("READY"):
            break
    assert line.strip() == f"READY {phase}", (line, proc.stderr.read() if proc.poll() is not None else "")


@pytest.mark.parametrize("phase, name", SIGNAL_CASES, ids=[f"{s}-at-{p}" for p, s in SIGNAL_CASES])
def test_a_signal_at_any_phase_leaves_nothing_behind(ws, phase, name):
    before = ws.snapshot()
    proc = _start(ws, phase)
    _wait_ready(proc, phase)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=120)
    after = ws.snapshot()
    signum = getattr(signal, name)
    lines = err.strip().splitlines()
    leftovers = sorted(set(after) - set(before))
    kept = all(after.get(k) == v for k, v in before.items())
    record(f"{name} while {phase}", lines[-1] if lines else "", proc.returncode,
           [x for x in leftovers if not x.startswith("work/release")] or
           (["work/release/ (complete, manifest verified)"] if leftovers else []), kept)
    assert proc.returncode == 128 + signum, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert kept
    if phase == "commit":  # held during the swap: the release is complete, the signal lands after it
        assert lines[0] == f"dpopt: interrupted by {name}; the release in '{ws.work / 'release'}' is complete"
        manifest = read_manifest(ws.work / "release")
        assert manifest is not None and not [x for x in leftovers if "/.release." in x]
        assert {x for x in leftovers if x.startswith("work/release/")} >= \
            {f"work/release/{f}" for f in manifest["files"]}
    else:
        assert lines[0] == f"dpopt: interrupted by {name}; nothing was written"
        assert not leftovers, leftovers


def test_a_signal_while_replacing_a_release_keeps_the_previous_one(ws, capsys):
    assert main(["run", "spec.toml", "--out", "release", "--quiet"]) == 0
    before = ws.snapshot()
    proc = _start(ws, "write", "--overwrite")
    _wait_ready(proc, "write")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert ws.snapshot() == before  # the previous release, untouched, and no temporary
    record("SIGTERM while writing over a previous release (--overwrite)", err.strip().splitlines()[-1],
           proc.returncode, [], True)


def test_a_killed_run_leaves_a_temporary_that_the_next_run_removes(ws, capsys):
    before = ws.snapshot()
    proc = _start(ws, "write")
    _wait_ready(proc, "write")
    proc.send_signal(signal.SIGKILL)  # no handler can run: the temporary stays
    proc.communicate(timeout=120)
    stale = [p.name for p in ws.work.iterdir() if p.name.startswith(".release.tmp-")]
    assert len(stale) == 1
    assert main(["run", "spec.toml", "--out", "release", "--quiet"]) == 0
    assert not [p.name for p in ws.work.iterdir() if p.name.startswith(".release.")]
    assert read_manifest(ws.work / "release") is not None
    assert all(ws.snapshot().get(k) == v for k, v in before.items())
    record("SIGKILL while writing, then the next run", "stale temporary removed by the next run", -9,
           [], True)


def test_a_kill_between_the_two_renames_is_undone_by_the_next_run(ws, capsys):
    assert main(["run", "spec.toml", "--out", "release", "--quiet"]) == 0
    release = ws.work / "release"
    first = {p.name: p.read_bytes() for p in release.iterdir() if p.is_file()}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = ws.work / f".release.old-{int(dead.stdout)}-abc123"
    os.replace(release, old)  # as if killed after moving the previous release aside
    assert clean_stale_temporaries(release) == [] and release.is_dir() and not old.exists()
    assert {p.name: p.read_bytes() for p in release.iterdir() if p.is_file()} == first
    # A temporary of a running process (this one) is never touched.
    live = ws.work / f".release.tmp-{os.getpid()}-xyz"
    (live / "x").parent.mkdir()
    (live / ".dpopt-owner").write_text(str(os.getpid()))
    clean_stale_temporaries(release)
    assert live.is_dir()


def test_check_output_dir_refuses_protected_directories(tmp_path):
    from dpopt.atomic import check_output_dir

    data = tmp_path / "a" / "b"
    data.mkdir(parents=True)
    protected = {"the data's directory": data}
    for target in (data, tmp_path / "a", tmp_path):
        with pytest.raises(OutputExistsError, match="the data's directory"):
            check_output_dir(target, protected=protected)
    assert check_output_dir(data / "release", protected=protected) == data / "release"
