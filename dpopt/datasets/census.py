"""A synthetic census-like person file: dpopt's own example data.

Nothing here comes from real people. :func:`generate_census` draws a person file from a small,
hand-written model of households (a householder, perhaps a spouse, children, other relatives,
nonrelatives) and of group-quarters residents, spread over a two-level geography
(state → county) with uneven, Zipf-like unit sizes. The file has the shape of the person files
used by the 2020 US Census TopDown release (geography, age, sex, relationship, household type)
so that examples, tests and benchmarks can exercise hierarchies, structural zeros and invariants.

The structural zeros (combinations that cannot occur) are public facts about the domain, written
as predicate strings over labels (:data:`STRUCTURAL_ZEROS`, :func:`structural_zero_rules`). The
generator does not read those strings: it checks its output with a direct, vectorised
implementation of the same rules (:func:`structural_zero_rule_masks`), so that this module works
on its own; the tests check that both agree.

The randomness here is *not* privacy noise: it only makes up public example data, from a seeded
``numpy.random.Generator(PCG64(seed))`` so that the same seed always gives the same file.
"""

from __future__ import annotations

import os
import tempfile
from math import ceil
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from dpopt.errors import DataError, DomainError, DpoptError, confidential_values
from dpopt.model.domain import Domain

# ---- labels ----------------------------------------------------------------------------------

AGE_GROUPS: tuple[str, ...] = ("0-14", "15-17", "18-24", "25-44", "45-64", "65+")
SEXES: tuple[str, ...] = ("F", "M")
RELATIONSHIPS: tuple[str, ...] = (
    "householder",
    "spouse",
    "child",
    "other relative",
    "nonrelative",
    "group quarters",
)
HOUSEHOLD_TYPES: tuple[str, ...] = (
    "married couple",
    "other family",
    "alone",
    "nonfamily",
    "group quarters",
)

#: Column order of the generated file, which is also the attribute order of its domain.
CENSUS_ATTRS: tuple[str, ...] = (
    "state",
    "county",
    "age_group",
    "sex",
    "relationship",
    "household_type",
)

_FIXED_LABELS: dict[str, tuple[str, ...]] = {
    "age_group": AGE_GROUPS,
    "sex": SEXES,
    "relationship": RELATIONSHIPS,
    "household_type": HOUSEHOLD_TYPES,
}

# Codes of the labels the rules and the generator refer to (positions in the tuples above).
_AGE_0_14 = AGE_GROUPS.index("0-14")
_F, _M = SEXES.index("F"), SEXES.index("M")
_HOUSEHOLDER = RELATIONSHIPS.index("householder")
_SPOUSE = RELATIONSHIPS.index("spouse")
_CHILD = RELATIONSHIPS.index("child")
_OTHER_RELATIVE = RELATIONSHIPS.index("other relative")
_NONRELATIVE = RELATIONSHIPS.index("nonrelative")
_REL_GQ = RELATIONSHIPS.index("group quarters")
_MARRIED = HOUSEHOLD_TYPES.index("married couple")
_OTHER_FAMILY = HOUSEHOLD_TYPES.index("other family")
_ALONE = HOUSEHOLD_TYPES.index("alone")
_NONFAMILY = HOUSEHOLD_TYPES.index("nonfamily")
_TYPE_GQ = HOUSEHOLD_TYPES.index("group quarters")

# ---- structural zeros ------------------------------------------------------------------------

#: Structural-zero rules that do not depend on the geography, as ``(predicate, reason)``.
#: A record matching a predicate cannot exist. Predicates are Python boolean expressions over
#: labels (``==``, ``!=``, ``in``, ``not in``, ``and``, ``or``, ``not``, parentheses).
#: :func:`structural_zero_rules` adds the geography-nesting rules of a given domain.
STRUCTURAL_ZEROS: tuple[tuple[str, str], ...] = (
    (
        "relationship in ['householder', 'spouse'] and age_group == '0-14'",
        "a householder or a spouse is at least 15 years old",
    ),
    (
        "relationship == 'spouse' and household_type != 'married couple'",
        "a spouse lives only in a married-couple household",
    ),
    (
        "household_type == 'alone' and relationship != 'householder'",
        "a one-person household holds only its householder",
    ),
    (
        "household_type == 'nonfamily' and relationship in ['spouse', 'child', 'other relative']",
        "a nonfamily household has no relative of its householder",
    ),
    (
        "relationship == 'group quarters' and household_type != 'group quarters'",
        "a group-quarters resident does not live in a household",
    ),
    (
        "relationship != 'group quarters' and household_type == 'group quarters'",
        "only group-quarters residents have household type 'group quarters'",
    ),
)


