"""Release specifications: a TOML file (or a dict) describing one release, fully validated.

A spec says what to release and how: the domain, where the data come from, the privacy
budget, the public constraints, the outputs, and the algorithm with its own tables (the
default, ``measure_reconstruct``, reads ``[[measure]]`` and ``[reconstruct]``).
:func:`load_spec` parses and checks its *structure* (known keys, types, ranges, budget shares
summing exactly to 1, installed backend, data file present) without reading any data;
:func:`dpopt.release.plan` then builds the public objects (domain, queries, constraints) and
checks that the constraints are consistent, still before any data is read.

Every error is a :class:`~dpopt.errors.SpecError` (or the relevant
:class:`~dpopt.errors.DpoptError`) whose one-line message names the spec file, the line
(when the spec came from a file) and the key, e.g.
``spec quickstart.toml, line 31, key 'measure[2].share': ...``. Entries of arrays are
numbered from 1 in messages. The reference of every key is ``docs/pages/reference/spec.md``.

Layout: :mod:`~dpopt.spec.toml_lines` (line numbers of keys), :mod:`~dpopt.spec.table`
(typed, key-checked tables; the reader algorithms parse their tables with),
:mod:`~dpopt.spec.queries` (the query vocabulary), :mod:`~dpopt.spec.model` (the parsed
sections), :mod:`~dpopt.spec.sections` (the common sections) and :mod:`~dpopt.spec.load`.
"""

from dpopt.spec.load import (
    DEFAULT_ALGORITHM,
    all_section_keys,
    list_models,
    load_spec,
    models_dir,
    parse_spec,
    parse_spec_text,
    resolve_spec_path,
)
from dpopt.spec.model import (
    ConstraintsSpec,
    DataSpec,
    DomainSpec,
    HierarchySpec,
    InequalitySpec,
    InvariantSpec,
    MeasureSpec,
    OutputSpec,
    PrivacySpec,
    ReconstructSpec,
    ReleaseSpec,
    ZeroSpec,
)
from dpopt.spec.queries import QUERY_KINDS, QuerySpec, build_query, parse_query
from dpopt.spec.sections import COMMON_KEYS, data_format, parse_reconstruct
from dpopt.spec.table import SpecReader, SpecTable, format_path
from dpopt.spec.toml_lines import key_lines

__all__ = [
    "load_spec", "parse_spec", "parse_spec_text", "models_dir", "list_models", "resolve_spec_path",
    "all_section_keys", "DEFAULT_ALGORITHM", "ReleaseSpec", "DomainSpec", "DataSpec", "PrivacySpec",
    "MeasureSpec", "ZeroSpec", "HierarchySpec", "InvariantSpec", "InequalitySpec", "ConstraintsSpec",
    "ReconstructSpec", "OutputSpec", "QuerySpec", "QUERY_KINDS", "parse_query", "build_query",
    "COMMON_KEYS", "data_format", "parse_reconstruct", "SpecReader", "SpecTable", "format_path", "key_lines",
]
