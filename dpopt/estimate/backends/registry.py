"""The registry of solver backends: look one up by name, list what is installed."""

from __future__ import annotations

from dpopt.errors import SolverError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.backends.clarabel_backend import ClarabelBackend
from dpopt.estimate.backends.cvxpy_backend import CvxpyBackend
from dpopt.estimate.backends.highs import HighsBackend
from dpopt.estimate.backends.pulp_backend import PulpBackend
from dpopt.estimate.backends.scipy_backend import ScipyBackend
from dpopt.estimate.form import LeastSquaresForm, ProgramForm

__all__ = ["BACKENDS", "PREFERRED", "get_backend", "installed_backends", "available_backends", "default_backend"]

#: Every known backend class by registry name, in order of preference.
BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (HighsBackend, ScipyBackend, ClarabelBackend, CvxpyBackend, PulpBackend)
}


def available_backends() -> list[str]:
    """Names of every backend dpopt knows, installed or not."""
    return list(BACKENDS)


def installed_backends() -> list[str]:
    """Names of the backends whose solver is installed, in order of preference."""
    return [name for name, cls in BACKENDS.items() if cls.is_installed()]


def get_backend(name: str) -> Backend:
    """A new instance of the backend called ``name``.

    Raises
    ------
    SolverError
        ``name`` is unknown or its solver is not installed; the message lists the
        installed backends.
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise SolverError(
            f"unknown solver backend {name!r}; installed backends: {installed_backends()} "
            f"(known: {available_backends()})"
        )
    cls = BACKENDS[name]
    if not cls.is_installed():
        raise SolverError(
            f"solver backend {name!r} is not installed; installed backends: {installed_backends()}"
        )
    return cls()


#: Backends tried in order by :func:`default_backend` for each kind. HiGHS's QP solver is an
#: active-set method that slows down sharply with the null-space size (a 2500-cell
#: least-squares QP took 41 s, against 0.1 s for CLARABEL), so QPs go to Clarabel first: called
#: directly (the same solve as cvxpy's CLARABEL, without cvxpy's 1 s import: issue #30), then
#: through cvxpy.
PREFERRED: dict[str, tuple[str, ...]] = {
    "LP": ("highs", "scipy", "cvxpy", "pulp", "clarabel"),
    "MILP": ("highs", "scipy", "cvxpy", "pulp"),
    "QP": ("clarabel", "cvxpy", "highs"),
    "MIQP": ("cvxpy",),
    "LSQ": ("scipy", "cvxpy", "highs"),
}


def default_backend(form: ProgramForm | LeastSquaresForm) -> Backend:
    """The preferred installed backend that supports ``form`` (see :data:`PREFERRED`).

    Raises
    ------
    SolverError
        No installed backend supports the form's kind.
    """
    for name in PREFERRED.get(form.kind, ()):
        if BACKENDS[name].is_installed():
            backend = BACKENDS[name]()
            if backend.supports(form):
                return backend
    raise SolverError(
        f"no installed backend supports {form.kind} forms; installed backends: {installed_backends()}"
    )