def _check_count(name: str, value: object, minimum: int, error: type[DpoptError]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def census_domain(num_states: int = 4, counties_per_state: int = 3) -> Domain:
    """The labelled domain of the example person file.

    Parameters
    ----------
    num_states : int
        Number of states, labelled ``"S01"``, ``"S02"``, ... (at least 1).
    counties_per_state : int
        Number of counties in each state (at least 1). County labels are ``"S01-C1"``, ...:
        globally unique, the part before ``"-"`` naming the state that contains the county.

    Returns
    -------
    Domain
        Attributes ``state, county, age_group, sex, relationship, household_type`` in that order.

    Examples
    --------
    >>> dom = census_domain(2, 2)
    >>> dom.labels["county"]
    ('S01-C1', 'S01-C2', 'S02-C1', 'S02-C2')
    >>> dom.size
    2880
    """
    num_states = _check_count("num_states", num_states, 1, DomainError)
    counties_per_state = _check_count("counties_per_state", counties_per_state, 1, DomainError)
    state_width = max(2, len(str(num_states)))
    county_width = len(str(counties_per_state))
    states = [f"S{s:0{state_width}d}" for s in range(1, num_states + 1)]
    counties = [f"{s}-C{c:0{county_width}d}" for s in states for c in range(1, counties_per_state + 1)]
    return Domain.from_dict({"state": states, "county": counties, **_FIXED_LABELS})


def _check_census_domain(domain: Domain) -> None:
    if not isinstance(domain, Domain):
        raise DomainError(f"domain must be a dpopt Domain, got {type(domain).__name__}")
    for attr in CENSUS_ATTRS:
        if attr not in domain.labels:
            raise DomainError(
                f"domain has no labelled attribute {attr!r}; a census domain needs {list(CENSUS_ATTRS)}"
            )
    for attr, labels in _FIXED_LABELS.items():
        if tuple(domain.labels[attr]) != labels:
            raise DomainError(
                f"attribute {attr!r}: labels {list(domain.labels[attr])} differ from the census "
                f"labels {list(labels)}"
            )


def county_parent(domain: Domain) -> dict[str, str]:
    """The geography hierarchy: the state label of each county label.

    A county label is ``"<state>-C<k>"``; the part before the first ``"-"`` is its state.

    Raises
    ------
    DomainError
        If ``domain`` lacks labelled ``state``/``county`` attributes or a county names a state
        that is not in the domain.
    """
    if not isinstance(domain, Domain):
        raise DomainError(f"domain must be a dpopt Domain, got {type(domain).__name__}")
    for attr in ("state", "county"):
        if attr not in domain.labels:
            raise DomainError(f"domain has no labelled attribute {attr!r}")
    states = set(domain.labels["state"])
    parent = {}
    for county in domain.labels["county"]:
        state = str(county).split("-", 1)[0]
        if "-" not in str(county) or state not in states:
            raise DomainError(
                f"county label {county!r} does not start with a state of the domain followed by '-'"
            )
        parent[county] = state
    return parent


def _parent_codes(domain: Domain) -> np.ndarray:
    """State code of each county code."""
    parent = county_parent(domain)
    state_code = {s: i for i, s in enumerate(domain.labels["state"])}
    return np.array([state_code[parent[c]] for c in domain.labels["county"]], dtype=np.int64)


def structural_zero_rules(domain: Domain) -> list[tuple[str, str]]:
    """Every structural-zero rule of a census domain, as ``(predicate, reason)``.

    The rules of :data:`STRUCTURAL_ZEROS` followed by one geography-nesting rule per state
    ("a county of another state cannot lie in this state"), built from :func:`county_parent`.
    """
    _check_census_domain(domain)
    parent = county_parent(domain)
    rules = list(STRUCTURAL_ZEROS)
    for state in domain.labels["state"]:
        own = [c for c in domain.labels["county"] if parent[c] == state]
        rules.append(
            (
                f"state == {state!r} and county not in {own!r}",
                f"state {state} contains only its own counties {', '.join(own)} (geography nesting)",
            )
        )
    return rules


def structural_zero_constraints(domain: Domain, name: str = "rule {}") -> list:
    """The rules of :func:`structural_zero_rules` as ``StructuralZeros`` constraints, named
    ``name.format(i)`` for ``i = 1, 2, ...``."""
    from dpopt.model.constraints import StructuralZeros

    return [StructuralZeros(predicate, name=name.format(i), reason=reason)
            for i, (predicate, reason) in enumerate(structural_zero_rules(domain), start=1)]


def census_constraints(domain: Domain, data=None):
    """The public constraints of a census release: non-negativity, counties nested in states, every
    structural-zero rule, and (given ``data``, a Dataset) the state totals as invariants from the
    data — what the quickstart declares, for scripts and tests that build it in Python."""
    from dpopt.model.constraints import ConstraintSet, Hierarchy, NonNegativity
    from dpopt.model.queries.marginal import Marginal

    cs = ConstraintSet(domain).add(NonNegativity())
    cs.add(Hierarchy("state", "county", county_parent(domain), name="geography"))
    for zeros in structural_zero_constraints(domain):
        cs.add(zeros)
    if data is not None:
        cs.invariant_from_data(Marginal(domain, ["state"]), data, "state totals")
    return cs


def _household_rule_masks(codes: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Direct numpy check of each rule of :data:`STRUCTURAL_ZEROS`, in the same order."""
    age, rel, htype = codes["age_group"], codes["relationship"], codes["household_type"]
    return [
        ((rel == _HOUSEHOLDER) | (rel == _SPOUSE)) & (age == _AGE_0_14),
        (rel == _SPOUSE) & (htype != _MARRIED),
        (htype == _ALONE) & (rel != _HOUSEHOLDER),
        (htype == _NONFAMILY) & ((rel == _SPOUSE) | (rel == _CHILD) | (rel == _OTHER_RELATIVE)),
        (rel == _REL_GQ) & (htype != _TYPE_GQ),
        (rel != _REL_GQ) & (htype == _TYPE_GQ),
    ]


def _rule_masks_from_codes(
    codes: Mapping[str, np.ndarray], parent: np.ndarray, num_states: int
) -> list[np.ndarray]:
    """Direct numpy check of each rule of :func:`structural_zero_rules`, in the same order.

    ``parent[c]`` is the state code of county code ``c``.
    """
    state, county = codes["state"], codes["county"]
    outside = parent[county] != state  # one pass for the geography, then one mask per state
    nesting = [outside & (state == s) for s in range(num_states)]  # a loop over states
    return _household_rule_masks(codes) + nesting


def _domain_of_records(df: pd.DataFrame) -> Domain:
    """A census domain whose geography is read off the records (categories, or sorted values)."""
    geo = {}
    for attr in ("state", "county"):
        if attr not in df.columns:
            raise DataError(f"column {attr!r} is missing; records need columns {list(CENSUS_ATTRS)}")
        col = df[attr]
        if isinstance(col.dtype, pd.CategoricalDtype):
            geo[attr] = [str(v) for v in col.cat.categories]
        else:
            geo[attr] = sorted(str(v) for v in pd.unique(col.dropna()))
        if not geo[attr]:
            raise DataError(f"column {attr!r} has no values to read the geography from")
    # A county whose state never appears in the state column names a state all the same, so
    # that such records show up as nesting violations rather than as a malformed domain.
    named = sorted({c.split("-", 1)[0] for c in geo["county"]} - set(geo["state"]))
    geo["state"] += named
    return Domain.from_dict({**geo, **_FIXED_LABELS})


def _label_codes(col: pd.Series, labels: list) -> np.ndarray:
    """Position of each value of ``col`` in ``labels``; -1 for missing or unknown values."""
    index = pd.Index(labels)
    if isinstance(col.dtype, pd.CategoricalDtype):
        # Recode the (few) categories, then look the codes up: no pass over strings.
        recode = np.append(index.get_indexer(col.cat.categories), -1)
        return recode[col.cat.codes.to_numpy()]  # code -1 (missing) picks the appended -1
    return index.get_indexer(col)


def _codes_of_records(df: pd.DataFrame, domain: Domain) -> dict[str, np.ndarray]:
    """Domain codes of each census column; unknown or missing values raise :class:`DataError`."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"records must be a pandas DataFrame, got {type(df).__name__}")
    codes = {}
    for attr in CENSUS_ATTRS:
        if attr not in df.columns:
            raise DataError(f"column {attr!r} is missing; records need columns {list(CENSUS_ATTRS)}")
        labels = list(domain.labels[attr])
        col = df[attr]
        c = _label_codes(col, labels)
        bad = c < 0
        if bad.any():
            raise DataError(
                f"column {attr!r} holds missing values or values outside the domain{confidential_values(col[bad])} "
                f"(values: {labels[:8]}{' ...' if len(labels) > 8 else ''})"
            )
        codes[attr] = c
    return codes


def structural_zero_rule_masks(df: pd.DataFrame, domain: Domain | None = None) -> list[np.ndarray]:
    """For each rule of ``structural_zero_rules(domain)``, the records that fall in it.

    A direct, vectorised implementation that does not parse the predicate strings.

    Parameters
    ----------
    df : pandas.DataFrame
        Records with (at least) the columns of :data:`CENSUS_ATTRS`, as labels (categorical or
        plain strings).
    domain : Domain, optional
        The census domain; by default read off ``df`` (the categories of categorical ``state``
        and ``county`` columns, else their sorted values).

    Returns
    -------
    list of numpy.ndarray
        Boolean arrays of length ``len(df)``, aligned with ``structural_zero_rules(domain)``.
    """
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"records must be a pandas DataFrame, got {type(df).__name__}")
    if domain is None:
        domain = _domain_of_records(df)
    _check_census_domain(domain)
    codes = _codes_of_records(df, domain)
    return _rule_masks_from_codes(codes, _parent_codes(domain), domain.size_of("state"))


def structural_zero_mask_of_records(df: pd.DataFrame, domain: Domain | None = None) -> np.ndarray:
    """Boolean array: ``True`` where a record falls in at least one structural zero.

    See :func:`structural_zero_rule_masks` for the parameters.
    """
    masks = structural_zero_rule_masks(df, domain)
    return np.logical_or.reduce(masks) if masks else np.zeros(len(df), dtype=bool)


# ---- the generative model --------------------------------------------------------------------
# Plausible, made-up proportions; rows are distributions over the labels in the order above.

_P_GROUP_QUARTERS = 0.03  # share of persons living in group quarters
# Household type (married couple, other family, alone, nonfamily) before per-state variation.
_P_HOUSEHOLD_TYPE = np.array([0.47, 0.18, 0.28, 0.07])
_TYPE_CONCENTRATION = 300.0  # Dirichlet concentration of the per-state household-type mix
# Householder age group given household type (rows: married, other family, alone, nonfamily).
_P_HOUSEHOLDER_AGE = np.array(
    [
        [0.0, 0.0005, 0.03, 0.38, 0.38, 0.21],
        [0.0, 0.002, 0.08, 0.45, 0.33, 0.14],
        [0.0, 0.0005, 0.05, 0.25, 0.32, 0.38],
        [0.0, 0.003, 0.30, 0.42, 0.17, 0.11],
    ]
)
_P_HOUSEHOLDER_FEMALE = np.array([0.40, 0.70, 0.55, 0.45])  # by household type
# Member counts by household type: Poisson means of children, other relatives, nonrelatives.
_MEAN_CHILDREN = np.array([1.0, 1.1, 0.0, 0.0])
_MEAN_OTHER_RELATIVES = np.array([0.12, 0.35, 0.0, 0.0])
_MEAN_NONRELATIVES = np.array([0.05, 0.08, 0.0, 0.35])  # nonfamily: 1 + Poisson(0.35)
# Children at home scale with the householder's age group (index: householder age).
_CHILDREN_BY_HOUSEHOLDER_AGE = np.array([0.0, 0.3, 0.7, 1.4, 0.8, 0.15])
_P_SPOUSE_SAME_AGE_GROUP = 0.8
_P_SPOUSE_OPPOSITE_SEX = 0.97
# Rows 0-5: child age given householder age; 6: spouse; 7: other relative; 8: nonrelative.
_AGE_TABLE = np.array(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # householder 0-14: never happens (structural zero)
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.95, 0.05, 0.0, 0.0, 0.0, 0.0],
        [0.78, 0.12, 0.08, 0.02, 0.0, 0.0],
        [0.25, 0.17, 0.30, 0.26, 0.02, 0.0],
        [0.02, 0.02, 0.08, 0.45, 0.43, 0.0],
        [0.0, 0.001, 0.03, 0.38, 0.38, 0.21],
        [0.30, 0.06, 0.12, 0.20, 0.12, 0.20],
        [0.06, 0.02, 0.30, 0.45, 0.12, 0.05],
    ]
)
_AGE_ROW_SPOUSE, _AGE_ROW_OTHER_RELATIVE, _AGE_ROW_NONRELATIVE = 6, 7, 8
_P_FEMALE_BY_RELATIONSHIP = np.array([0.5, 0.5, 0.49, 0.56, 0.46, 0.5])  # non-householders
_P_GQ_AGE = np.array([0.02, 0.03, 0.40, 0.22, 0.10, 0.23])  # dorms, prisons, nursing homes
_P_GQ_FEMALE_BY_AGE = np.array([0.45, 0.40, 0.50, 0.30, 0.35, 0.68])
# Zipf exponents and log-normal jitter of unit sizes.
_STATE_ZIPF, _COUNTY_ZIPF, _SIZE_JITTER, _GQ_JITTER = 1.1, 1.2, 0.25, 1.0
_MIN_MEAN_HOUSEHOLD_SIZE = 2.0  # a lower bound on the model's mean, to draw enough households

