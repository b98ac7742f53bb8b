"""Typed, key-checked access to the tables of a spec, with errors that name the file, line and key.

:class:`SpecTable` wraps one TOML table: typed getters (``str``, ``int``, ``budget``, ...) whose
errors read ``spec FILE, line N, key 'a.b[2].c': ...`` and a check that every key is allowed.
:class:`SpecReader` is what an algorithm's ``Params.from_spec`` receives: its own tables, the
parsed common sections and the shared query vocabulary.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from dpopt.errors import DpoptError, PrivacyParameterError, SpecError

if TYPE_CHECKING:
    from fractions import Fraction

__all__ = ["SpecContext", "SpecTable", "SpecReader", "format_path", "type_name", "close_match"]


def format_path(path: Iterable) -> str:
    """``("measure", 1, "share")`` → ``"measure[2].share"`` (array entries counted from 1)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def where(source: Path | None, lines: Mapping[tuple, int], path: tuple) -> str:
    """``spec FILE, line N, key 'a.b'`` (line when known)."""
    parts = [f"spec {source}" if source is not None else "spec"]
    line = line_of(lines, path)
    if line is not None:
        parts.append(f"line {line}")
    if path:
        parts.append(f"key {format_path(path)!r}")
    return ", ".join(parts)


def line_of(lines: Mapping[tuple, int], path: tuple) -> int | None:
    """The line of ``path``, or of its nearest enclosing key."""
    path = tuple(path)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None


@dataclass
class SpecContext:
    """Where a spec came from: its file (for messages), key lines and the directory paths are relative to."""

    source: Path | None
    lines: dict
    base_dir: Path

    def where(self, path: tuple) -> str:
        return where(self.source, self.lines, path)

    def error(self, path: tuple, message: str, cls: type[DpoptError] = SpecError) -> DpoptError:
        return cls(f"{self.where(path)}: {message}")


_MISSING = object()


