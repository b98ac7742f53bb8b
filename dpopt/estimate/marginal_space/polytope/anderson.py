"""Anderson acceleration of a fixed-point iteration ``s <- s + f(s)``: ADMM's speed-up (issue 27).

ADMM (:mod:`.admm`) is a fixed-point iteration on one vector: with ``z = P(s)`` and ``u = s - z``
its step is ``s <- T(s) = s + α (E r(s) - P(s))``, the relaxed Douglas–Rachford map (Eckstein and
Bertsekas 1992). Its residual ``f(s) = T(s) - s`` falls sublinearly, and late in a run on adult's
triples the certified gap fell about 10 % per 200 steps. Type-II Anderson acceleration (Anderson
1965; Walker and Ni, "Anderson acceleration for fixed-point iterations", SIAM J. Numer. Anal.
49(4), 2011, eq. (1.2)) extrapolates from the last ``M`` steps: with ``ΔS``, ``ΔF`` the
differences of the last ``M + 1`` iterates and residuals,

    γ = argmin ||f_k - ΔF γ||²,        s_{k+1} = s_k + f_k - (ΔS + ΔF) γ                     (11)

the secant step that would zero the residual if ``f`` were affine over the span of the history.
This is A2DR's acceleration of Douglas–Rachford (Fu, Zhang and Boyd, "Anderson accelerated
Douglas–Rachford splitting", SIAM J. Sci. Comput. 42(6), 2020, algorithm 3.1), and SCS 3's and
COSMO's of their ADMM. The least squares is solved from the ``M × M`` Gram matrix ``ΔFᵀΔF``
(one row of ``M`` dot products per step, kept up to date) with a Tikhonov term
``REGULARIZATION × trace / M`` (Fu et al. §3.2) against its ill-conditioning.

**Safeguard.** An extrapolated point is kept only if its residual is no larger than the
residual of the point it was made from; otherwise the plain step ``s_k + f_k`` is taken instead
and the memory is cleared (the non-expansiveness check of Garstka, Cannon and Goulart,
"Safeguarded Anderson acceleration for parametric nonexpansive operators", ECC 2022, §III, with
its memory restart). The check costs nothing: the residual is the next step's own. Whatever the
acceleration does, nothing is released that the certificate does not pass: every check pairs
multipliers with a feasible point, both recomputed from scratch.

Cost per step: ``3M`` vector reads over the clique cells (two matrix-vector products with ``ΔF``,
the Gram row and the least squares' right side, and one with the stored sums ``ΔS + ΔF``, the
step), against an ``expand`` and an ``adjoint``; memory ``2M + 3`` vectors. Storing ``ΔS`` apart
took a fourth product: on adult's 84-triple stand-in (memory 10) the history's work per step
was about 65 ms with it, 48 without (profiled over 248 steps). One matrix product with
``[ΔF_new, f]`` in place of the first two reads the history once but was slower (OpenBLAS: 28 ms
against 17 for the two). On several threads the update runs in contiguous pieces of the cells
(:class:`Anderson`'s ``threads``), each piece's differences and dot products in one pass.
"""

from __future__ import annotations

import numpy as np

from dpopt.workers import in_threads, split_range

__all__ = ["MEMORY", "MEMORY_BYTES", "REGULARIZATION", "Anderson", "anderson_memory"]

#: Steps remembered: on adult's 9-attribute stand-in (84 triples, zCDP ε 1) the certified gap
#: after 1,000 steps was 2.8e-4 plain, 8.7e-5 with 5 and 5.5e-5 with 10.
MEMORY = 10
#: Largest memory for the history, in bytes (its ``2M`` vectors of 8-byte cells).
MEMORY_BYTES = 2 * 2 ** 30
#: The Tikhonov term of (11), relative to the Gram matrix's mean diagonal.
REGULARIZATION = 1e-8