_TWO32 = 1 << 32


def _integer_cdf(probs: np.ndarray) -> np.ndarray:
    """Cumulative distributions (rows) on the integer grid 0..2**32, exactly ending at 2**32.

    Integer thresholds make zero-probability categories impossible to draw, with no rounding.
    """
    probs = np.atleast_2d(np.asarray(probs, dtype=np.float64))
    p = probs / probs.sum(axis=1, keepdims=True)
    cum = np.minimum(np.rint(np.cumsum(p, axis=1) * _TWO32), _TWO32).astype(np.int64)
    cum[:, -1] = _TWO32
    return cum


def _draw(rng: np.random.Generator, cum: np.ndarray, rows: np.ndarray | int, size: int) -> np.ndarray:
    """One categorical draw per element, from row ``rows[i]`` of the integer CDF table ``cum``.

    All rows are searched at once: row ``r`` is shifted by ``r * 2**32`` so that a single sorted
    array holds the whole table.
    """
    num_rows, k = cum.shape
    u = rng.integers(0, _TWO32, size=size, dtype=np.int64)
    if num_rows == 1:
        return np.searchsorted(cum[0], u, side="right").astype(np.int32)
    rows = np.broadcast_to(np.asarray(rows, dtype=np.int64), (size,))
    flat = (np.arange(num_rows, dtype=np.int64)[:, None] * _TWO32 + cum).ravel()
    return (np.searchsorted(flat, rows * _TWO32 + u, side="right") - rows * k).astype(np.int32)


