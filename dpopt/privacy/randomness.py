"""Random sources: every bit of privacy noise in dpopt comes from uniform 64-bit words.

A :class:`RandomSource` yields words (``words``) and derives from them, exactly and with
integer arithmetic only, uniform integers below a bound (``uniform_below``) and
Bernoulli draws of rational probability (``bernoulli``). The samplers of
:mod:`dpopt.privacy.samplers` use nothing else, so the privacy of a release rests on the
source alone:

* :class:`SecureRandom` (the default, ``make_random()``) reads ``os.urandom``, the
  operating system's cryptographically secure generator.
* :class:`SeededRandom` is numpy's PCG64 seeded by the caller: reproducible, for research
  and tests, and **not private** (anyone who knows the seed knows the noise). Its
  ``is_private`` is ``False`` and its ``description`` says so, so that a release report can
  record it.

Uniform integers use the rejection rule of OpenBSD's ``arc4random_uniform``: a word ``w``
is kept when it falls in one of the ``floor(2**64 / h)`` complete blocks of ``h`` values,
and ``w mod h`` is then exactly uniform on ``[0, h)``. Only rejected elements are redrawn.
When every bound is at most 2**32 a word is split into two 32-bit halves (same rule with
2**32), which halves the entropy the samplers consume.
"""

from __future__ import annotations

import abc
import numbers
import os
from typing import Union

import numpy as np

from dpopt.errors import PrivacyParameterError

__all__ = ["RandomSource", "SecureRandom", "SeededRandom", "make_random", "INT64_MAX"]

#: Largest value of a signed 64-bit integer; bounds at or below it use the fast path.
INT64_MAX = 2**63 - 1

IntArrayLike = Union[int, np.integer, np.ndarray]


