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
    # The test line installs the 'test' extra (pytest-xdist for -n 2) and the 'spark' extra (the
    # Spark executor's tests), exactly as CI does; the release line installs neither.
    assert commands(tests)[1][3] == ".[test,spark]"
    assert commands(release)[1][3] == "."
    extras = pyproject["project"]["optional-dependencies"]
    assert "pytest" in " ".join(extras["test"]) and "pytest-xdist" in " ".join(extras["test"])
    assert [d.split(">")[0] for d in extras["spark"]] == ["pyspark"]
    assert not any(d.startswith("pyspark") for d in pyproject["project"]["dependencies"])
    ci = (REPO / ".ci" / "run").read_text()
    assert f'pip install --quiet -e "{commands(tests)[1][3]}"' in ci
    # The README's test command is the one CI runs.
    pytest_args = commands(tests)[2][1:]
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


def tour_commands() -> list[list[str]]:
    """The ``dpopt`` commands of the README's bash blocks after the Quick start that need no
    external data (the real-data specs read ../shared/data; tests/test_spec.py plans them)."""
    text = README.read_text(encoding="utf-8")
    tour = text[text.index("## A short tour"):]
    lines = [line.split("#")[0].strip() for block in re.findall(r"^```bash\n(.*?)^```", tour, flags=re.M | re.S)
             for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line and "/bin/dpopt " in line and "--data" not in line]


def test_quick_tour_commands_run(capsys, monkeypatch):
    from dpopt.cli import main

    cmds = tour_commands()
    assert [c[1] for c in cmds] == ["check", "models"], cmds
    monkeypatch.chdir(REPO)
    for cmd in cmds:
        assert main(cmd[1:]) == 0, cmd
    out = capsys.readouterr().out
    assert "budget split (noise_stddev" in out and "spec OK: nothing was read or written" in out
    assert "quickstart" in out and "census_topdown" in out


def test_quick_tour_quoted_error_is_what_check_prints(tmp_path, capsys, monkeypatch):
    """The README's example error: the quickstart with the shares it quotes, as ``my.toml``."""
    from fractions import Fraction

    from dpopt.cli import main

    text = README.read_text(encoding="utf-8")
    blocks = [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S) if not m.group(1)]
    (quoted,) = [block for block in blocks if block.startswith("dpopt: error: spec my.toml")]
    shares = [Fraction(s) for s in re.search(r"tables \(([^)]*)\) sum", quoted).group(1).split(", ")]
    spec = (REPO / "models" / "quickstart.toml").read_text()
    old = re.findall(r"^share = (.*)$", spec, flags=re.M)
    assert len(old) == len(shares)
    for before, after in zip(old, shares):
        spec = spec.replace(f"share = {before}\n", f"share = {float(after)!r}\n", 1)
    (tmp_path / "my.toml").write_text(spec)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "my.toml"]) == 1
    assert capsys.readouterr().err == quoted
