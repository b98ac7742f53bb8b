"""Named categorical attributes and the cell indexing of their product.

Cells are numbered in C order (row-major): the first attribute is the most significant,
matching the lexicographic order of the benchmark count tables. A :class:`Domain` never
materialises its cells; its size is a Python ``int`` so that domains far beyond 2**63
cells can still be described and projected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from dpopt.errors import DomainError

#: Above this many cells a dense vector over the domain is refused; use marginals.
MAX_DENSE_CELLS = 10**8


@dataclass(frozen=True)
class Domain:
    """A product of named categorical attributes.

    Parameters
    ----------
    attrs : sequence of str
        Attribute names, unique and non-empty.
    sizes : sequence of int
        Number of values of each attribute (each at least 1).
    labels : mapping of str to sequence, optional
        Value labels for some attributes; attribute ``a`` takes codes ``0..size-1`` and
        ``labels[a][code]`` is the label of a code.
    codes : iterable of str, optional
        Labelled attributes whose *data* hold codes ``0..size-1`` instead of labels (a coded
        export). Data values are matched to labels as labels, never as positions, unless the
        attribute is declared here. Not part of equality: it says how data are written, not
        which cells exist.

    Examples
    --------
    >>> dom = Domain.from_dict({"sex": ["F", "M"], "age": 3})
    >>> dom.size, dom.shape
    (6, (2, 3))
    >>> dom.cell_index({"sex": 1, "age": 2})
    5
    """

    attrs: tuple[str, ...]
    sizes: tuple[int, ...]
    labels: Mapping[str, tuple] = field(default_factory=dict)
    codes: frozenset = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        attrs = tuple(self.attrs)
        sizes = tuple(self.sizes)
        if len(attrs) == 0:
            raise DomainError("a domain needs at least one attribute")
        if len(attrs) != len(sizes):
            raise DomainError(f"{len(attrs)} attribute names but {len(sizes)} sizes")
        for a in attrs:
            if not isinstance(a, str) or a == "":
                raise DomainError(f"attribute names must be non-empty strings, got {a!r}")
        seen: set[str] = set()
        for a in attrs:
            if a in seen:
                raise DomainError(f"duplicate attribute name {a!r}")
            seen.add(a)
        clean_sizes = []
        for a, s in zip(attrs, sizes):
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or int(s) < 1:
                raise DomainError(f"attribute {a!r}: size must be an integer >= 1, got {s!r}")
            clean_sizes.append(int(s))
        clean_labels = {}
        for a, labs in dict(self.labels).items():
            if a not in seen:
                raise DomainError(f"labels given for unknown attribute {a!r}")
            labs = tuple(labs)
            size = clean_sizes[attrs.index(a)]
            if len(labs) != size:
                raise DomainError(
                    f"attribute {a!r}: {len(labs)} labels do not match its size {size}"
                )
            if len(set(labs)) != len(labs):
                raise DomainError(f"attribute {a!r}: labels are not unique")
            clean_labels[a] = labs
        if isinstance(self.codes, str):
            raise DomainError(f"codes must be a list of attribute names, got {self.codes!r}")
        codes = frozenset(self.codes)
        for a in sorted(codes, key=str):
            if a not in seen:
                raise DomainError(f"codes: unknown attribute {a!r}; the domain has {list(attrs)}")
            if a not in clean_labels:
                raise DomainError(f"codes: attribute {a!r} has no labels, so its values are codes already")
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "sizes", tuple(clean_sizes))
        object.__setattr__(self, "labels", clean_labels)
        object.__setattr__(self, "codes", codes)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, spec: Mapping[str, int | Sequence], codes: Iterable[str] = ()) -> "Domain":
        """Build from ``{name: size}`` or ``{name: [label, ...]}`` (insertion order kept);
        ``codes`` lists labelled attributes whose data hold codes (see the class notes)."""
        attrs, sizes, labels = [], [], {}
        for name, value in spec.items():
            attrs.append(name)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                sizes.append(int(value))
            elif isinstance(value, (list, tuple)):
                sizes.append(len(value))
                labels[name] = tuple(value)
            else:
                raise DomainError(
                    f"attribute {name!r}: expected a size or a list of labels, got {value!r}"
                )
        return cls(tuple(attrs), tuple(sizes), labels, frozenset(codes))

    def with_codes(self, codes: Iterable[str]) -> "Domain":
        """The same domain with ``codes`` declared (see the class notes)."""
        return Domain(self.attrs, self.sizes, self.labels, frozenset(codes))

    @classmethod
    def from_json(cls, path: str | Path) -> "Domain":
        """Read a ``{name: size}`` JSON file (the Private-PGM domain format)."""
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))

    def to_dict(self) -> dict:
        """The inverse of :meth:`from_dict`."""
        return {a: list(self.labels[a]) if a in self.labels else n for a, n in self.config.items()}

    # ---- shape ---------------------------------------------------------------------
    @property
    def config(self) -> dict[str, int]:
        return dict(zip(self.attrs, self.sizes))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.sizes

    @property
    def size(self) -> int:
        """Number of cells, as an exact Python int."""
        out = 1
        for s in self.sizes:
            out *= s
        return out

    def __len__(self) -> int:
        return len(self.attrs)

    def __contains__(self, attr: object) -> bool:
        return attr in self.attrs

    def __iter__(self):
        return iter(self.attrs)

    def size_of(self, attr: str) -> int:
        return self.sizes[self.axis(attr)]

    def axis(self, attr: str) -> int:
        """Position of ``attr``; raises naming the attribute if it is unknown."""
        try:
            return self.attrs.index(attr)
        except ValueError:
            raise DomainError(
                f"unknown attribute {attr!r}; the domain has {list(self.attrs)}"
            ) from None

    def axes(self, attrs: Iterable[str]) -> tuple[int, ...]:
        return tuple(self.axis(a) for a in attrs)

    def check_attrs(self, attrs: Iterable[str]) -> tuple[str, ...]:
        """Validate a list of attribute names: known and without repeats."""
        attrs = tuple(attrs)
        seen = set()
        for a in attrs:
            self.axis(a)
            if a in seen:
                raise DomainError(f"attribute {a!r} named twice in {list(attrs)}")
            seen.add(a)
        return attrs

    def project(self, attrs: Iterable[str]) -> "Domain":
        """The domain of the given attributes, in the order given."""
        attrs = self.check_attrs(attrs)
        if not attrs:
            raise DomainError("cannot project a domain onto no attributes")
        return Domain(
            attrs,
            tuple(self.size_of(a) for a in attrs),
            {a: self.labels[a] for a in attrs if a in self.labels},
            frozenset(a for a in attrs if a in self.codes),
        )

    def canonical(self, attrs: Iterable[str]) -> tuple[str, ...]:
        """The given attributes in domain order (the order marginals are stored in)."""
        attrs = set(self.check_attrs(attrs))
        return tuple(a for a in self.attrs if a in attrs)

    def require_dense(self, what: str = "a dense vector over the domain") -> int:
        """The size, or a :class:`DomainError` when the domain is too large to hold densely."""
        n = self.size
        if n > MAX_DENSE_CELLS:
            raise DomainError(
                f"{what} needs {n:.3g} cells, above the limit of {MAX_DENSE_CELLS:.0e}; "
                "work with marginals of this domain instead"
            )
        return n

    # ---- values ---------------------------------------------------------------------
    def labels_of(self, attr: str) -> tuple:
        """Labels of an attribute (its codes when it has none)."""
        return self.labels.get(attr, tuple(range(self.size_of(attr))))

    def code_of(self, attr: str, value) -> int:
        """The code of a label (or of a code) of ``attr``; raises naming both if unknown."""
        labels = self.labels.get(attr)
        if labels is not None and value in labels:
            return labels.index(value)
        is_code = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if is_code and labels is not None:
            # A number is a label written as a number when some label reads the same ("1" for 1);
            # a bare code only when no label looks like a number (a position is never guessed).
            texts = [str(v) for v in labels]
            if str(int(value)) in texts:
                return texts.index(str(int(value)))
            if any(_looks_numeric(t) for t in texts):
                raise DomainError(
                    f"value {value!r} is not in the domain of attribute {attr!r} (values: "
                    f"{_preview(labels)}); its labels look like numbers, so a number is matched by its text only")
        if is_code and 0 <= int(value) < self.size_of(attr):
            return int(value)
        raise DomainError(
            f"value {value!r} is not in the domain of attribute {attr!r} "
            f"(values: {_preview(self.labels_of(attr))})"
        )

    def cell_index(self, values: Mapping[str, int]) -> int:
        """Cell number of a full assignment of codes."""
        codes = tuple(int(values[a]) for a in self.attrs)
        return int(np.ravel_multi_index(codes, self.sizes))

    def cell_values(self, index: int) -> dict[str, int]:
        """Codes of the attributes at a cell number."""
        n = self.size
        if not 0 <= index < n:
            raise DomainError(f"cell index {index} outside 0..{n - 1}")
        codes = np.unravel_index(int(index), self.sizes)
        return {a: int(c) for a, c in zip(self.attrs, codes)}

    def ravel(self, codes: np.ndarray) -> np.ndarray:
        """Cell numbers of a ``(rows, len(attrs))`` array of codes (vectorised)."""
        codes = np.asarray(codes, dtype=np.int64)
        self.require_dense("cell numbers")
        return np.ravel_multi_index(tuple(codes.T), self.sizes).astype(np.int64)

    def unravel(self, cells: np.ndarray) -> np.ndarray:
        """Codes, shape ``(len(cells), len(attrs))``, of an array of cell numbers."""
        return np.stack(np.unravel_index(np.asarray(cells, dtype=np.int64), self.sizes), axis=1)

    def __repr__(self) -> str:
        inner = ", ".join(f"{a}: {n}" for a, n in zip(self.attrs, self.sizes))
        return f"Domain({inner})"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _preview(values: Sequence, k: int = 8) -> str:
    values = list(values)
    if len(values) <= k:
        return repr(values)
    return repr(values[:k])[:-1] + f", ... ({len(values)} in all)]"
