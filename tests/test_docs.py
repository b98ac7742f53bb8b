"""The documentation builds in strict mode, covers every spec key and CLI option, and its examples run."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpopt.cli import build_parser, main
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


def test_spec_reference_lists_every_objective_and_its_backends():
    """The ``[reconstruct]`` rows name every objective the spec accepts and every backend of each."""
    from dpopt.estimate import OBJECTIVES, backends_for

    text = (PAGES / "reference" / "spec.md").read_text()
    objective_row = re.search(r"^\| `objective` \|(.*)$", text[text.index("## `[reconstruct]`"):], flags=re.M).group(1)
    assert re.findall(r'`"(\w+)"`', objective_row.split("|")[0]) == list(OBJECTIVES)
    backend_row = re.search(r"^\| `backend` \|(.*)$", text[text.index("## `[reconstruct]`"):], flags=re.M).group(1)
    for objective in OBJECTIVES:
        listed = re.search(rf"`{objective}`(?:, `\w+`)*: ((?:`\w+`(?:, )?)+)", backend_row)
        assert listed, f"the backends of {objective!r} are not listed"
        assert re.findall(r"`(\w+)`", listed.group(1)) == list(backends_for(objective)), objective


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


# ---- the tutorial, followed as a reader would ------------------------------------------------------------------
#
# Every command in the tutorial runs, in order, in a fresh directory with models/ beside it; every
# output the tutorial quotes is compared with what was printed (up to line wrapping and the
# seconds a run took); a quoted error must be the whole, one-line message; TOML blocks are the
# edits the tutorial asks for, applied to the spec it copied. The install lines (venv, pip) are
# the README's Quick start, which CI (.ci/run) runs from a clean checkout.

TUTORIAL = PAGES / "tutorial.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", flags=re.M | re.S)
INLINE_COMMAND = re.compile(r"`(dpopt [a-z-]+ [^`]+)`")
SECONDS = re.compile(r"\d+(?:\.\d+)? s\b")


def tutorial_sections() -> dict[str, str]:
    """The tutorial's sections by number (``"1"`` for ``## 1. Install``)."""
    parts = re.split(r"^## (\d+)\. .*$", TUTORIAL.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def tutorial_steps(text: str) -> list[tuple[str, str]]:
    """(kind, body) in reading order: fenced blocks (kind: their language, "" for quoted output)
    and the ``dpopt ...`` commands written inline in the prose (kind ``"inline"``)."""
    steps, at = [], 0
    for block in FENCE.finditer(text):
        steps += [(m.start() + at, "inline", m.group(1)) for m in INLINE_COMMAND.finditer(text[at:block.start()])]
        steps.append((block.start(), block.group(1), block.group(2)))
        at = block.end()
    steps += [(m.start() + at, "inline", m.group(1)) for m in INLINE_COMMAND.finditer(text[at:])]
    return [(kind, body) for _, kind, body in sorted(steps)]


def quoted_pattern(quoted: str) -> re.Pattern:
    """The quoted text as a pattern over whitespace-normalised output: any number of seconds."""
    parts = SECONDS.split(" ".join(quoted.split()))
    return re.compile(r"[0-9.]+ s".join(map(re.escape, parts)))


class TutorialReader:
    """Runs the tutorial's steps in ``workdir`` through :func:`dpopt.cli.main`."""

    def __init__(self, workdir: Path, capsys):
        self.dir, self.capsys = workdir, capsys
        self.copied: Path | None = None  # the spec the tutorial copied and edits
        self.before_edit: list[str] = []
        self.last = None  # (command, status, stdout, stderr) of the last dpopt command

    def follow(self, steps) -> None:
        previous = None
        for kind, body in steps:
            if kind == "bash":
                for line in body.splitlines():
                    self.command(line)
            elif kind == "inline":
                self.command(body)
            elif kind == "toml":
                self.edit(body)
            elif kind == "python":
                exec(compile(body, str(TUTORIAL), "exec"), {})
            elif kind == "" and previous == "bash":
                self.compare_output(body)
            elif kind == "":
                self.compare_quoted_file(body)
            previous = kind
        if self.last is not None:
            self.check_status(expected_error=False)

    def command(self, line: str) -> None:
        args = shlex.split(line)
        if not args or args[0] == "python3" or args[0].endswith("/pip"):
            return  # the install: see above
        if self.last is not None:
            self.check_status(expected_error=False)
        if args[0] == "cp":
            shutil.copy(self.dir / args[1], self.dir / args[2])
            self.copied = self.dir / args[2]
            return
        assert args[0].endswith("dpopt"), f"the tutorial runs {line!r}: teach this test what it means"
        try:
            status = main(args[1:])
        except SystemExit as exc:  # --version, --help
            status = exc.code
        out, err = self.capsys.readouterr()
        self.last = (line, status, out, err)

    def check_status(self, expected_error: bool) -> None:
        line, status, out, err = self.last
        assert (status == 1) if expected_error else (status == 0), (line, status, err)
        self.last = None

    def compare_output(self, quoted: str) -> None:
        line, status, out, err = self.last
        printed = err if quoted.startswith("dpopt: error:") else out
        normalised = " ".join(printed.split())
        if quoted.startswith("dpopt:"):  # the whole message of the command
            assert quoted_pattern(quoted).fullmatch(normalised), (line, quoted, printed)
        else:
            assert quoted_pattern(quoted).search(normalised), (line, quoted, printed)
        if quoted.startswith("dpopt: error:"):
            assert len(err.strip().splitlines()) == 1, err
            self.check_status(expected_error=True)
            if self.copied is not None and self.before_edit:  # "take it out again"
                self.copied.write_text(self.before_edit.pop())
        else:
            self.check_status(expected_error=False)

    def edit(self, block: str) -> None:
        """A TOML block replaces the array of the same key in the copied spec."""
        key = re.match(r"(\w+) = \[", block).group(1)
        text = self.copied.read_text()
        start = text.index(f"{key} = [")
        end = text.index("\n]\n", start) + 3
        self.before_edit.append(text)
        self.copied.write_text(text[:start] + block + text[end:])

    def compare_quoted_file(self, quoted: str) -> None:
        """A listing of the release directory, or the first lines of a file the prose names."""
        lines = quoted.splitlines()
        if lines[0].endswith("/"):
            self.compare_listing(lines)
            return
        named = re.findall(r"`(release[\w/.-]*\.csv)`", self.prose_before(quoted))
        assert named, f"quoted block {lines[0]!r}: which file does it show?"
        printed = (self.dir / named[-1]).read_text().splitlines()
        assert printed[0] == lines[0]
        for quoted_row, row in zip(lines[1:], printed[1:]):
            # labels as quoted; the counts are noise (the tutorial says numbers differ run to run)
            label_columns = lines[0].split(",").index("count")
            assert quoted_row.split(",")[:label_columns] == row.split(",")[:label_columns]

    def prose_before(self, quoted: str) -> str:
        text = TUTORIAL.read_text(encoding="utf-8")
        return text[:text.index(quoted)]

    def compare_listing(self, lines: list[str]) -> None:
        """Every name listed exists, and every file written is listed."""
        root = self.dir / lines[0].rstrip("/")
        patterns = []
        for line in lines[1:]:
            names = re.split(r"\s{2,}", line.strip())[0]
            folder = ""
            for name in names.split(", "):
                folder = name.rsplit("/", 1)[0] + "/" if "/" in name else folder
                patterns.append(name if "/" in name else folder + name)
        for pattern in patterns:
            assert list(root.glob(pattern)), (pattern, sorted(p.name for p in root.iterdir()))
        written = [p.relative_to(root) for p in root.rglob("*") if p.is_file()]
        unlisted = [str(p) for p in written if not any(p.match(pattern) for pattern in patterns)]
        assert not unlisted, f"the tutorial's listing of {lines[0]} leaves out {unlisted}"


#: Sections followed together (a later one reads what an earlier one wrote); groups run in parallel.
TUTORIAL_GROUPS = [("1", "2", "3", "4"), ("5",), ("6",), ("7",)]


def test_tutorial_groups_cover_every_section():
    assert sorted(s for group in TUTORIAL_GROUPS for s in group) == sorted(tutorial_sections())


@pytest.mark.filterwarnings("ignore::dpopt.release.pipeline.NotPrivateWarning")
@pytest.mark.parametrize("group", TUTORIAL_GROUPS, ids=lambda g: "section " + "-".join(g))
def test_tutorial_runs_as_written_and_prints_what_it_quotes(group, tmp_path, capsys, monkeypatch):
    sections = tutorial_sections()
    (tmp_path / "models").symlink_to(REPO / "models")
    monkeypatch.chdir(tmp_path)
    reader = TutorialReader(tmp_path, capsys)
    for number in group:
        reader.follow(tutorial_steps(sections[number]))
    if "5" in group:  # what section 5 says the evaluated summary gains
        assert "Accuracy against the confidential data" in (tmp_path / "release-eval" / "summary.md").read_text()
        assert (tmp_path / "release-eval" / "plots" / "error_by_query.png").is_file()
    if "6" in group:
        assert "children do not live alone" in (tmp_path / "release-2" / "summary.md").read_text()
        assert (tmp_path / "release-3" / "release.csv").is_file()
