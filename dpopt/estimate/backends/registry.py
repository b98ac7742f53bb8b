"""The registry of solver backends: look one up by name, list what is installed."""

from __future__ import annotations

from dpopt.errors import SolverError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.backends.cvxpy_backend import CvxpyBackend
from dpopt.estimate.backends.highs import HighsBackend
from dpopt.estimate.backends.pulp_backend import PulpBackend
from dpopt.estimate.backends.scipy_backend import ScipyBackend

__all__ = ["BACKENDS", "get_backend", "installed_backends", "available_backends"]

#: Every known backend class by registry name, in order of preference.
BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (HighsBackend, ScipyBackend, CvxpyBackend, PulpBackend)
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
