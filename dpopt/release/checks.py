"""Checks that stop or warn before any budget is spent (issue #24 item 8).

Two moments come before the first draw:

* the plan (public information only): :func:`check_synthetic_total` refuses synthetic records
  whose number would be set by the noise rather than by the data. A release whose table is a fit
  to noisy measurements (an algorithm with a ``[reconstruct]`` section) releases a noisy total;
  when the noise on that total (:func:`noise_on_total`) is larger than
  :data:`~dpopt.release.outputs.MAX_SYNTHETIC_RECORDS`, expanding the table into records would be
  refused after the budget was spent, so the plan refuses it first. An invariant that fixes the
  total (a partition of the cells, such as published state totals) makes the total exact;
* the read (the data are in memory, nothing drawn yet): :func:`warn_before_spending` warns, in
  one line each, when the data hold no records and when a measurement's noise standard deviation
  exceeds the number of records (its answers would be mostly noise). The warnings compare with
  the data's size but never state it: it is confidential (:mod:`dpopt.errors`).
"""

from __future__ import annotations

import warnings

import numpy as np

from dpopt.errors import DataWarning, SpecError

__all__ = ["noise_on_total", "check_synthetic_total", "warn_before_spending"]

#: Domains up to this many cells get the least-squares route of :func:`_total_weight` for
#: measurements whose rows do not partition the cells (Fourier parities, strategies).
LSQR_CELLS = 2_000_000


def noise_on_total(p) -> float | None:
    """Standard deviation of the noise on the table's total as the planned measurements estimate it.

    Each measurement ``A_i`` with noise ``sigma_i`` per answer gives the unbiased estimate
    ``u_i^T y_i`` of the total, ``u_i`` the least-norm solution of ``A_i^T u = 1`` (for a
    marginal or the identity, whose rows partition the cells, ``u_i = 1`` and the variance is
    ``rows_i sigma_i^2``); their inverse-variance combination has the variance returned here
    squared. None when no measurement determines the total.
    """
    precision = 0.0
    for step in p.steps:
        sd = step.stddev
        if step.query is None or sd is None or not np.isfinite(sd) or sd <= 0:
            continue
        weight = _total_weight(step.query)
        if weight is not None:
            precision += 1.0 / (sd * sd * weight)
    return precision ** -0.5 if precision > 0 else None


def check_synthetic_total(p) -> None:
    """Refuse (naming ``output.synthetic``) synthetic records whose count the noise would set.

    Applies to algorithms whose table is a fit to noisy measurements (a ``[reconstruct]``
    section); see the module notes.
    """
    from dpopt.release.outputs import MAX_SYNTHETIC_RECORDS

    if not p.spec.output.synthetic or "reconstruct" not in getattr(p.algorithm, "sections", {}):
        return
    if any(_partitions(inv.query) for inv in p.constraints.invariants):
        total = max(float(np.sum(inv.values)) for inv in p.constraints.invariants if _partitions(inv.query))
        if total > MAX_SYNTHETIC_RECORDS:
            raise p.spec.error(("output", "synthetic"), f"the invariants fix the released total at {total:,.0f}, "
                               f"above the limit of {MAX_SYNTHETIC_RECORDS:,} synthetic records; set "
                               "output.synthetic = false (the table itself is still released)", SpecError)
        return
    if any(_partitions(query) for _, query, _ in p.data_invariants):
        return  # the total is the data's, published exactly
    sd = noise_on_total(p)
    if sd is not None and sd > MAX_SYNTHETIC_RECORDS:
        raise p.spec.error(("output", "synthetic"), (
            f"the planned noise leaves the released total uncertain by about {sd:,.3g} records (one standard "
            f"deviation), above the limit of {MAX_SYNTHETIC_RECORDS:,} synthetic records: their number would be "
            "set by the noise and refused only after the budget was spent; raise the budget, or set "
            "output.synthetic = false (the table itself can still be released)"), SpecError)


def warn_before_spending(p, data, what: str) -> None:
    """One-line :class:`~dpopt.errors.DataWarning` s about the data, before any draw: no records;
    measurements whose noise standard deviation exceeds the number of records (never stated)."""
    if data.total == 0:
        warnings.warn(f"{what} hold no records: every released answer will be noise alone", DataWarning,
                      stacklevel=3)
        return
    steps = [s for s in p.steps if s.stddev is not None and np.isfinite(s.stddev)]
    noisy = [s for s in steps if s.stddev > data.total]
    if noisy:
        worst = max(noisy, key=lambda s: s.stddev)
        warnings.warn(f"the noise on {len(noisy)} of {len(steps)} measurements (standard deviation up to "
                      f"{worst.stddev:,.3g}, in {worst.label!r}) exceeds the number of records in {what}: their "
                      "answers will be mostly noise; consider a larger budget (the number of records is "
                      "confidential and not shown)", DataWarning, stacklevel=3)


# ---- how a measurement estimates the total --------------------------------------------------------
def _partitions(query) -> bool:
    """True when every cell lies in exactly one row, with coefficient 1 (a marginal, the identity, the total)."""
    ones = np.ones(query.num_rows)
    return bool(np.allclose(query.column_norm_powers(1), 1.0) and np.allclose(query.column_norm_powers(2), 1.0)
                and np.allclose(query.rmatvec(ones), 1.0))


def _total_weight(query) -> float | None:
    """``||u||^2`` for the least-norm ``u`` with ``A^T u = 1`` (the total as a combination of the
    query's answers), or None when the answers do not determine the total (or the domain is too
    large to look)."""
    if _partitions(query):
        return float(query.num_rows)
    n = query.domain.size
    if n > LSQR_CELLS:
        return None
    from scipy.sparse.linalg import LinearOperator, lsqr

    transpose = LinearOperator((n, query.num_rows), matvec=query.rmatvec, rmatvec=query.matvec, dtype=float)
    u = lsqr(transpose, np.ones(n), atol=1e-12, btol=1e-12, iter_lim=200)[0]
    if np.linalg.norm(query.rmatvec(u) - 1.0) > 1e-6 * np.sqrt(n):
        return None
    return float(u @ u)
