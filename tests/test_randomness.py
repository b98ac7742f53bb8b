"""Tests of the random sources: exact uniform integers, Bernoulli draws, seeding, validation.

Statistical tests use :class:`SeededRandom` (test-only: seeded noise is NOT private) with
fixed seeds, at level ``ALPHA = 1e-3``. The rejection rule itself is checked exactly with a
scripted source whose words are chosen by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpopt.errors import PrivacyParameterError
from dpopt.privacy.randomness import RandomSource, SecureRandom, SeededRandom, make_random

ALPHA = 1e-3


class ScriptedSource(RandomSource):
    """Returns the given words in order (to test the rejection rule exactly)."""

    description = "scripted words (tests only)"

    def __init__(self, words: list[int]) -> None:
        self._words = list(words)

    def words(self, n: int) -> np.ndarray:
        out, self._words = self._words[:n], self._words[n:]
        if len(out) < n:
            raise RuntimeError("script exhausted")
        return np.array(out, dtype=np.uint64)


def chisquare_p(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = observed.sum() * probs / probs.sum()
    assert expected.min() >= 5
    return float(stats.chisquare(observed, expected).pvalue)


# ---- rejection rule, exactly -----------------------------------------------------------------
def test_full_word_rejection_rule():
    h = 3 * 2**61  # 2**64 = 2 h + 2**62: words >= 2 h (the last 2**62 values) must be redrawn
    src = ScriptedSource([2**64 - 1, 2 * h, 2 * h - 1])
    assert src.uniform_below(h, size=1)[0] == (2 * h - 1) % h  # third word is the first kept
    src = ScriptedSource([2 * h - 1])
    assert src.uniform_below(h, size=1)[0] == h - 1


def test_half_word_rejection_rule():
    # h = 3 <= 2**32: a word gives two 32-bit halves, low half first; 2**32 = 3 * 1431655765 + 1,
    # so the half 2**32 - 1 is rejected and the next half is used.
    src = ScriptedSource([(7 << 32) | 0xFFFFFFFF, 5])
    assert list(src.uniform_below(3, size=2)) == [5 % 3, 7 % 3]  # element 0 redrawn from word 2
    src = ScriptedSource([(0xFFFFFFFF << 32) | 0xFFFFFFFE])  # 2**32 - 2 is kept: (2**32 - 2) % 3 = 2
    assert src.uniform_below(3, size=1)[0] == 2


def test_per_element_bounds_redraw_only_rejected():
    h = 3 * 2**61
    src = ScriptedSource([2**64 - 1, 11, 12])  # element 0 rejected, element 1 kept, 0 redrawn
    assert list(src.uniform_below(np.array([h, h]))) == [12, 11]


# ---- uniform_below, statistically -------------------------------------------------------------
def test_uniform_below_small_bound():
    x = SeededRandom(1).uniform_below(7, size=70_000)
    assert x.dtype == np.int64 and x.min() >= 0 and x.max() <= 6
    assert chisquare_p(np.bincount(x, minlength=7), np.ones(7)) > ALPHA


def test_uniform_below_one_is_zero():
    x = SeededRandom(2).uniform_below(1, size=1000)
    assert x.dtype == np.int64 and not x.any()


@pytest.mark.parametrize("seed, high", [(3, 2**62 + 1), (4, 2**63 - 1), (5, 2**32), (6, 2**32 + 1)])
def test_uniform_below_large_bounds(seed, high):
    n, bins = 64_000, 16
    x = SeededRandom(seed).uniform_below(high, size=n)
    assert x.min() >= 0 and int(x.max()) < high
    k = (x.astype(object) * bins) // high  # exact bin of each value
    # bin b holds the integers v with b h <= 16 v < (b + 1) h: ceil((b+1) h/16) - ceil(b h/16) of them
    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    counts = np.array([ceil_div((b + 1) * high, bins) - ceil_div(b * high, bins) for b in range(bins)], dtype=float)
    assert counts.sum() == high
    assert chisquare_p(np.bincount(k.astype(np.int64), minlength=bins), counts) > ALPHA


@pytest.mark.parametrize("seed, high", [(7, 3 * 2**61), (8, 3 * 2**30)])
def test_uniform_below_bounds_with_heavy_rejection(seed, high):
    # A quarter of the words are rejected; without rejection the first third would be twice
    # as likely as the last third.
    x = SeededRandom(seed).uniform_below(high, size=30_000)
    thirds = (x // (high // 3)).astype(np.int64)
    assert chisquare_p(np.bincount(thirds, minlength=3), np.ones(3)) > ALPHA


def test_uniform_below_per_element_bounds():
    highs = np.array([1, 2, 3, 5, 1000, 2**40 + 3])
    x = SeededRandom(9).uniform_below(np.tile(highs, 20_000)).reshape(20_000, highs.size)
    assert (x >= 0).all() and (x < highs).all()
    assert not x[:, 0].any()
    for col, h in [(1, 2), (2, 3), (3, 5)]:
        assert chisquare_p(np.bincount(x[:, col], minlength=h), np.ones(h)) > ALPHA
    assert chisquare_p(np.bincount(x[:, 4] // 100, minlength=10), np.ones(10)) > ALPHA
    assert chisquare_p(np.bincount(x[:, 5] >> 36, minlength=16), np.ones(16)) > ALPHA


def test_uniform_below_shapes():
    rng = SeededRandom(10)
    assert rng.uniform_below(5, size=(2, 3)).shape == (2, 3)
    assert rng.uniform_below(np.array([[2], [3]]), size=(2, 4)).shape == (2, 4)
    assert rng.uniform_below(np.array([4, 5, 6])).shape == (3,)
    assert rng.uniform_below(5, size=0).shape == (0,)


@pytest.mark.parametrize("seed, high", [(11, 2**100 + 1), (12, 3 * 2**125)])
def test_uniform_below_big(seed, high):
    x = SeededRandom(seed).uniform_below_big(high, size=30_000)
    assert x.dtype == object and min(x) >= 0 and max(x) < high
    thirds = np.array([v // (high // 3) for v in x], dtype=np.int64)  # last third may hold a
    counts = np.array([high // 3, high // 3, high - 2 * (high // 3)], dtype=float)  # few more
    assert chisquare_p(np.bincount(thirds, minlength=3), counts) > ALPHA


# ---- Bernoulli ------------------------------------------------------------------------------------
def test_bernoulli_frequencies():
    n = 100_000
    rng = SeededRandom(13)
    draws = rng.bernoulli(np.tile([0, 1, 3, 7], n), np.tile([5, 3, 10, 7], n)).reshape(n, 4)
    assert draws.dtype == bool
    assert not draws[:, 0].any() and draws[:, 3].all()
    assert stats.binomtest(int(draws[:, 1].sum()), n, 1 / 3).pvalue > ALPHA
    assert stats.binomtest(int(draws[:, 2].sum()), n, 3 / 10).pvalue > ALPHA


def test_bernoulli_big_integers():
    n = 50_000
    big = 2**90
    draws = SeededRandom(14).bernoulli(np.full(n, big, dtype=object), np.full(n, 4 * big, dtype=object))
    assert stats.binomtest(int(draws.sum()), n, 0.25).pvalue > ALPHA


# ---- sources and seeding ----------------------------------------------------------------------------
def test_make_random_defaults_to_secure():
    rng = make_random()
    assert isinstance(rng, SecureRandom) and rng.is_private
    assert "cryptographically secure" in rng.description
    w = rng.words(1000)
    assert w.dtype == np.uint64 and w.shape == (1000,)
    assert not np.array_equal(w, rng.words(1000))  # equal with probability 2**-64000
    w[0] = 0  # writable


def test_seeded_source_is_reproducible_and_flagged():
    a, b = make_random(42), SeededRandom(42)
    assert isinstance(a, SeededRandom) and not a.is_private
    assert "seeded, NOT private" in a.description
    assert np.array_equal(a.words(100), b.words(100))
    assert np.array_equal(a.uniform_below(1000, size=50), b.uniform_below(1000, size=50))
    assert not np.array_equal(SeededRandom(1).words(100), SeededRandom(2).words(100))


# ---- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [-1, 1.5, "1", True, np.float64(2.0)])
def test_bad_seed(seed):
    with pytest.raises(PrivacyParameterError, match="seed must be"):
        make_random(seed)
    with pytest.raises(PrivacyParameterError, match="seed must be"):
        SeededRandom(seed)


@pytest.mark.parametrize("high, message", [
    (0, "high must be at least 1"), (-3, "high must be at least 1"),
    (np.array([3, 0]), "high must be at least 1"),
    (2**63, "high must be at most 2\\*\\*63 - 1"), (1.5, "high must be an integer"),
    (np.array([1.0, 2.0]), "high must be an integer"), (True, "high must be an integer"),
])
def test_uniform_below_rejects_bad_high(high, message):
    with pytest.raises(PrivacyParameterError, match=message):
        SeededRandom(1).uniform_below(high, size=None if np.ndim(high) else 2)


def test_uniform_below_rejects_bad_size_and_big_high():
    rng = SeededRandom(1)
    for size in [-1, 2.5, (2, -1), True]:
        with pytest.raises(PrivacyParameterError, match="size must be"):
            rng.uniform_below(5, size=size)
    with pytest.raises(PrivacyParameterError, match="does not broadcast"):
        rng.uniform_below(np.array([2, 3]), size=5)
    with pytest.raises(PrivacyParameterError, match="high must be at least 1"):
        rng.uniform_below_big(0, size=3)
    with pytest.raises(PrivacyParameterError, match="n \\(number of words\\)"):
        rng.words(-1)


@pytest.mark.parametrize("num, den, message", [
    (3, 2, "num must not exceed den"), (1, 0, "den must be at least 1"),
    (-1, 2, "num must be non-negative"), (0.5, 1, "num must be an integer"),
    (np.array([1, 2]), np.array([3, 3, 3]), "do not broadcast"),
])
def test_bernoulli_rejects_bad_input(num, den, message):
    with pytest.raises(PrivacyParameterError, match=message):
        SeededRandom(1).bernoulli(num, den)
