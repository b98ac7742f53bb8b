"""Exceptions and warnings raised by dpopt, and the rule for confidential values in messages.

Input errors are exceptions; solver outcomes such as infeasibility are statuses on a result
(see :mod:`dpopt.estimate.result`). Every message names the offending column, value,
constraint, key or solver, except that a message about the confidential data never holds a
value read from it unless the user asked for it (:func:`confidential_values_shown`, the
``--show-confidential`` option of ``dpopt run`` and ``dpopt check``, ``show_confidential=True``
in the Python API), and never a count of rows or records: messages end up in shared logs.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterable, Iterator


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


class DataWarning(UserWarning):
    """Something about the confidential data (or the budget against it) that the user should know
    before any budget is spent. Like every message, it holds no value or count from the data."""


class MemoryWarning(UserWarning):
    """A planned release needs more memory than the machine has available at the moment (the plan is
    accepted or refused by the machine's memory, not the moment's: :mod:`dpopt.release.resources`)."""


# ---- confidential values in messages ---------------------------------------------------------------------

#: Whether messages about the confidential data may quote its values (never its counts). Off by default;
#: set for a block by :func:`confidential_values_shown`.
SHOW_CONFIDENTIAL: ContextVar[bool] = ContextVar("dpopt_show_confidential", default=False)

#: What a message says in place of confidential values when they are not to be shown.
HIDDEN_VALUES = "the values are confidential and not shown: --show-confidential or show_confidential=True lists them"


@contextlib.contextmanager
def confidential_values_shown(show: bool = True) -> Iterator[None]:
    """Within the block, errors about the data quote its offending values (``show=True``) or not."""
    token = SHOW_CONFIDENTIAL.set(bool(show))
    try:
        yield
    finally:
        SHOW_CONFIDENTIAL.reset(token)


def showing_confidential() -> bool:
    """True inside :func:`confidential_values_shown`: messages may quote the data's values."""
    return SHOW_CONFIDENTIAL.get()


def confidential_values(values: Iterable, limit: int = 10) -> str:
    """``": '7', 'x' and 2 more"`` when values may be shown, else ``" (" + HIDDEN_VALUES + ")"``.

    The values are distinct, sorted by their text (never by how often they occur) and carry no
    counts; the text is meant to follow a phrase such as ``"column 'age' holds values outside the
    domain"``.
    """
    if not showing_confidential():
        return f" ({HIDDEN_VALUES})"
    texts = sorted({str(v) for v in values})
    shown = ", ".join(repr(t) for t in texts[:limit])
    more = f" and {len(texts) - limit} more" if len(texts) > limit else ""
    return f": {shown}{more}"
