"""Exceptions raised by dpopt.

Input errors are exceptions; solver outcomes such as infeasibility are statuses on a result
(see :mod:`dpopt.estimate.result`). Every message names the offending column, value,
constraint, key or solver.
"""


class DpoptError(Exception):
    """Base class of every error dpopt raises on purpose."""


class DomainError(DpoptError, ValueError):
    """A domain is malformed, or an attribute or value is not in it."""


class DataError(DpoptError, ValueError):
    """Records or counts do not fit the domain (missing columns, NaN, out-of-domain values)."""


class QueryError(DpoptError, ValueError):
    """A query does not fit its domain or its arguments are malformed."""


class PrivacyParameterError(DpoptError, ValueError):
    """A privacy parameter (epsilon, delta, rho, scale) is out of range."""


class BudgetExceededError(DpoptError):
    """A charge would exceed the accountant's remaining budget. No noise has been drawn."""


class InconsistentConstraintsError(DpoptError, ValueError):
    """Declared constraints contradict each other. The message names them."""


class SolverError(DpoptError, RuntimeError):
    """A solver backend is missing, crashed, or was called with an unknown option."""


class SpecError(DpoptError, ValueError):
    """A release specification is malformed. The message names the key."""


class ParameterError(DpoptError, ValueError):
    """An algorithm was given a bad option (unknown name, wrong type, out of range). The message names it."""


def at_key(exc: DpoptError, path) -> DpoptError:
    """Tag an error with the spec key path it concerns (the release pipeline names it in the message)."""
    exc.spec_path = tuple(path)
    return exc
