"""The README's Quick start: two commands, as written, that run the quickstart and the tests.

Running the real fresh-venv commands takes minutes (a virtual environment and a pip install),
too slow for the suite; CI (.ci/run) does the equivalent from a clean checkout. Here the
commands are parsed and checked, and their dpopt part is run the way the installed script runs
it (``python -m dpopt.cli``, from the repository root).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def quick_start_block() -> list[str]:
    """Lines of the first ```bash block under the '## Quick start' heading."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Quick start\s*$(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, "README has no '## Quick start' section"
    block = re.search(r"^```bash\n(.*?)^```", match.group(1), flags=re.M | re.S)
    assert block, "no ```bash block under Quick start"
    return [line for line in block.group(1).splitlines() if line.strip()]


def commands(line: str) -> list[list[str]]:
    return [shlex.split(part) for part in line.split("&&")]


def test_quick_start_has_two_one_line_commands():
    lines = quick_start_block()
    assert len(lines) == 2
    release, tests = lines
    assert "models/quickstart.toml" in release and "dpopt run" in release
    assert "pytest" in tests and "models/quickstart.toml" not in tests
    for line in lines:
        first = commands(line)[0]
        assert first[:3] == ["python3", "-m", "venv"], "each line must create its own environment"


def test_quick_start_commands_use_the_venv_they_create():
    for line in quick_start_block():
        cmds = commands(line)
        venv = cmds[0][3]
        for cmd in cmds[1:]:
            assert cmd[0].startswith(f"{venv}/bin/"), cmd
        install = cmds[1]
        assert install[1:3] == ["install", "-e"]


def test_quick_start_matches_the_project_and_ci():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["dpopt"] == "dpopt.cli:main"
    release, tests = quick_start_block()
    assert commands(release)[2][0].endswith("/bin/dpopt")
    # The test line installs the 'test' extra, which must bring pytest-xdist for -n 2.
    assert commands(tests)[1][3] == ".[test]"
    extras = " ".join(pyproject["project"]["optional-dependencies"]["test"])
    assert "pytest" in extras and "pytest-xdist" in extras
    # The README's test command is the one CI runs.
    pytest_args = commands(tests)[2][1:]
    ci = (REPO / ".ci" / "run").read_text()
    assert f"python {' '.join(pytest_args)}" in ci


def test_quick_start_release_runs_as_written(tmp_path):
    """The first line's dpopt command, from the repository root, with the output moved to tmp."""
    release = commands(quick_start_block()[0])[2]
    args = release[1:]
    out_at = args.index("--out")
    args[out_at + 1] = str(tmp_path / "release")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    existed = (REPO / "release").exists()
    proc = subprocess.run([sys.executable, "-m", "dpopt.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ledger sums exactly to the budget" in proc.stdout
    report = json.loads((tmp_path / "release" / "report.json").read_text())
    assert report["constraints_all_hold"] and report["privacy"]["ledger_sums_to_budget"]
    assert (REPO / "release").exists() == existed  # nothing written into the checkout


def test_readme_python_example_runs(monkeypatch, capsys):
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
    assert blocks
    monkeypatch.chdir(REPO)
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "epsilon" in out and "count" in out


@pytest.mark.parametrize("path", re.findall(r"\]\(([^)#]+)", README.read_text(encoding="utf-8")))
def test_readme_links_exist(path):
    assert (REPO / path).exists(), path


def test_readme_mentions_only_existing_models():
    for name in re.findall(r"models/([\w-]+)\.toml", README.read_text(encoding="utf-8")):
        assert (REPO / "models" / f"{name}.toml").is_file(), name
