"""Imports only where used: the command line starts without the heavy packages, and each heavy
package is imported by the step that uses it (issue #28 item 2, #30 item 2).

Each check runs in a fresh interpreter (``sys.modules`` of the test process already holds
everything), and prints what it found as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Packages that take 0.1-3 s to import: none of them may be imported before it is needed.
HEAVY = ("numpy", "scipy", "scipy.stats", "scipy.optimize", "pandas", "pyarrow", "cvxpy", "matplotlib", "pyspark",
         "highspy", "pulp", "tqdm")


def imported_after(code: str, heavy=HEAVY) -> list[str]:
    """The packages of ``heavy`` in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps([m for m in {list(heavy)!r} if m in sys.modules]))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_dpopt_imports_no_heavy_package():
    assert imported_after("import dpopt; dpopt.__version__") == []


def test_the_command_line_parser_imports_no_heavy_package():
    """``dpopt --help``/``--version`` build the whole parser (the audit's sub-command included)."""
    code = """
        import dpopt.cli
        parser = dpopt.cli.build_parser()
        parser.format_help()
        for action in parser._subparsers._group_actions:
            for sub in action.choices.values():
                sub.format_help()
    """
    assert imported_after(code) == []


def test_dpopt_help_and_version_exit_without_heavy_imports():
    code = """
        import dpopt.cli
        for argv in (["--help"], ["--version"], ["run", "--help"], ["audit", "--help"]):
            try:
                dpopt.cli.main(argv)
            except SystemExit as exc:
                assert exc.code == 0, (argv, exc.code)
    """
    assert imported_after(code) == []


def test_backends_are_found_without_importing_them():
    """Learning that cvxpy (or HiGHS) is installed, or that cvxpy can solve a form, does not import
    it; choosing the LP backend imports HiGHS, which will solve, and nothing else; a QP goes to
    Clarabel, called directly."""
    code = """
        from dpopt.estimate.backends import installed_backends
        from dpopt.estimate.policy import choose_backend, installed_backends_for
        assert "cvxpy" in installed_backends() and "highs" in installed_backends()
        assert "cvxpy" in installed_backends_for("l2")
        assert choose_backend("LP").name == "highs"
        import numpy as np
        from dpopt.estimate.backends import get_backend
        from dpopt.estimate.form import ProgramForm
        qp = ProgramForm(c=[1.0, 0.0], A=np.ones((1, 2)), row_lower=[1.0], row_upper=[1.0], row_names=["r"],
                         P=np.eye(2))
        milp = ProgramForm(c=[1.0, 0.0], A=np.ones((1, 2)), row_lower=[1.0], row_upper=[1.0], row_names=["r"],
                           integrality=[True, True])
        assert choose_backend(qp).name == "clarabel"
        assert get_backend("cvxpy").supports(qp) and get_backend("cvxpy").supports(milp)
    """
    assert imported_after(code, ("cvxpy", "matplotlib", "pyspark", "scipy.stats")) == []


def test_check_imports_no_solver_plotting_or_spark():
    code = """
        from dpopt.cli import main
        assert main(["check", "models/quickstart.toml"]) == 0
    """
    assert imported_after(code, ("cvxpy", "matplotlib", "pyspark", "scipy.stats")) == []


def test_a_release_without_plots_imports_no_solver_layer_plotting_spark_or_stats(tmp_path):
    """The quickstart with ``plots = false``, written to disk by ``dpopt run`` (#30 items 2 and the
    2-second target): its least squares go to Clarabel directly, so neither cvxpy nor the
    scipy.stats that cvxpy drags in is imported; no progress bar, so no tqdm."""
    spec = (REPO / "models" / "quickstart.toml").read_text()
    assert "plots = true" in spec
    path = tmp_path / "quickstart.toml"
    path.write_text(spec.replace("plots = true", "plots = false"))
    code = f"""
        from dpopt.cli import main
        assert main(["run", {str(path)!r}, "--out", {str(tmp_path / "release")!r}]) == 0
    """
    assert imported_after(code, ("cvxpy", "matplotlib", "pyspark", "scipy.stats", "tqdm")) == []
    assert not (tmp_path / "release" / "plots").exists()
    report = json.loads((tmp_path / "release" / "report.json").read_text())
    assert report["constraints_all_hold"] and report["reconstruction"]["solver"] == "clarabel"


def test_the_python_api_release_without_plots_never_imports_matplotlib(tmp_path):
    """The same through ``dpopt.release.run`` (seeded)."""
    spec = (REPO / "models" / "quickstart.toml").read_text()
    path = tmp_path / "quickstart.toml"
    path.write_text(spec.replace("plots = true", "plots = false"))
    code = f"""
        import warnings
        from dpopt.release import run
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the seeded run's NOT-private warning
            release = run({str(path)!r}, seed=1, out={str(tmp_path / "release")!r})
        assert release.report["constraints_all_hold"]
    """
    assert imported_after(code, ("cvxpy", "matplotlib", "pyspark", "scipy.stats", "tqdm")) == []
    assert not (tmp_path / "release" / "plots").exists()


def test_a_release_imports_only_its_own_algorithm(tmp_path):
    """Registry laziness (#30): the quickstart's spec is parsed and run with measure_reconstruct's
    module (and mwem's and dualquery's, which the package imports for their function names) only."""
    lazy = ("dpopt.algorithms.auto", "dpopt.algorithms.barak", "dpopt.algorithms.marginal_space",
            "dpopt.algorithms.matrix_mechanism", "dpopt.algorithms.mwem_factored", "dpopt.algorithms.polynomial",
            "dpopt.algorithms.topdown", "dpopt.strategy.candidates")
    code = """
        import warnings
        from dpopt.release import run
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert run("quickstart", seed=1).report["constraints_all_hold"]
    """
    assert imported_after(code, lazy) == []


def test_the_lazy_registry_still_lists_every_algorithm():
    code = """
        import json
        from dpopt.algorithms.base import BUILTIN_ALIASES, BUILTIN_MODULES, REGISTRY, _ALIASES, registered_names
        names = registered_names()
        print(json.dumps([names, {n: REGISTRY[n].__module__ for n in names}, _ALIASES, BUILTIN_ALIASES,
                          BUILTIN_MODULES]))
    """
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names, modules, aliases, builtin_aliases, builtin = json.loads(proc.stdout.strip().splitlines()[-1])
    assert names == list(builtin) and len(names) == 10
    for name, module in modules.items():  # each name's module is the one the lazy table imports
        assert module == builtin[name] or module.startswith(builtin[name] + "."), (name, module)
    assert aliases == builtin_aliases  # the static alias table is the classes' own


def test_unknown_algorithms_and_foreign_tables_still_get_the_full_error(tmp_path):
    """The lazy spec parser falls back to every algorithm's sections for the error messages."""
    from dpopt.errors import SpecError
    from dpopt.spec import load_spec

    import pytest

    spec = (REPO / "models" / "quickstart.toml").read_text()
    with pytest.raises(SpecError, match=r"\[mwem\] applies only to algorithm = 'mwem'"):
        load_spec(_write(tmp_path / "a.toml", spec + '\n[mwem]\nrounds = 3\n'))
    with pytest.raises(SpecError, match="algorithm"):
        load_spec(_write(tmp_path / "b.toml", 'algorithm = "mwen"\n' + spec))


def _write(path, text):
    path.write_text(text)
    return path