def _unit_weights(rng: np.random.Generator, n: int, exponent: float, jitter: float) -> np.ndarray:
    """Zipf-like weights of ``n`` units in a random order, with log-normal jitter."""
    ranks = rng.permutation(n) + 1.0
    return ranks ** (-exponent) * np.exp(rng.normal(0.0, jitter, size=n))


def _draw_households(
    rng: np.random.Generator,
    n: int,
    county_cum: np.ndarray,
    parent: np.ndarray,
    type_cum: np.ndarray,
    forced_type: int | None = None,
) -> dict[str, np.ndarray]:
    """``n`` households: county, type, householder age and sex, and member counts."""
    county = _draw(rng, county_cum, 0, n)
    if forced_type is None:
        htype = _draw(rng, type_cum, parent[county], n)
    else:
        htype = np.full(n, forced_type, dtype=np.int32)
    age = _draw(rng, _integer_cdf(_P_HOUSEHOLDER_AGE), htype, n)
    sex = (rng.random(n) >= _P_HOUSEHOLDER_FEMALE[htype]).astype(np.int16)
    spouse = (htype == _MARRIED).astype(np.int32)
    children = rng.poisson(_MEAN_CHILDREN[htype] * _CHILDREN_BY_HOUSEHOLDER_AGE[age]).astype(np.int32)
    others = rng.poisson(_MEAN_OTHER_RELATIVES[htype]).astype(np.int32)
    nonrel = rng.poisson(_MEAN_NONRELATIVES[htype]).astype(np.int32)
    nonrel += htype == _NONFAMILY  # a nonfamily household has at least one nonrelative
    # An "other family" household has at least one relative of the householder.
    children += (htype == _OTHER_FAMILY) & (children == 0) & (others == 0)
    return {
        "county": county,
        "type": htype,
        "age": age,
        "sex": sex,
        "spouse": spouse,
        "children": children,
        "others": others,
        "nonrel": nonrel,
    }


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _households_for(
    rng: np.random.Generator,
    num_persons: int,
    county_cum: np.ndarray,
    parent: np.ndarray,
    type_cum: np.ndarray,
) -> dict[str, np.ndarray]:
    """Households holding exactly ``num_persons`` persons.

    Draws more households than needed, keeps the longest prefix that fits, and fills the few
    remaining persons with one-person households (so every household stays coherent).
    """
    parts, drawn = [], 0
    while drawn < num_persons:  # a loop over batches; a second batch is rare
        n = ceil((num_persons - drawn) / _MIN_MEAN_HOUSEHOLD_SIZE) + 16
        part = _draw_households(rng, n, county_cum, parent, type_cum)
        parts.append(part)
        drawn += int((1 + part["spouse"] + part["children"] + part["others"] + part["nonrel"]).sum())
    if not parts:
        return _draw_households(rng, 0, county_cum, parent, type_cum)
    hh = _concat(parts)
    sizes = 1 + hh["spouse"] + hh["children"] + hh["others"] + hh["nonrel"]
    cumulative = np.cumsum(sizes, dtype=np.int64)
    keep = int(np.searchsorted(cumulative, num_persons, side="right"))
    hh = {key: v[:keep] for key, v in hh.items()}
    remainder = num_persons - (int(cumulative[keep - 1]) if keep else 0)
    alone = _draw_households(rng, remainder, county_cum, parent, type_cum, forced_type=_ALONE)
    return _concat([hh, alone])


