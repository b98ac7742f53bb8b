"""One backend policy, the incremental LP as a capability, one proportional fitting, quiet solvers
(issue 11 deliver 4, issue 13 deliver 5)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dpopt.estimate.engines.entropy as entropy_module
import dpopt.estimate.engines.linear as linear_module
import dpopt.estimate.engines.mw_step as mw_module
from dpopt.errors import SolverError
from dpopt.estimate import BACKENDS_FOR, OBJECTIVES, reconstruct
from dpopt.estimate.backends import BACKENDS, PREFERRED, get_backend, installed_backends
from dpopt.estimate.policy import (
    OWN_METHODS,
    backends_for,
    choose_backend,
    installed_backends_for,
)
from dpopt.estimate.engines.proportional import (
    BoostSchedule,
    counting_invariant,
    proportional_fit,
)
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total, Weighted

ROOT = Path(__file__).resolve().parents[1]


def test_objective_backends_come_from_the_one_preference_table():
    assert set(BACKENDS_FOR) == set(OBJECTIVES)
    assert BACKENDS_FOR["l1"] == BACKENDS_FOR["linf"] == PREFERRED["LP"]
    assert BACKENDS_FOR["l2"][0] == PREFERRED["QP"][0] == "clarabel"
    assert set(BACKENDS_FOR["l2"]) == set(PREFERRED["QP"]) | set(PREFERRED["LSQ"])
    assert BACKENDS_FOR["entropy"] == OWN_METHODS["entropy"] == ("exact", "mw")
    for objective in OBJECTIVES:
        assert backends_for(objective) == BACKENDS_FOR[objective]
        assert set(installed_backends_for(objective)) <= set(BACKENDS_FOR[objective])


def test_engines_follow_the_table(monkeypatch):
    """Reordering PREFERRED changes the backend every engine picks by default: no engine keeps a
    default of its own."""
    dom = Domain(("a", "b"), (3, 4))
    gen = np.random.default_rng(0)
    truth = gen.integers(0, 20, dom.size).astype(float)
    ms = [Measurement(Marginal(dom, [a]), Marginal(dom, [a]).matvec(truth) + gen.normal(0, 1, dom.size_of(a)),
                      "gaussian", 1.0, 1.0, label=a) for a in dom.attrs]
    cs = ConstraintSet(dom, [NonNegativity()])
    assert reconstruct(ms, cs, "l1").backend == "highs"
    assert reconstruct(ms, cs, "l2").backend == "clarabel"
    monkeypatch.setitem(PREFERRED, "LP", ("scipy", "highs"))
    monkeypatch.setitem(PREFERRED, "QP", ("highs", "clarabel", "cvxpy"))
    assert reconstruct(ms, cs, "l1").backend == "scipy"
    assert reconstruct(ms, cs, "l2").backend == "highs"
    assert choose_backend("LP").name == "scipy"
    with pytest.raises(SolverError, match="does not solve QP"):
        choose_backend("QP", "scipy")


def test_incremental_lp_is_a_backend_capability():
    assert "IncrementalLP" not in inspect.getsource(linear_module)
    for name in installed_backends():
        backend = get_backend(name)
        assert backend.incremental == (name == "highs"), name
        if not backend.incremental:
            assert backend.incremental_lp(None) is None
    assert BACKENDS["highs"].incremental


def test_one_proportional_fitting_and_one_boost_schedule():
    for module in (entropy_module, mw_module):
        source = inspect.getsource(module)
        assert "proportional_fit" in source and "BoostSchedule" in source
        assert "def _project" not in source and "def _ipf_ready" not in source
    # Raking a 2 x 2 table to both margins (closed form: the margins' product for a uniform start).
    dom = Domain(("a", "b"), (2, 2))
    invariants = [counting_invariant(Marginal(dom, ["a"]), [30.0, 70.0], "a"),
                  counting_invariant(Marginal(dom, ["b"]), [40.0, 60.0], "b")]
    x = proportional_fit(np.full(4, 25.0), invariants, sweeps=50)
    np.testing.assert_allclose(x, np.outer([0.3, 0.7], [40.0, 60.0]).ravel(), rtol=1e-12)
    schedule = BoostSchedule(max_boost=4.0, loss=10.0)
    assert schedule.accept(9.0) and schedule.boost == 1.5
    assert schedule.accept(8.0) and schedule.boost == 2.25
    assert not schedule.accept(9.0) and schedule.boost == 1.0  # undone: back to the paper's step
    with pytest.raises(SolverError, match="proportional fitting"):
        counting_invariant(Weighted(Total(dom), 2.0), [1.0], "twice the total")


BANNER_SCRIPT = """
import sys
import numpy as np
from dpopt.estimate import reconstruct, round_to_integers
from dpopt.estimate.backends import get_backend
from dpopt.estimate.form import ProgramForm
from dpopt.model.constraints import ConstraintSet, Integrality, Invariant, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total, Weighted

verbose = sys.argv[1] == "verbose"
dom = Domain(("a", "b"), (3, 4))
m = Measurement(Marginal(dom, ["a"]), [3.0, 4.0, 5.0], "gaussian", 1.0, 1.0, label="a")
reconstruct([m], ConstraintSet(dom, [NonNegativity()]), "l1", backend="highs", verbose=verbose)
reconstruct([m], ConstraintSet(dom, [NonNegativity()]), "l1", backend="pulp", verbose=verbose)
milp = ProgramForm(c=[1.0, 1.0], A=np.array([[1.0, 2.0]]), row_lower=[3.5], row_upper=[np.inf], row_names=["r"],
                   integrality=[True, True])
get_backend("cvxpy").solve(milp, solver="HIGHS", verbose=verbose)
print("done")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_solver_banners_only_when_verbose(verbose):
    """HiGHS printed "Running HiGHS ..." on every run, -q or not (issue 13): silent by default (HiGHS
    directly and through cvxpy, CBC), the solvers' logs with verbose=True."""
    if not {"highs", "cvxpy", "pulp"} <= set(installed_backends()):
        pytest.skip("needs highspy, cvxpy and pulp installed")
    run = subprocess.run([sys.executable, "-c", BANNER_SCRIPT, "verbose" if verbose else "quiet"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("done")
    printed = run.stdout + run.stderr
    if verbose:
        assert "HiGHS" in printed
    else:
        assert "HiGHS" not in printed and "Cbc" not in printed and "CLARABEL" not in printed, printed[:2000]