def anderson_memory(cells: int, memory: int = MEMORY, budget: int = MEMORY_BYTES) -> int:
    """The memory ``M`` for ``cells`` clique cells: ``memory`` steps, fewer when ``2M`` vectors
    would exceed ``budget`` bytes (0: no acceleration)."""
    return int(max(0, min(int(memory), int(budget) // (16 * max(int(cells), 1)))))


class Anderson:
    """The history and the step (11) for vectors of ``size`` entries and memory ``memory``.

    With ``threads`` > 1 the step's passes over the vectors run in that many contiguous pieces at
    once (:func:`~dpopt.workers.in_threads`): each piece's differences, dot products and step are
    made in one pass over it, and the pieces' dot products summed (so the rounding, not the
    values, depends on the number of pieces)."""

    def __init__(self, size: int, memory: int, regularization: float = REGULARIZATION, threads: int = 1):
        if memory < 1:
            raise ValueError(f"Anderson memory must be at least 1, got {memory}")
        self.memory, self.regularization = int(memory), float(regularization)
        self.dg = np.empty((self.memory, size))  # ΔS + ΔF: the step (11) needs only their sum
        self.df = np.empty((self.memory, size))
        self.gram = np.zeros((self.memory, self.memory))
        self.prev_s, self.prev_f, self.combination = np.empty(size), np.empty(size), np.empty(size)
        self.count, self.started = 0, False
        self.pieces = split_range(size, threads)

    def reset(self) -> None:
        """Forget the history (after a rejected step or a change of the map)."""
        self.count, self.started = 0, False

    def _record(self, s: np.ndarray, f: np.ndarray, out: np.ndarray, j: int | None, n: int, t: int):
        """One piece of the history's update: ``ΔF`` and ``ΔS + ΔF`` into slot ``j`` (None: no
        history yet), the piece's Gram row and right side over the first ``n`` slots, the new
        previous point, and the plain step ``s + f`` into ``out``."""
        lo, hi = self.pieces[t]
        row = rhs = None
        if j is not None:
            df, dg = self.df[j, lo:hi], self.dg[j, lo:hi]
            np.subtract(f[lo:hi], self.prev_f[lo:hi], out=df)
            np.subtract(s[lo:hi], self.prev_s[lo:hi], out=dg)
            dg += df
            row = self.df[:n, lo:hi] @ df
            rhs = self.df[:n, lo:hi] @ f[lo:hi]
        self.prev_s[lo:hi] = s[lo:hi]
        self.prev_f[lo:hi] = f[lo:hi]
        np.add(s[lo:hi], f[lo:hi], out=out[lo:hi])
        return row, rhs

    def _extrapolate(self, gamma: np.ndarray, out: np.ndarray, t: int) -> None:
        """One piece of ``out -= (ΔS + ΔF) γ``, without a fresh vector over the cells."""
        lo, hi = self.pieces[t]
        # matmul, not dot: np.dot copies a strided slice of the history (10x slower on one of adult's)
        np.matmul(gamma, self.dg[:len(gamma), lo:hi], out=self.combination[lo:hi])
        out[lo:hi] -= self.combination[lo:hi]

    def step(self, s: np.ndarray, f: np.ndarray, out: np.ndarray) -> bool:
        """Write the next iterate (11) from ``s`` and its residual ``f`` into ``out`` (not ``s``
        or ``f``); True when it is extrapolated, False when it is the plain step ``s + f`` (no
        history yet, or a least squares that is not finite)."""
        j = None
        if self.started:
            j = self.count % self.memory
            self.count += 1
        n = min(self.count, self.memory)
        parts = in_threads(lambda t: self._record(s, f, out, j, n, t), len(self.pieces))
        self.started = True
        if n == 0:
            return False
        row = np.sum([part[0] for part in parts], axis=0)
        self.gram[j, :n] = row
        self.gram[:n, j] = row
        scale = max(float(np.trace(self.gram[:n, :n])) / n, 1e-300)
        gram = self.gram[:n, :n] + self.regularization * scale * np.eye(n)
        try:
            gamma = np.linalg.solve(gram, np.sum([part[1] for part in parts], axis=0))
        except np.linalg.LinAlgError:
            gamma = None
        if gamma is None or not np.all(np.isfinite(gamma)):
            self.reset()
            return False
        in_threads(lambda t: self._extrapolate(gamma, out, t), len(self.pieces))
        return True