def _household_persons(
    rng: np.random.Generator, hh: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Expand households (sorted by county) into persons, members following their householder."""
    sizes = 1 + hh["spouse"] + hh["children"] + hh["others"] + hh["nonrel"]
    n = int(sizes.sum())
    household = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    starts = np.cumsum(sizes, dtype=np.int64) - sizes
    pos = np.arange(n, dtype=np.int64) - starts[household]
    # Members in the order householder, spouse, children, other relatives, nonrelatives:
    # each threshold passed moves a member to the next relationship.
    end_spouse = 1 + hh["spouse"]
    end_children = end_spouse + hh["children"]
    end_others = end_children + hh["others"]
    rel = (
        (pos >= 1).astype(np.int16)
        + (pos >= end_spouse[household])
        + (pos >= end_children[household])
        + (pos >= end_others[household])
    ).astype(np.int16)

    head_age = hh["age"][household]
    row = np.where(rel == _CHILD, head_age, _AGE_ROW_NONRELATIVE)
    row = np.where(rel == _SPOUSE, _AGE_ROW_SPOUSE, row)
    row = np.where(rel == _OTHER_RELATIVE, _AGE_ROW_OTHER_RELATIVE, row)
    age = _draw(rng, _integer_cdf(_AGE_TABLE), row, n)
    same_age = rng.random(n) < _P_SPOUSE_SAME_AGE_GROUP
    age = np.where((rel == _HOUSEHOLDER) | ((rel == _SPOUSE) & same_age), head_age, age)

    head_sex = hh["sex"][household]
    sex = (rng.random(n) >= _P_FEMALE_BY_RELATIONSHIP[rel]).astype(np.int16)
    opposite = rng.random(n) < _P_SPOUSE_OPPOSITE_SEX
    sex = np.where(rel == _SPOUSE, np.where(opposite, 1 - head_sex, head_sex), sex)
    sex = np.where(rel == _HOUSEHOLDER, head_sex, sex)
    return {
        "county": hh["county"][household],
        "age_group": age.astype(np.int16),
        "sex": sex.astype(np.int16),
        "relationship": rel,
        "household_type": hh["type"][household],
        "household_id": household,
    }


def _group_quarters_persons(
    rng: np.random.Generator, n: int, gq_county_cum: np.ndarray
) -> dict[str, np.ndarray]:
    county = np.sort(_draw(rng, gq_county_cum, 0, n))
    age = _draw(rng, _integer_cdf(_P_GQ_AGE), 0, n)
    sex = (rng.random(n) >= _P_GQ_FEMALE_BY_AGE[age]).astype(np.int16)
    return {
        "county": county,
        "age_group": age,
        "sex": sex,
        "relationship": np.full(n, _REL_GQ, dtype=np.int16),
        "household_type": np.full(n, _TYPE_GQ, dtype=np.int16),
        "household_id": np.full(n, -1, dtype=np.int64),
    }


def generate_census(
    num_people: int = 10_000,
    *,
    num_states: int = 4,
    counties_per_state: int = 3,
    seed: int = 0,
    household_ids: bool = False,
) -> pd.DataFrame:
    """A synthetic census-like person file with exactly ``num_people`` rows.

    Households are generated as units: a householder (age and sex depending on the household
    type), a spouse in married-couple households (usually the same age group and the opposite
    sex), children (ages depending on the householder's), other relatives and nonrelatives;
    about 3 % of persons live in group quarters (mostly aged 18-24 or 65+). State and county
    sizes are uneven (Zipf-like with random jitter) and the household-type mix varies by state.
    No record falls in a structural zero (:func:`structural_zero_rules`); this is checked on
    every call.

    Rows are grouped by county (counties in domain order); within a county, the members of a
    household are consecutive, householder first, and group-quarters residents come last.

    The randomness is **not privacy noise**: this is public, made-up example data, drawn from
    ``numpy.random.Generator(PCG64(seed))`` so that a seed always gives the same frame.

    Parameters
    ----------
    num_people : int
        Number of rows (persons), at least 0.
    num_states, counties_per_state : int
        Geography of :func:`census_domain`.
    seed : int
        Seed of the generator (a non-negative integer); the same seed gives the same frame.
    household_ids : bool
        Add an int64 ``household_id`` column (household number, increasing down the file;
        ``-1`` for group-quarters residents). It is not an attribute of the domain.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`CENSUS_ATTRS`, each categorical with the domain's labels as categories.

    Examples
    --------
    >>> df = generate_census(1000, seed=1)
    >>> len(df), list(df.columns)[:2]
    (1000, ['state', 'county'])
    """
    num_people = _check_count("num_people", num_people, 0, DataError)
    seed = _check_count("seed", seed, 0, DataError)
    if not isinstance(household_ids, (bool, np.bool_)):
        raise DataError(f"household_ids must be True or False, got {household_ids!r}")
    domain = census_domain(num_states, counties_per_state)
    parent = _parent_codes(domain)
    num_states, num_counties = domain.size_of("state"), domain.size_of("county")
    rng = np.random.Generator(np.random.PCG64(seed))

    # Public model parameters for this seed: unit sizes and the household-type mix per state.
    state_w = _unit_weights(rng, num_states, _STATE_ZIPF, _SIZE_JITTER)
    county_w = np.empty(num_counties)
    for s in range(num_states):  # a loop over states
        own = np.flatnonzero(parent == s)
        w = _unit_weights(rng, len(own), _COUNTY_ZIPF, _SIZE_JITTER)
        county_w[own] = state_w[s] * w / w.sum()
    gq_county_w = county_w * np.exp(rng.normal(0.0, _GQ_JITTER, size=num_counties))
    type_mix = rng.dirichlet(_TYPE_CONCENTRATION * _P_HOUSEHOLD_TYPE, size=num_states)

    num_gq = int(rng.binomial(num_people, _P_GROUP_QUARTERS))
    hh = _households_for(
        rng, num_people - num_gq, _integer_cdf(county_w), parent, _integer_cdf(type_mix)
    )
    order = np.argsort(hh["county"], kind="stable")
    hh = {key: v[order] for key, v in hh.items()}
    persons = _concat(
        [_household_persons(rng, hh), _group_quarters_persons(rng, num_gq, _integer_cdf(gq_county_w))]
    )
    order = np.argsort(persons["county"], kind="stable")  # put group quarters into their county
    codes = {key: v[order] for key, v in persons.items()}
    codes["state"] = parent[codes["county"]]

    # Cannot fail by construction; guards the model above against edits. The nesting rules
    # are checked in one pass (per-state masks would cost a pass per state).
    broken = [
        rule for rule, mask in zip(STRUCTURAL_ZEROS, _household_rule_masks(codes)) if mask.any()
    ]
    if (parent[codes["county"]] != codes["state"]).any():
        broken.append(("county outside its state", "geography nesting"))
    if broken:
        raise DpoptError(f"internal error: generated records break structural-zero rules {broken}")

    columns = {
        attr: pd.Categorical.from_codes(
            codes[attr], dtype=pd.CategoricalDtype(list(domain.labels[attr]))
        )
        for attr in CENSUS_ATTRS
    }
    if household_ids:
        columns["household_id"] = codes["household_id"]
    return pd.DataFrame(columns)


def state_totals(df: pd.DataFrame, domain: Domain | None = None) -> pd.Series:
    """Persons per state: the invariants published exactly alongside a release.

    Parameters
    ----------
    df : pandas.DataFrame
        Records with a ``state`` column.
    domain : Domain, optional
        When given, the totals are indexed by all its states (zeros included) and a state not in
        the domain is an error. Otherwise the categories of a categorical column, or the sorted
        states present, are the index.

    Returns
    -------
    pandas.Series
        int64 counts named ``"persons"``, indexed by state label (index name ``"state"``).
    """
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"records must be a pandas DataFrame, got {type(df).__name__}")
    if "state" not in df.columns:
        raise DataError("column 'state' is missing; state totals need it")
    col = df["state"]
    if domain is not None:
        if "state" not in domain.labels:
            raise DomainError("domain has no labelled attribute 'state'")
        states = [str(s) for s in domain.labels["state"]]
    elif isinstance(col.dtype, pd.CategoricalDtype):
        states = [str(s) for s in col.cat.categories]
    else:
        states = sorted(str(s) for s in pd.unique(col.dropna()))
    codes = _label_codes(col, states)
    bad = codes < 0
    if bad.any():
        raise DataError(f"column 'state' holds missing values or values not among the states {states[:8]}"
                        + confidential_values(col[bad]))
    counts = np.bincount(codes, minlength=len(states)).astype(np.int64)
    return pd.Series(counts, index=pd.Index(states, name="state"), name="persons")


def write_example_data(
    path: str | os.PathLike,
    num_people: int = 10_000,
    seed: int = 0,
    format: str = "csv",
    *,
    num_states: int = 4,
    counties_per_state: int = 3,
) -> Path:
    """Generate the example person file and write it atomically.

    The file is written to a temporary file in the target directory and moved into place with
    :func:`os.replace`, so ``path`` either keeps its old content or holds the complete new file;
    a failed write leaves no temporary file behind.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file; its directory must exist.
    num_people, seed, num_states, counties_per_state
        As in :func:`generate_census`.
    format : {"csv", "parquet"}
        CSV (labels as text, with a header) or Parquet (categorical columns kept).

    Returns
    -------
    pathlib.Path
        The path written.
    """
    if format not in ("csv", "parquet"):
        raise DataError(f"format must be 'csv' or 'parquet', got {format!r}")
    path = Path(path)
    directory = path.parent
    if not directory.is_dir():
        raise DataError(f"path {str(path)!r}: directory {str(directory)!r} does not exist")
    if path.is_dir():
        raise DataError(f"path {str(path)!r} is a directory, not a file")
    df = generate_census(
        num_people, num_states=num_states, counties_per_state=counties_per_state, seed=seed
    )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            if format == "csv":
                df.to_csv(fh, index=False)
            else:
                df.to_parquet(fh, index=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    return path