class RandomSource(abc.ABC):
    """Abstract source of uniform 64-bit words and the exact draws derived from them.

    Subclasses implement :meth:`words` and set ``is_private`` and ``description``.
    """

    #: Whether draws from this source may be used for a private release.
    is_private: bool = False
    #: Human-readable description, recorded in release reports.
    description: str = "abstract random source"

    @abc.abstractmethod
    def words(self, n: int) -> np.ndarray:
        """Return ``n`` independent uniform 64-bit words as a ``uint64`` array."""

    # ---- uniform integers ------------------------------------------------------------
    def uniform_below(self, high: IntArrayLike, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Exact uniform integers on ``[0, high)``, element by element.

        Parameters
        ----------
        high : int or integer array
            Exclusive upper bounds, each in ``[1, 2**63 - 1]``. For larger bounds use
            :meth:`uniform_below_big`.
        size : int or tuple of int, optional
            Output shape; ``high`` is broadcast to it. Default: the shape of ``high``.

        Returns
        -------
        numpy.ndarray of int64
        """
        if type(high) is int and type(size) is int and 1 <= high <= INT64_MAX and size >= 0:
            # One bound, a flat size (the samplers' many small rounds): the same words and draws
            # as the general path below, without its array checks, which cost more than the draw.
            return self._below_u64(np.full(size, high, dtype=np.uint64)).astype(np.int64)
        h = _as_int_array(high, "high")
        if h.size and int(h.min()) < 1:
            raise PrivacyParameterError(f"high must be at least 1; got {int(h.min())}")
        if h.size and (h.dtype == object or int(h.max()) > INT64_MAX):
            raise PrivacyParameterError(
                f"high must be at most 2**63 - 1 for uniform_below; got {int(h.max())} "
                "(use uniform_below_big for larger bounds)"
            )
        h = _broadcast(h.astype(np.int64), size, "high")
        out = self._below_u64(h.astype(np.uint64).ravel())
        return out.astype(np.int64).reshape(h.shape)

    def uniform_below_big(self, high, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Exact uniform integers on ``[0, high)`` for bounds of any size.

        The same rejection rule as :meth:`uniform_below` on numbers of ``L`` words,
        ``L`` one more than the words needed for the largest bound (so rejections are rare).

        Parameters
        ----------
        high : int or integer array (object arrays of Python ints allowed)
            Exclusive upper bounds, each at least 1.
        size : int or tuple of int, optional
            Output shape; ``high`` is broadcast to it.

        Returns
        -------
        numpy.ndarray of object (Python ints)
        """
        h = _broadcast(_as_int_array(high, "high").astype(object), size, "high")
        if h.size and min(h.flat) < 1:
            raise PrivacyParameterError(f"high must be at least 1; got {min(h.flat)}")
        return self._below_big(h.ravel()).reshape(h.shape)

    # ---- Bernoulli -------------------------------------------------------------------
    def bernoulli(self, num: IntArrayLike, den: IntArrayLike) -> np.ndarray:
        """Exact Bernoulli(``num / den``) draws, element by element.

        Parameters
        ----------
        num, den : int or integer arrays (broadcast together)
            ``0 <= num <= den`` and ``den >= 1``. Values beyond int64 (object arrays of
            Python ints) take the exact big-integer path.

        Returns
        -------
        numpy.ndarray of bool
        """
        n_arr = _as_int_array(num, "num")
        d_arr = _as_int_array(den, "den")
        try:
            n_arr, d_arr = np.broadcast_arrays(n_arr, d_arr)
        except ValueError as exc:
            raise PrivacyParameterError(f"num {n_arr.shape} and den {d_arr.shape} do not broadcast") from exc
        if d_arr.size:
            if (d_arr < 1).any():
                raise PrivacyParameterError(f"den must be at least 1; got {min(d_arr.flat)}")
            if (n_arr < 0).any():
                raise PrivacyParameterError(f"num must be non-negative; got {min(n_arr.flat)}")
            if (n_arr > d_arr).any():
                raise PrivacyParameterError("num must not exceed den (a probability is at most 1)")
        return self._bernoulli_unchecked(n_arr.ravel(), d_arr.ravel()).reshape(d_arr.shape)

    # ---- internals (validated inputs, 1-D) -----------------------------------------------
    def _bernoulli_unchecked(self, num: np.ndarray, den: np.ndarray) -> np.ndarray:
        """Bernoulli(num/den) for validated 1-D arrays: ``U < num`` with ``U`` uniform below den.

        The samplers' inner loop, which has already established ``0 <= num <= den``.
        """
        if _fits_int64(den) and _fits_int64(num):
            return self._below_u64(den.astype(np.uint64)).astype(np.int64) < num.astype(np.int64)
        return self._below_big(den.astype(object)) < num.astype(object)

    def _below_u64(self, high: np.ndarray) -> np.ndarray:
        """Uniform below each of ``high`` (1-D uint64, values in [1, 2**63]); uint64 out.

        When every bound is at most 2**32, each word is split into two 32-bit halves (half
        the entropy per draw, the same rule with 2**32 in place of 2**64).
        """
        half = bool(high.size) and int(high.max()) <= 2**32
        draw = self._half_words if half else self.words
        span_minus = (lambda h: np.uint64(2**32) - h) if half else (lambda h: ~h + np.uint64(1))
        w = draw(high.size)
        out = w % high
        # Keep w when its block [w - w mod h, w - w mod h + h) lies inside [0, span):
        # w - w mod h <= span - h (span - h computed without overflow for h >= 1).
        redo = np.flatnonzero((w - out) > span_minus(high))
        while redo.size:
            h = high[redo]
            w = draw(redo.size)
            r = w % h
            bad = (w - r) > span_minus(h)
            good = ~bad
            out[redo[good]] = r[good]
            redo = redo[bad]
        return out

    def _half_words(self, n: int) -> np.ndarray:
        """``n`` uniform 32-bit values (as uint64), two from each 64-bit word."""
        w = self.words((n + 1) // 2)
        halves = np.empty(2 * w.size, dtype=np.uint64)
        halves[0::2] = w & np.uint64(0xFFFFFFFF)
        halves[1::2] = w >> np.uint64(32)
        return halves[:n]

    def _below_big(self, high: np.ndarray) -> np.ndarray:
        """Uniform below each of ``high`` (1-D object array of Python ints >= 1); object out."""
        out = np.empty(high.size, dtype=object)
        todo = np.arange(high.size)
        h = high
        while todo.size:
            n_words = max(int(x).bit_length() for x in h) // 64 + 2
            span = 1 << (64 * n_words)
            w = self._big_words(todo.size, n_words)
            r = w % h
            good = (w - r + h) <= span
            good = good.astype(bool)
            out[todo[good]] = r[good]
            todo = todo[~good]
            h = h[~good]
        return out

    def _big_words(self, n: int, n_words: int) -> np.ndarray:
        """``n`` uniform integers on ``[0, 2**(64 n_words))`` as Python ints (object array)."""
        raw = self.words(n * n_words).reshape(n_words, n).astype(object)
        total = raw[0]
        for j in range(1, n_words):
            total = total + (raw[j] << (64 * j))
        return total


class SecureRandom(RandomSource):
    """Cryptographically secure words from ``os.urandom`` (the default source)."""

    is_private = True
    description = "os.urandom (cryptographically secure)"

    def words(self, n: int) -> np.ndarray:
        """Return ``n`` uniform words read from ``os.urandom``."""
        n = _as_count(n)
        buf = bytearray(os.urandom(8 * n))  # bytearray: a writable array, like the seeded source
        return np.frombuffer(buf, dtype="<u8").astype(np.uint64, copy=False)

    def __repr__(self) -> str:
        return "SecureRandom()"


class SeededRandom(RandomSource):
    """Reproducible words from numpy's PCG64 generator. Seeded, NOT private.

    For reproducible research and for tests only: the noise is a function of the seed,
    so a release drawn with it protects nobody who might learn the seed.

    Parameters
    ----------
    seed : int
        Non-negative seed.
    """

    is_private = False

    def __init__(self, seed: int) -> None:
        self.seed = _check_seed(seed)
        self._generator = np.random.Generator(np.random.PCG64(self.seed))
        self.description = f"numpy PCG64 with seed {self.seed} (seeded, NOT private)"

    def words(self, n: int) -> np.ndarray:
        """Return the generator's next ``n`` uniform 64-bit words."""
        n = _as_count(n)
        return self._generator.integers(0, 2**64, size=n, dtype=np.uint64)

    def __repr__(self) -> str:
        return f"SeededRandom({self.seed})"


def make_random(seed: int | None = None) -> RandomSource:
    """The random source for a release: secure by default, seeded only on request.

    Parameters
    ----------
    seed : int, optional
        ``None`` (default) gives :class:`SecureRandom`; a non-negative integer gives
        :class:`SeededRandom` (reproducible, NOT private).
    """
    if seed is None:
        return SecureRandom()
    return SeededRandom(seed)


# ---- validation helpers ------------------------------------------------------------------
def _check_seed(seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise PrivacyParameterError(f"seed must be a non-negative integer or None; got {seed!r}")
    if int(seed) < 0:
        raise PrivacyParameterError(f"seed must be non-negative; got {int(seed)}")
    return int(seed)


def _as_count(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or int(n) < 0:
        raise PrivacyParameterError(f"n (number of words) must be a non-negative integer; got {n!r}")
    return int(n)


def _as_int_array(value, name: str) -> np.ndarray:
    """An integer array (int64 when every value fits, else object of Python ints)."""
    if isinstance(value, (bool, np.bool_)):
        raise PrivacyParameterError(f"{name} must be an integer or integer array; got {value!r}")
    if isinstance(value, numbers.Integral):
        v = int(value)
        return np.asarray(v, dtype=np.int64 if -INT64_MAX - 1 <= v <= INT64_MAX else object)
    arr = np.asarray(value)
    if arr.dtype == object:
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in arr.flat):
            raise PrivacyParameterError(f"{name} must hold integers only")
        arr = np.vectorize(int, otypes=[object])(arr) if arr.size else arr
        return arr.astype(np.int64) if _fits_int64(arr) else arr
    if arr.dtype.kind == "u":
        if arr.size and int(arr.max()) > INT64_MAX:
            return arr.astype(object)
        return arr.astype(np.int64)
    if arr.dtype.kind != "i":
        raise PrivacyParameterError(f"{name} must be an integer or integer array; got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _fits_int64(arr: np.ndarray) -> bool:
    if arr.dtype != object:
        return True
    if arr.size == 0:
        return True
    return -INT64_MAX - 1 <= min(arr.flat) and max(arr.flat) <= INT64_MAX


def _broadcast(arr: np.ndarray, size, name: str) -> np.ndarray:
    if size is None:
        return arr
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (numbers.Integral, tuple)):
        raise PrivacyParameterError(f"size must be a non-negative integer or tuple; got {size!r}")
    shape = (size,) if isinstance(size, numbers.Integral) else size
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and s >= 0 for s in shape):
        raise PrivacyParameterError(f"size must be a non-negative integer or tuple; got {size!r}")
    try:
        return np.broadcast_to(arr, tuple(int(s) for s in shape))
    except ValueError as exc:
        raise PrivacyParameterError(f"{name} of shape {arr.shape} does not broadcast to size {shape}") from exc