class SpecTable:
    """One table of the spec: typed getters whose errors name the key, and unknown-key checks.

    Parameters
    ----------
    ctx : SpecContext
    raw : dict
        The table as parsed.
    path : tuple
        Its key path (``("measure", 1)`` for the second ``[[measure]]``).
    keys : iterable of str, optional
        The allowed keys (None: anything goes).
    name : str
        The table's name in messages (``"constraints.invariants"``, an algorithm's own table; ``""`` at the top).
    array : bool
        Whether it is one table of an array (``[[name]]`` in messages).
    """

    def __init__(self, ctx: SpecContext, raw: object, path: tuple, keys: Iterable[str] | None = None,
                 name: str = "", array: bool = False) -> None:
        self.ctx, self.path_, self.name = ctx, tuple(path), name
        if not isinstance(raw, dict):
            raise ctx.error(path, f"must be a table, got {_type_name(raw)} {raw!r}")
        self.raw = raw
        if keys is not None:
            allowed = tuple(keys)
            for key in raw:
                if key not in allowed:
                    hint = _close(key, allowed)
                    at = (f"[[{name}]]" if array else f"[{name}]") if name else "the top level"
                    raise ctx.error(self.path_ + (key,),
                                    f"unknown key{hint}; allowed keys in {at}: {', '.join(allowed)}")

    # errors
    def where(self, sub: tuple) -> str:
        return self.ctx.where(self.path_ + sub)

    def error(self, sub: tuple, message: str, cls: type[DpoptError] = SpecError) -> DpoptError:
        """An error of class ``cls`` whose message starts with the file, line and key of ``sub``."""
        return self.ctx.error(self.path_ + sub, message, cls)

    def _get(self, key: str, required: bool, default):
        if key in self.raw:
            return self.raw[key]
        if required:
            raise self.error((key,), "missing required key")
        return _MISSING if default is _MISSING else default

    # sub-tables
    def table(self, key: str, keys: Iterable[str] | None = None, *, required: bool = False) -> "SpecTable":
        """The sub-table ``[key]`` (empty when absent and not required); ``keys``: its allowed keys."""
        value = self._get(key, required, {})
        return SpecTable(self.ctx, value, self.path_ + (key,), keys, self._name(key))

    def tables(self, key: str, keys: Iterable[str] | None = None, *, required: bool = False) -> list["SpecTable"]:
        """The array of tables ``[[key]]`` (a single inline table counts as an array of one)."""
        value = self._get(key, required, [])
        if isinstance(value, dict):
            value = [value]  # a single inline table is accepted for an array of one
        if not isinstance(value, list):
            raise self.error((key,), f"must be an array of tables, got {_type_name(value)}")
        out = [SpecTable(self.ctx, item, self.path_ + (key, i), keys, self._name(key), array=True)
               for i, item in enumerate(value)]
        if required and not out:
            raise self.error((key,), "must hold at least one table")
        return out

    def _name(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def has(self, key: str) -> bool:
        return key in self.raw

    # scalars
    def str(self, key: str, *, required: bool = False, default=None, choices=None):
        value = self._get(key, required, default)
        if value is default and key not in self.raw:
            return default
        if not isinstance(value, str):
            raise self.error((key,), f"must be a string, got {_type_name(value)} {value!r}")
        if choices is not None and value not in choices:
            raise self.error((key,), f"unknown value {value!r}{_close(value, choices)}; choose one of {list(choices)}")
        return value

    def bool(self, key: str, *, default: bool | None = None) -> bool:
        value = self._get(key, default is None, default)
        if not isinstance(value, bool):
            raise self.error((key,), f"must be true or false, got {_type_name(value)} {value!r}")
        return value

    def int(self, key: str, *, required: bool = False, default=None, minimum: int | None = None):
        value = self._get(key, required, default)
        if value is default and key not in self.raw:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error((key,), f"must be an integer, got {_type_name(value)} {value!r}")
        if minimum is not None and value < minimum:
            raise self.error((key,), f"must be an integer >= {minimum}, got {value}")
        return value

    def float(self, key: str, *, default=None, positive: bool = False):
        value = self._get(key, False, default)
        if value is default and key not in self.raw:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error((key,), f"must be a number, got {_type_name(value)} {value!r}")
        if positive and not value > 0:
            raise self.error((key,), f"must be > 0, got {value}")
        return float(value)

    def budget(self, key: str, *, required: bool = False, unit: bool = False) -> Fraction | None:
        """An exact positive rational (``0.1`` is 1/10; strings such as ``"1/3"`` accepted)."""
        from dpopt.privacy.conversions import as_fraction

        value = self._get(key, required, None)
        if value is None:
            return None
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            raise self.error((key,), f"must be a number or a fraction string such as \"1/3\", got {_type_name(value)} {value!r}")
        try:
            q = as_fraction(value, key)
        except PrivacyParameterError:
            raise self.error((key,), f"must be a number or a fraction string such as \"1/3\", got {value!r}") from None
        if q <= 0 or (unit and q >= 1):
            raise self.error((key,), f"must be {'in (0, 1)' if unit else '> 0'}, got {value!r}")
        return q

    def str_list(self, key: str, *, required: bool = False, default=None, choices=None, allow_empty: bool = False):
        value = self._get(key, required, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error((key,), f"must be a list of strings, got {_type_name(value)} {value!r}")
        if not value and not allow_empty:
            raise self.error((key,), "must not be empty")
        if len(set(value)) != len(value):
            raise self.error((key,), f"names a value twice: {value}")
        for i, v in enumerate(value):
            if choices is not None and v not in choices:
                raise self.error((key, i), f"unknown value {v!r}; choose from {list(choices)}")
        return value

    def number_list(self, key: str) -> list[float]:
        value = self._get(key, True, None)
        if not isinstance(value, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            raise self.error((key,), f"must be a list of numbers, got {_type_name(value)} {value!r}")
        return [float(v) for v in value]

    def bound(self, key: str):
        if key not in self.raw:
            return None
        value = self.raw[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return tuple(self.number_list(key))

    def path(self, key: str, *, must_exist: bool) -> Path:
        value = self.str(key, required=True)
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.ctx.base_dir / path
        if must_exist and not path.is_file():
            raise self.error((key,), f"file {value!r} does not exist (looked for {str(path)!r})")
        return path



def _type_name(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a float"}.get(type(value), type(value).__name__)


def _close(word: str, choices: Iterable[str]) -> str:
    match = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


type_name = _type_name
close_match = _close


class SpecReader:
    """What an algorithm's ``Params.from_spec`` sees.

    Attributes
    ----------
    algorithm : str
        The algorithm's registered name (for messages).
    top : SpecTable
        The whole spec (read only the tables the algorithm declares).
    domain, privacy, constraints
        The parsed common sections (:mod:`dpopt.spec.model`).
    budget : Budget
        The declared budget.
    """

    def __init__(self, top: SpecTable, algorithm: str, sections: Mapping[str, Iterable[str]], *,
                 domain: Any, privacy: Any, constraints: Any, budget: Any) -> None:
        self.top, self.algorithm, self.sections = top, algorithm, dict(sections)
        self.domain, self.privacy, self.constraints, self.budget = domain, privacy, constraints, budget

    def _keys(self, name: str) -> tuple[str, ...]:
        if name not in self.sections:
            raise SpecError(f"algorithm {self.algorithm!r} reads [{name}] but does not declare it in its sections")
        return tuple(self.sections[name])

    def table(self, name: str, *, required: bool = False) -> SpecTable:
        """The algorithm's table ``[name]`` (empty when absent), keys checked against its declaration."""
        return self.top.table(name, self._keys(name), required=required)

    def tables(self, name: str, *, required: bool = False) -> list[SpecTable]:
        """The algorithm's array of tables ``[[name]]``."""
        return self.top.tables(name, self._keys(name), required=required)

    def has(self, name: str) -> bool:
        return name in self.top.raw

    def query(self, table: SpecTable, kinds: Iterable[str] | None = None):
        """A query named in ``table`` (``query = "marginal"``, ``attrs = [...]``, ...) as a QuerySpec."""
        from dpopt.spec.queries import QUERY_KINDS, parse_query

        return parse_query(table, QUERY_KINDS if kinds is None else kinds)

    def error(self, path: tuple, message: str, cls: type[DpoptError] = SpecError) -> DpoptError:
        """An error naming the file, line and key ``path`` (from the top of the spec)."""
        return self.top.ctx.error(tuple(path), message, cls)
