"""Predicates over attribute values: which cells (or records) satisfy a condition.

A :class:`Predicate` is built from a dict ``{attr: value or [values]}`` (a conjunction of
memberships) or parsed from a Python-like boolean expression with :mod:`ast` (never
``eval``)::

    age < 15 and relationship == 'spouse'
    relationship in ['householder', 'spouse'] and not (sex == 'F' or age >= 65)
    15 <= age < 65
    attr('marital-status') != 'never married'     # names that are not identifiers

Grammar: comparisons ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` between an attribute and a
literal (chains such as ``a < x <= b`` are conjunctions), ``in`` / ``not in`` with a list,
tuple or set literal, combined with ``and``, ``or``, ``not`` and parentheses. Literals are
strings, numbers and booleans. Values are labels, or codes for attributes without labels
(and for attributes whose labels are not integers), resolved by
:meth:`~dpopt.model.domain.Domain.code_of`; an unknown attribute or value raises
:class:`~dpopt.errors.DomainError` naming it.

Ordered comparisons (``<``, ``<=``, ``>``, ``>=``) compare the **labels** as numbers when
every label of the attribute is a number (``age < 15`` on labels ``0, 1, ..., 90``; the
literal need not be a label); otherwise they compare **codes**: an attribute without labels
compares its codes with the number, and an attribute with other labels compares codes after
turning the literal into a code (``edu < 'college'`` holds for the codes before that of
``'college'``).

Every evaluation works one attribute at a time: each comparison gives a boolean vector over
the values of its attribute, and the vectors are combined by broadcasting (for masks over a
marginal) or by indexing (for records), never by enumerating cells in Python.
"""

from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping

import numpy as np

from dpopt.errors import DataError, DomainError, QueryError, confidential_values
from dpopt.model.domain import Domain

_COMPARE_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ORDERED = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _plain(value: object) -> object:
    """Numpy scalars as Python scalars (for stable text and hashing)."""
    return value.item() if isinstance(value, np.generic) else value


