"""The documentation builds in strict mode, covers every spec key and CLI option, and its examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpopt.cli import build_parser
from dpopt.spec import all_section_keys

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = DOCS / "pages"


def test_docs_build_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(DOCS / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "tutorial.html").is_file()


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((DOCS / "mkdocs.yml").read_text())
    nav = set(_nav_files(config["nav"]))
    pages = {str(p.relative_to(PAGES)) for p in PAGES.rglob("*.md")}
    assert pages == nav


def test_spec_reference_documents_every_key():
    text = (PAGES / "reference" / "spec.md").read_text()
    for section, keys in all_section_keys().items():
        for key in keys:
            forms = (f"`{key}`", f"`[{key}]`", f"`[[{key}]]`")
            assert any(form in text for form in forms), f"{section or 'top level'}.{key} is not documented"


def test_cli_reference_documents_every_command_and_option():
    text = (PAGES / "reference" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        assert f"## `dpopt {name}`" in text, name
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in text, f"dpopt {name} {flag}"


def test_algorithm_pages_state_their_status():
    for page in (PAGES / "algorithms").glob("*.md"):
        if page.name == "index.md":
            continue
        text = page.read_text()
        assert re.search(r"\*\*Status: (implemented|planned)", text), page.name
        assert "## Reference" in text, page.name


def test_docs_mention_only_existing_models_and_examples():
    for page in PAGES.rglob("*.md"):
        text = page.read_text()
        for name in re.findall(r"models/([\w-]+)\.toml", text):
            assert (REPO / "models" / f"{name}.toml").is_file(), (page.name, name)
        for name in re.findall(r"examples/([\w-]+)\.py", text):
            assert (REPO / "examples" / f"{name}.py").is_file(), (page.name, name)


def _toml_blocks(page: Path) -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", page.read_text(), flags=re.M | re.S)


def test_tutorial_constraint_changes_do_what_the_tutorial_says():
    """Step 6 of the tutorial: an added structural zero is accepted; a false total is refused."""
    from dpopt.errors import InconsistentConstraintsError
    from dpopt.release import build_constraints, load_data, plan
    from dpopt.spec import parse_spec_text

    quickstart = (REPO / "models" / "quickstart.toml").read_text()
    zeros, invariants = _toml_blocks(PAGES / "tutorial.md")
    start = quickstart.index("structural_zeros = [")
    end = quickstart.index("]\n", start) + 2
    changed = quickstart[:start] + zeros + quickstart[end:]
    p = plan(parse_spec_text(changed))
    assert any("children do not live alone" in row["detail"] for row in p.constraints.describe())
    start = changed.index("invariants = [")
    end = changed.index("]\n", start) + 2
    broken = changed[:start] + invariants + changed[end:]
    p = plan(parse_spec_text(broken))
    with pytest.raises(InconsistentConstraintsError, match="everyone"):
        build_constraints(p, load_data(p))


def test_spec_reference_minimal_spec_is_valid(tmp_path):
    from dpopt.spec import parse_spec_text

    (minimal,) = [b for b in _toml_blocks(PAGES / "reference" / "spec.md") if "[privacy]" in b]
    (tmp_path / "people.csv").write_text("smoke,family\n0,1\n")
    spec = parse_spec_text(minimal, source=tmp_path / "minimal.toml")
    assert spec.measures[0].query.kind == "all_marginals"


EXAMPLES = sorted((REPO / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(script, tmp_path):
    """Every example runs to completion (each is meant to take well under a minute)."""
    args = [sys.executable, str(script)]
    if script.stem == "release_from_python":
        args.append(str(tmp_path / "release"))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
    text = script.read_text()
    assert text.startswith('"""') and "NOT private" in text  # each says what it teaches, and about seeds
