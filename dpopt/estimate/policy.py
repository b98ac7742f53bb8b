"""The one backend-default policy every engine follows.

A consistency objective compiles to canonical forms (:mod:`dpopt.estimate.form`), and the
backends that may solve it are the ones that solve those forms, in the order of the single
preference table :data:`dpopt.estimate.backends.registry.PREFERRED` (by form kind). Two
objectives are solved by dpopt's own algorithms rather than a solver adapter: ``entropy``
(``"exact"``: a least-squares fit, then an exponential-cone program on its optimal face;
``"mw"``: multiplicative weights) and ``smooth`` (``"newton"``: Newton's method on the
dual). Engines never name a default solver themselves: they call :func:`choose_backend`
with the form they built (or its kind) and the user's request, if any.
"""

from __future__ import annotations

from dpopt.errors import SolverError
from dpopt.estimate.backends.base import Backend
from dpopt.estimate.backends.registry import (
    BACKENDS,
    PREFERRED,
    default_backend,
    get_backend,
    installed_backends,
)
from dpopt.estimate.form import LeastSquaresForm, ProgramForm

__all__ = [
    "BACKENDS_FOR",
    "OBJECTIVE_FORMS",
    "OWN_METHODS",
    "backends_for",
    "check_backend",
    "choose_backend",
    "installed_backends_for",
]

#: The canonical form kinds each objective compiles to (the L2 engine uses a QP, or bounded
#: least squares when the problem is too large for an explicit matrix).
OBJECTIVE_FORMS: dict[str, tuple[str, ...]] = {
    "l2": ("QP", "LSQ"), "l1": ("LP",), "linf": ("LP",), "entropy": (), "smooth": (),
}
#: Objectives solved by dpopt's own algorithms: their method names (the first is the default).
OWN_METHODS: dict[str, tuple[str, ...]] = {"entropy": ("exact", "mw"), "smooth": ("newton",)}


def backends_for(objective: str) -> tuple[str, ...]:
    """Every backend (or own method) that solves ``objective``; the first is the default."""
    names: list[str] = list(OWN_METHODS.get(objective, ()))
    for kind in OBJECTIVE_FORMS[objective]:
        names += [n for n in PREFERRED[kind] if n not in names]
    return tuple(names)


#: Which backends serve which objective, derived from :data:`PREFERRED` (the first is the default).
BACKENDS_FOR: dict[str, tuple[str, ...]] = {objective: backends_for(objective) for objective in OBJECTIVE_FORMS}


def installed_backends_for(objective: str) -> list[str]:
    """The backends of :func:`backends_for` that this machine can run (own methods always can)."""
    own = OWN_METHODS.get(objective, ())
    installed = set(installed_backends())
    return [b for b in backends_for(objective) if b in own or b in installed]


def check_backend(objective: str, backend: str | None) -> None:
    """Raise SolverError unless ``backend`` (None: the default) can solve ``objective`` here."""
    if backend is None:
        return
    allowed = backends_for(objective)
    if backend not in allowed:
        raise SolverError(
            f"backend {backend!r} does not solve the {objective!r} objective; use one of {list(allowed)} "
            f"(installed: {installed_backends()})"
        )
    if backend not in OWN_METHODS.get(objective, ()):
        get_backend(backend)  # raises, listing what is installed, when it is missing


def choose_backend(form: ProgramForm | LeastSquaresForm | str, requested: str | None = None) -> Backend:
    """The backend that solves ``form`` (a form or a kind such as ``"LP"``): ``requested`` when
    given (checked), else the preferred installed one (:func:`~dpopt.estimate.backends.default_backend`)."""
    kind = form if isinstance(form, str) else form.kind
    if requested is not None:
        backend = get_backend(requested)
        ok = backend.supports(form) if not isinstance(form, str) else kind in backend.kinds
        if not ok:
            raise SolverError(f"backend {requested!r} does not solve {kind} forms; it supports {sorted(backend.kinds)}")
        return backend
    if isinstance(form, str):
        for name in PREFERRED.get(kind, ()):
            if BACKENDS[name].is_installed():
                return BACKENDS[name]()
        raise SolverError(f"no installed backend supports {kind} forms; installed backends: {installed_backends()}")
    return default_backend(form)