def attr_text(name: str) -> str:
    """How an attribute is written in predicate text: bare, or ``attr('name')``."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    return f"attr({name!r})"


# ---- the expression tree --------------------------------------------------------------------
class _Node:
    def names(self) -> list[str]:
        raise NotImplementedError  # pragma: no cover

    def combine(self, leaf: Callable[["_Test"], np.ndarray]) -> np.ndarray:
        raise NotImplementedError  # pragma: no cover

    def text(self) -> str:
        raise NotImplementedError  # pragma: no cover


@dataclass(frozen=True)
class _Test(_Node):
    """One comparison of one attribute with a literal (or a tuple of them for ``in``)."""

    attr: str
    op: str
    value: object

    def names(self) -> list[str]:
        return [self.attr]

    def combine(self, leaf: Callable[["_Test"], np.ndarray]) -> np.ndarray:
        return leaf(self)

    def text(self) -> str:
        if self.op in ("in", "not in"):
            inner = ", ".join(repr(v) for v in self.value)  # type: ignore[attr-defined]
            return f"{attr_text(self.attr)} {self.op} [{inner}]"
        return f"{attr_text(self.attr)} {self.op} {self.value!r}"

    def truth(self, domain: Domain) -> np.ndarray:
        """Whether each value (code) of the attribute satisfies the comparison."""
        size = domain.size_of(self.attr)
        if self.op in ("in", "not in", "==", "!="):
            values = self.value if self.op in ("in", "not in") else (self.value,)
            vec = np.zeros(size, dtype=bool)
            vec[[domain.code_of(self.attr, v) for v in values]] = True  # type: ignore[union-attr]
            return ~vec if self.op in ("not in", "!=") else vec
        compare = _ORDERED[self.op]
        labels = domain.labels.get(self.attr)
        if labels is not None and all(_is_number(v) for v in labels):
            if not _is_number(self.value):
                raise DomainError(
                    f"attribute {self.attr!r} has numeric labels; '{self.op}' needs a number, "
                    f"got {self.value!r}"
                )
            return compare(np.asarray(labels, dtype=np.float64), float(self.value))  # type: ignore[arg-type]
        codes = np.arange(size)
        if labels is None and _is_number(self.value):
            return compare(codes, self.value)
        return compare(codes, domain.code_of(self.attr, self.value))


@dataclass(frozen=True)
class _Junction(_Node):
    """Children joined by one logical operator (``and`` / ``or``)."""

    children: tuple[_Node, ...]
    word: ClassVar[str]
    combine_two: ClassVar[Callable[[np.ndarray, np.ndarray], np.ndarray]]

    def names(self) -> list[str]:
        return [a for c in self.children for a in c.names()]

    def combine(self, leaf: Callable[[_Test], np.ndarray]) -> np.ndarray:
        out = self.children[0].combine(leaf)
        for c in self.children[1:]:
            out = type(self).combine_two(out, c.combine(leaf))
        return out

    def text(self) -> str:
        # "and" binds tighter than "or": an "or" inside an "and" needs parentheses.
        parts = (f"({c.text()})" if self.word == "and" and isinstance(c, _Or) else c.text() for c in self.children)
        return f" {self.word} ".join(parts)


@dataclass(frozen=True)
class _And(_Junction):
    word: ClassVar[str] = "and"
    combine_two = np.logical_and


@dataclass(frozen=True)
class _Or(_Junction):
    word: ClassVar[str] = "or"
    combine_two = np.logical_or


@dataclass(frozen=True)
class _Not(_Node):
    child: _Node

    def names(self) -> list[str]:
        return self.child.names()

    def combine(self, leaf: Callable[[_Test], np.ndarray]) -> np.ndarray:
        return np.logical_not(self.child.combine(leaf))

    def text(self) -> str:
        inner = self.child.text()
        return f"not {inner}" if isinstance(self.child, (_Test, _Not)) else f"not ({inner})"


# ---- parsing ---------------------------------------------------------------------------------
class _Parser:
    """Turns the :mod:`ast` of an expression into a tree of the nodes above (no ``eval``)."""

    def __init__(self, text: str) -> None:
        self.source = text

    def fail(self, node: ast.AST, why: str) -> QueryError:
        snippet = ast.get_source_segment(self.source, node) or ast.dump(node)
        return QueryError(f"predicate {self.source!r}: {why}: {snippet!r}")

    def parse(self) -> _Node:
        try:
            tree = ast.parse(self.source.strip(), mode="eval")
        except SyntaxError as exc:
            raise QueryError(f"predicate {self.source!r} is not a valid expression: {exc.msg}") from None
        self.source = self.source.strip()
        return self.node(tree.body)

    def node(self, node: ast.AST) -> _Node:
        if isinstance(node, ast.BoolOp):
            kids = tuple(self.node(v) for v in node.values)
            return _And(kids) if isinstance(node.op, ast.And) else _Or(kids)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _Not(self.node(node.operand))
        if isinstance(node, ast.Compare):
            return self.compare(node)
        raise self.fail(node, "expected a comparison, 'and', 'or' or 'not'")

    def attr_name(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "attr"
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value
        return None

    def literal(self, node: ast.AST) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
            return node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and _is_number(node.operand.value)
        ):
            return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
        if isinstance(node, ast.Name):
            raise self.fail(node, "a bare name where a value was expected (quote string values)")
        raise self.fail(node, "expected a string, number or boolean literal")

    def compare(self, node: ast.Compare) -> _Node:
        tests: list[_Node] = []
        operands = [node.left, *node.comparators]
        for left, op_node, right in zip(operands[:-1], node.ops, operands[1:]):
            op = _COMPARE_OPS.get(type(op_node))
            if op is None:
                raise self.fail(node, f"unsupported operator {type(op_node).__name__}")
            la, ra = self.attr_name(left), self.attr_name(right)
            if la is not None and ra is not None:
                raise self.fail(
                    node, "a comparison between two names (an attribute is compared with a literal; quote string values)"
                )
            if la is None and ra is None:
                raise self.fail(node, "a comparison without an attribute")
            if op in ("in", "not in"):
                if la is None:
                    raise self.fail(node, f"'{op}' needs the attribute on its left")
                if not isinstance(right, (ast.List, ast.Tuple, ast.Set)):
                    raise self.fail(right, f"'{op}' needs a list, tuple or set literal")
                values = tuple(self.literal(e) for e in right.elts)
                if not values:
                    raise self.fail(right, f"'{op}' with an empty list")
                tests.append(_Test(la, op, values))
                continue
            if la is None:
                la, op, right = ra, _FLIPPED[op], left
            if isinstance(right, (ast.List, ast.Tuple, ast.Set)):
                raise self.fail(right, f"'{op}' with a list (use 'in')")
            tests.append(_Test(la, op, self.literal(right)))  # type: ignore[arg-type]
        return tests[0] if len(tests) == 1 else _And(tuple(tests))


# ---- the public object -------------------------------------------------------------------
class Predicate:
    """A condition on attribute values; see the module notes for the syntax and semantics.

    Build one with :meth:`parse`, :meth:`from_dict` or :func:`as_predicate`; combine with
    ``&``, ``|`` and ``~``. A predicate given a domain (at construction or by :meth:`bind`)
    is validated against it at once and lists :attr:`attrs` in domain order.
    """

    def __init__(self, node: _Node, text: str, domain: Domain | None = None) -> None:
        self._node = node
        self._text = text
        self._domain: Domain | None = None
        if domain is not None:
            if not isinstance(domain, Domain):
                raise QueryError(f"predicate {text!r}: expected a Domain, got {type(domain).__name__}")
            self._validate(domain)
            self._domain = domain

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, domain: Domain | None = None) -> "Predicate":
        """Parse an expression such as ``"age < 15 and relationship == 'spouse'"``."""
        if not isinstance(text, str):
            raise QueryError(f"a predicate expression must be a string, got {type(text).__name__}")
        parser = _Parser(text)
        node = parser.parse()
        return cls(node, parser.source, domain)

    @classmethod
    def from_dict(cls, spec: Mapping, domain: Domain | None = None) -> "Predicate":
        """``{attr: value}`` (equality) or ``{attr: [values]}`` (membership), all of them."""
        if not isinstance(spec, Mapping) or not spec:
            raise QueryError(f"a predicate dict must be a non-empty mapping, got {spec!r}")
        tests: list[_Node] = []
        for attr, value in spec.items():
            if not isinstance(attr, str):
                raise QueryError(f"predicate dict: attribute names must be strings, got {attr!r}")
            if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
                if isinstance(value, np.ndarray):
                    seq = value.ravel().tolist()
                elif isinstance(value, (set, frozenset)):
                    seq = sorted(value, key=repr)  # a stable text for an unordered set
                else:
                    seq = list(value)
                values = tuple(_plain(v) for v in seq)
                if not values:
                    raise QueryError(f"predicate dict: the value list of {attr!r} is empty")
                tests.append(_Test(attr, "in", values))
            else:
                tests.append(_Test(attr, "==", _plain(value)))
        node = tests[0] if len(tests) == 1 else _And(tuple(tests))
        return cls(node, node.text(), domain)

    def bind(self, domain: Domain) -> "Predicate":
        """The same predicate validated against ``domain`` (attributes then in domain order)."""
        return Predicate(self._node, self._text, domain)

    # ---- description ----------------------------------------------------------------
    @property
    def domain(self) -> Domain | None:
        return self._domain

    @property
    def attrs(self) -> tuple[str, ...]:
        """Attributes used: in domain order when bound, else in order of appearance."""
        names = self._unique_names()
        return self._domain.canonical(names) if self._domain is not None else names

    def _unique_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._node.names()))

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Predicate({self._text!r})"

    def __and__(self, other: "Predicate") -> "Predicate":
        other = _check_other(other, "&")
        return Predicate(_And((self._node, other._node)), f"({self}) and ({other})", self._domain)

    def __or__(self, other: "Predicate") -> "Predicate":
        other = _check_other(other, "|")
        return Predicate(_Or((self._node, other._node)), f"({self}) or ({other})", self._domain)

    def __invert__(self) -> "Predicate":
        return Predicate(_Not(self._node), f"not ({self})", self._domain)

    # ---- evaluation -----------------------------------------------------------------
    def _resolve(self, domain: Domain | None) -> Domain:
        if domain is None:
            if self._domain is None:
                raise QueryError(f"predicate {self._text!r}: no domain given and none bound")
            return self._domain
        if not isinstance(domain, Domain):
            raise QueryError(f"predicate {self._text!r}: expected a Domain, got {type(domain).__name__}")
        return domain

    def _validate(self, domain: Domain) -> None:
        domain.check_attrs(self._unique_names())
        # Evaluate every comparison once (unknown values raise); the results are discarded.
        self._node.combine(lambda t: np.bool_(t.truth(domain).any()))

    def mask(self, domain: Domain | None = None) -> np.ndarray:
        """Where the predicate holds, over the cells of ``domain.project(attrs)`` (domain order).

        Returns
        -------
        ndarray of bool, shape (domain.project(attrs).size,), C order.
        """
        dom = self._resolve(domain)
        return self._broadcast(dom, dom.canonical(self._unique_names()))

    def full_mask(self, domain: Domain | None = None) -> np.ndarray:
        """Where the predicate holds, over every cell of ``domain`` (C order)."""
        dom = self._resolve(domain)
        dom.require_dense("a predicate mask over every cell")
        dom.check_attrs(self._unique_names())
        return self._broadcast(dom, dom.attrs)

    def _broadcast(self, dom: Domain, attrs: tuple[str, ...]) -> np.ndarray:
        shape = tuple(dom.size_of(a) for a in attrs)

        def leaf(test: _Test) -> np.ndarray:
            where = [1] * len(attrs)
            where[attrs.index(test.attr)] = -1
            return test.truth(dom).reshape(where)

        out = self._node.combine(leaf)
        return np.broadcast_to(out, shape).reshape(-1).copy()

    def evaluate(self, codes: np.ndarray, domain: Domain | None = None) -> np.ndarray:
        """Whether each record satisfies the predicate.

        Parameters
        ----------
        codes : ndarray of int, shape (n, len(domain))
            Records as codes, columns in domain order.
        """
        dom = self._resolve(domain)
        arr = np.asarray(codes)
        if arr.ndim != 2 or arr.shape[1] != len(dom):
            raise DataError(
                f"predicate {self._text!r}: records must have shape (n, {len(dom)}), got {arr.shape}"
            )
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"predicate {self._text!r}: codes must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False)
        dom.check_attrs(self._unique_names())
        for a in self._unique_names():
            col = arr[:, dom.axis(a)]
            bad = (col < 0) | (col >= dom.size_of(a))
            if bad.any():
                raise DataError(f"predicate {self._text!r}: column {a!r} holds codes outside "
                                f"0..{dom.size_of(a) - 1}" + confidential_values(col[bad]))

        def leaf(test: _Test) -> np.ndarray:
            return test.truth(dom)[arr[:, dom.axis(test.attr)]]

        return np.broadcast_to(self._node.combine(leaf), (arr.shape[0],)).copy()


def _check_other(other: object, op: str) -> Predicate:
    if not isinstance(other, Predicate):
        raise QueryError(f"cannot combine a Predicate with {type(other).__name__} by '{op}'")
    return other


def as_predicate(spec: Predicate | str | Mapping, domain: Domain | None = None) -> Predicate:
    """A :class:`Predicate` from a predicate, an expression string or a dict (bound to ``domain`` if given)."""
    if isinstance(spec, Predicate):
        return spec.bind(domain) if domain is not None else spec
    if isinstance(spec, str):
        return Predicate.parse(spec, domain)
    if isinstance(spec, Mapping):
        return Predicate.from_dict(spec, domain)
    raise QueryError(f"a predicate must be a Predicate, a string or a dict, got {type(spec).__name__}")
