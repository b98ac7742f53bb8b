"""A synthetic nation for top-down releases at national scale, made up by dpopt (no download).

:func:`generate_nation` draws the counts of a PL 94-171-like table directly per tract, never
as person records: 51 states, about 3,200 counties and about 73,000 tracts whose populations
are as skewed as real ones (a few states and counties hold much of the nation; tracts hold a
few thousand persons each), about 330 million persons in all. Each tract's table has
2 (voting age) × 2 (Hispanic origin) × 63 (race: the non-empty combinations of six race
flags) × 8 (group-quarters type) = 2,016 cells, and obeys made-up edit rules
(:data:`EDIT_RULES`: adult-only facilities hold no minors, juvenile facilities no adults).

Nothing here is real data: every proportion is a plausible, hand-picked number and the
randomness is a seeded ``numpy.random.Generator(PCG64(seed))`` that only invents the example
(it is not privacy noise). The same arguments always give the same nation.

Units are named like GEOIDs: state ``"01"``, county ``"01001"`` (state + 3 digits), tract
``"01001000100"`` (county + 6 digits), so the hierarchy can be read from the tract code's
prefixes (:meth:`dpopt.model.geography.Geography.from_code`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import scipy.sparse as sp

from dpopt.errors import DomainError
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography

__all__ = ["NationalCensus", "generate_nation", "national_characteristics", "EDIT_RULES", "RACE_FLAGS", "GQ_TYPES"]

VOTING_AGE = ("under 18", "18+")
HISPANIC = ("not Hispanic", "Hispanic")
#: The six race flags of the 2020 PL 94-171 tables; a person marks one or more.
RACE_FLAGS = ("White", "Black", "AIAN", "Asian", "NHPI", "Other")
#: Group-quarters types; "household" is everyone not living in group quarters.
GQ_TYPES = ("household", "adult correctional", "juvenile", "nursing", "other institutional",
            "college", "military", "other noninstitutional")
#: The made-up edit rules, as ``(predicate, reason)`` over the characteristics domain.
EDIT_RULES = (
    ("voting_age == 'under 18' and gq in ['adult correctional', 'nursing', 'military']",
     "adult correctional facilities, nursing facilities and military quarters hold no one under 18"),
    ("voting_age == '18+' and gq == 'juvenile'", "juvenile facilities hold only persons under 18"),
)


def race_labels() -> tuple[str, ...]:
    """The 63 race combinations, one flag first, then pairs, ... (e.g. ``"White+Black"``)."""
    out = []
    for k in range(1, len(RACE_FLAGS) + 1):
        out += ["+".join(c) for c in combinations(RACE_FLAGS, k)]
    return tuple(out)


def national_characteristics() -> Domain:
    """The 2,016-cell characteristics domain: voting_age, hispanic, race, gq."""
    return Domain.from_dict({"voting_age": list(VOTING_AGE), "hispanic": list(HISPANIC),
                             "race": list(race_labels()), "gq": list(GQ_TYPES)})


@dataclass(frozen=True, eq=False)
class NationalCensus:
    """A generated nation.

    Attributes
    ----------
    geography : Geography
        nation → state → county → tract, bound to the ``tract`` attribute of ``domain``.
    domain : Domain
        ``tract`` (the GEOIDs) followed by the characteristics (2,016 cells per tract).
    characteristics : Domain
        The characteristics alone.
    tract_counts : scipy.sparse.csr_matrix of int64, shape (tracts, 2016)
        Persons per tract and cell (rows in the geography's leaf order).
    """

    geography: Geography
    domain: Domain
    characteristics: Domain
    tract_counts: sp.csr_matrix

    @property
    def persons(self) -> int:
        return int(self.tract_counts.sum())

    def zero_mask(self) -> np.ndarray:
        """The cells the edit rules forbid (bool over the characteristics)."""
        from dpopt.model.predicates import as_predicate

        mask = np.zeros(self.characteristics.size, dtype=bool)
        for predicate, _ in EDIT_RULES:
            mask |= as_predicate(predicate, self.characteristics).full_mask()
        return mask

    def dataset(self):
        """The tract counts as a weighted :class:`~dpopt.model.data.Dataset` over ``domain``
        (one row per non-empty tract × cell, its count as the weight)."""
        from dpopt.model.data import Dataset

        coo = self.tract_counts.tocoo()
        codes = np.column_stack([self.geography.leaf_codes[coo.row, 0], self.characteristics.unravel(coo.col)])
        return Dataset(codes, self.domain, coo.data.astype(np.int64))

    def constraints(self):
        """The edit rules as structural zeros of a :class:`~dpopt.model.constraints.ConstraintSet`."""
        from dpopt.model.constraints import ConstraintSet, Integrality, NonNegativity, StructuralZeros

        cs = ConstraintSet(self.domain, [NonNegativity(), Integrality()])
        for i, (predicate, reason) in enumerate(EDIT_RULES):
            cs.add(StructuralZeros(predicate, name=f"edit rule {i + 1}", reason=reason))
        return cs

    def level_counts(self, level: str | int) -> sp.csr_matrix:
        """Persons per unit and cell at a level (sums of tracts)."""
        k = self.geography.level(level)
        return sp.csr_matrix(self.geography.aggregation(k) @ self.tract_counts)


def generate_nation(
    num_states: int = 51,
    num_counties: int = 3_200,
    persons: int = 330_000_000,
    tract_size: int = 4_500,
    seed: int = 0,
    *,
    chunk: int = 4_000,
) -> NationalCensus:
    """Generate a nation (see the module notes); at the defaults about 73,000 tracts.

    Parameters
    ----------
    num_states, num_counties : int
        Units of each level (every state gets at least one county).
    persons : int
        Expected population (the realised total differs by sampling).
    tract_size : int
        Average tract population; a county gets ``max(1, round(population / tract_size))`` tracts.
    seed : int
        Seed of the generator (example data only, not privacy noise).
    chunk : int
        Tracts drawn at once (bounds memory).
    """
    for name, value, low in (("num_states", num_states, 1), ("num_counties", num_counties, 1),
                             ("persons", persons, 1), ("tract_size", tract_size, 1), ("chunk", chunk, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DomainError(f"{name} must be an integer >= {low}, got {value!r}")
    if num_counties < num_states:
        raise DomainError(f"num_counties ({num_counties}) must be at least num_states ({num_states})")
    if num_states > 99:
        raise DomainError(f"GEOID-style codes allow at most 99 states, got {num_states}")
    rng = np.random.default_rng(np.random.PCG64(seed))
    # States: log-normal sizes (a California-to-Wyoming spread of about 70x).
    state_pop = _lognormal_shares(rng, num_states, sigma=1.0) * persons
    # Counties per state grow with the state's size, unevenly (Texas 254, California 58, Delaware 3).
    counties = _apportion(np.sqrt(state_pop) * rng.lognormal(0.0, 0.6, num_states), num_counties, minimum=1)
    county_state = np.repeat(np.arange(num_states), counties)
    # Counties: log-normal sizes within their state (a few hundred persons to millions).
    county_pop = _lognormal_shares(rng, county_state.size, sigma=1.5)
    county_pop *= (state_pop / np.bincount(county_state, weights=county_pop))[county_state]
    if counties.max() > 499:
        raise DomainError(f"a state would get {int(counties.max())} counties; GEOID-style codes allow 499")
    tracts = np.maximum(1, np.rint(county_pop / tract_size)).astype(np.int64)
    if tracts.max() > 9_999:
        raise DomainError(f"a county would get {int(tracts.max())} tracts; GEOID-style codes allow 9,999")
    tract_county = np.repeat(np.arange(county_state.size), tracts)
    # Tract sizes: around the county's mean, log-normal spread.
    weights = rng.lognormal(0.0, 0.35, tract_county.size)
    share = weights / np.bincount(tract_county, weights=weights)[tract_county]
    tract_pop = rng.poisson(share * county_pop[tract_county])

    geoids = _geoids(county_state, counties, tracts)
    chars = national_characteristics()
    domain = Domain(("tract", *chars.attrs), (geoids.size, *chars.sizes),
                    {"tract": tuple(geoids), **chars.labels})
    geography = Geography.from_code(domain, "tract", [2, 5, 11], ["state", "county", "tract"])
    mix = _StateMix(rng, num_states)
    parts = []
    for start in range(0, tract_pop.size, chunk):
        stop = min(start + chunk, tract_pop.size)
        states = county_state[tract_county[start:stop]]
        parts.append(_tract_tables(rng, tract_pop[start:stop], mix, states))
    counts = sp.vstack(parts).tocsr()
    # Rows follow the domain's labels; the geography's leaves are the GEOIDs sorted (the same order here).
    counts = counts[geography.leaf_codes[:, 0]]
    return NationalCensus(geography, domain, chars, counts)


# ---- sizes -----------------------------------------------------------------------------------------
def _lognormal_shares(rng, n: int, sigma: float) -> np.ndarray:
    """``n`` positive log-normal sizes (summing to 1 over all of them)."""
    raw = rng.lognormal(0.0, sigma, n)
    return raw / raw.sum()


def _apportion(weights: np.ndarray, total: int, minimum: int) -> np.ndarray:
    """Integers >= minimum proportional to ``weights`` summing to ``total`` (largest remainders)."""
    n = weights.size
    spare = total - minimum * n
    quota = weights / weights.sum() * spare
    base = np.floor(quota).astype(np.int64)
    extra = spare - int(base.sum())
    base[np.argsort(-(quota - base), kind="stable")[:extra]] += 1
    return base + minimum


def _geoids(county_state: np.ndarray, counties: np.ndarray, tracts: np.ndarray) -> np.ndarray:
    """GEOID-like tract codes: 2-digit state, 3-digit county (odd numbers, as FIPS), 6-digit tract."""
    county_in_state = np.concatenate([np.arange(c) for c in counties])
    county_code = np.char.add(np.char.zfill((county_state + 1).astype(str), 2),
                              np.char.zfill((2 * county_in_state + 1).astype(str), 3))
    tract_county = np.repeat(np.arange(county_code.size), tracts)
    tract_in_county = np.concatenate([np.arange(t) for t in tracts])
    tract_code = np.char.zfill(((tract_in_county + 1) * 100).astype(str), 6)
    return np.char.add(county_code[tract_county], tract_code).astype(object)


# ---- characteristics ------------------------------------------------------------------------------
def _race_base() -> tuple[np.ndarray, np.ndarray]:
    """Base race distributions (63 combinations) for non-Hispanic and Hispanic persons."""
    labels = race_labels()
    single_non = {"White": 0.70, "Black": 0.135, "AIAN": 0.008, "Asian": 0.075, "NHPI": 0.002, "Other": 0.005}
    single_his = {"White": 0.30, "Black": 0.02, "AIAN": 0.015, "Asian": 0.004, "NHPI": 0.001, "Other": 0.40}
    out = []
    for single, multi in ((single_non, 0.075), (single_his, 0.26)):
        p = np.empty(len(labels))
        for i, lab in enumerate(labels):
            flags = lab.split("+")
            if len(flags) == 1:
                p[i] = single[lab]
            else:  # two or more races: products of the single shares, decaying with the number of flags
                p[i] = np.prod([single[f] ** 0.5 for f in flags]) * 0.25 ** (len(flags) - 2)
        singles = np.array([len(lab.split("+")) == 1 for lab in labels])
        p[~singles] *= multi / p[~singles].sum()
        p[singles] *= (1 - multi) / p[singles].sum()
        out.append(p)
    return out[0], out[1]


class _StateMix:
    """Per-state mixes: Hispanic share, race shifts and group-quarters rates."""

    def __init__(self, rng, num_states: int) -> None:
        self.hispanic = np.clip(rng.beta(2.0, 9.0, num_states), 0.02, 0.5)
        self.race_non, self.race_his = _race_base()
        self.race_tilt = rng.lognormal(0.0, 0.5, (num_states, 63))  # regional differences
        self.adult = np.clip(rng.normal(0.775, 0.02, num_states), 0.7, 0.84)


# Group quarters: probability that a tract holds one facility of each type, and its mean size.
_GQ_RATE = np.array([0.0, 0.025, 0.01, 0.06, 0.01, 0.02, 0.004, 0.03])
_GQ_SIZE = np.array([0.0, 900.0, 60.0, 110.0, 80.0, 1500.0, 1200.0, 40.0])
_GQ_ADULT = np.array([np.nan, 1.0, 0.0, 1.0, 0.7, 0.97, 1.0, 0.8])  # share 18+ (edit rules: 1 or 0)


def _tract_tables(rng, pop: np.ndarray, mix: _StateMix, states: np.ndarray) -> sp.csr_matrix:
    """Counts over the 2,016 cells for a chunk of tracts (C order: voting_age, hispanic, race, gq)."""
    n = pop.size
    # Tract-level composition: segregation makes tracts differ far more than states.
    his = rng.beta(mix.hispanic[states] * 6 + 0.05, (1 - mix.hispanic[states]) * 6 + 0.05)
    adult = np.clip(rng.normal(mix.adult[states], 0.05), 0.45, 0.97)
    tilt = mix.race_tilt[states] * rng.gamma(2.0, 0.5, (n, 63))
    race_non = _normalise(mix.race_non * tilt * rng.gamma(0.6, 1.0, (n, 63)))
    race_his = _normalise(mix.race_his * tilt * rng.gamma(0.8, 1.0, (n, 63)))
    # Group quarters: at most one facility of each type per tract.
    has = rng.random((n, 8)) < _GQ_RATE
    gq_size = np.where(has, rng.poisson(_GQ_SIZE * rng.lognormal(0, 0.5, (n, 8))), 0)
    gq_size = np.minimum(gq_size, (pop[:, None] * 0.6).astype(np.int64))
    household = np.maximum(pop - gq_size.sum(axis=1), 0)
    table = np.zeros((n, 2, 2, 63, 8), dtype=np.int64)
    # Household persons: voting_age x hispanic x race, multinomial per tract.
    p_hh = np.concatenate([
        np.einsum("n,n,nr->nr", 1 - adult, 1 - his, race_non), np.einsum("n,n,nr->nr", 1 - adult, his, race_his),
        np.einsum("n,n,nr->nr", adult, 1 - his, race_non), np.einsum("n,n,nr->nr", adult, his, race_his),
    ], axis=1)
    table[..., 0] = rng.multinomial(household, _normalise(p_hh)).reshape(n, 2, 2, 63)
    for g in range(1, 8):
        rows = np.flatnonzero(gq_size[:, g] > 0)
        if rows.size == 0:
            continue
        a = _GQ_ADULT[g]
        va = np.array([1 - a, a])
        p = np.concatenate([va[v] * np.concatenate([(1 - his[rows, None]) * race_non[rows], his[rows, None] * race_his[rows]],
                                                    axis=1) for v in (0, 1)], axis=1)
        table[rows, ..., g] = rng.multinomial(gq_size[rows, g], _normalise(p)).reshape(rows.size, 2, 2, 63)
    return sp.csr_matrix(table.reshape(n, -1))


def _normalise(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return p / p.sum(axis=-1, keepdims=True)
