"""A noisy record count paid from the budget, for algorithms whose papers take ``n`` as public.

**Why the papers' n is public.** MWEM (Hardt, Ligett, McSherry, NIPS 2012, Fig. 1) starts from
"Let n denote ||B||, the number of records in B. Let A_0 denote n times the uniform
distribution", divides its multiplicative-weights step by ``2n`` and renormalises to ``n``
records; the proof of its Theorem 2.1 composes the ``T`` exponential and ``T`` Laplace steps
and charges nothing for ``n``. Its arXiv version (2018, Section 2) normalises counting queries
to ``f(D) = E_{x~D} f(x)`` with "sensitivity 1/n": datasets of one public size ``n`` that differ
in a replaced record. DualQuery (Gaboardi, Gallego Arias, Hsu, Roth, Wu, ICML 2014; its code
release computes the privacy of ``s`` samples per round as ``ε_0 = 2η(T-1)/n``) answers
queries as record fractions ``q(D) ∈ [0, 1]``, again with ``n`` public. dpopt's neighbours add
or remove one record, so a release whose total is the exact ``n`` discloses it exactly (the
privacy audit finds it: ``docs/pages/audit.md``).

**The noisy count.** With ``count_share = s`` (a fraction in (0, 1)), the algorithm first
measures the record count (the ``Total`` query, sensitivity 1) with the budget's noise at the
share ``s`` -- discrete Laplace at ``s·ε`` under pure and (ε, δ) budgets (δ stays with the rest),
the discrete Gaussian at ``s·ρ`` under zCDP -- charged before its draw, and runs on the
remaining ``(1 - s)`` of the budget with the noisy count ``n̂`` wherever the paper uses ``n``.
Each later step is private for *every* public value of ``n``: MWEM's selections and
measurements answer counting queries of the data (sensitivity 1, whatever ``n``), its update
only scales by ``n̂`` (post-processing); DualQuery's log-weights ``η Σ (c_q/n̂ - q(x_i))`` move by
at most ``η(t-1)/n̂`` when a record is added or removed, so the guarantee of
:mod:`dpopt.algorithms.dualquery_privacy` holds with ``n̂`` in place of ``n``. Sequential
composition gives the whole budget, and the release is then private under add/remove-one
neighbours.

The count used is ``max(n̂, 1)``: the projection of the noisy count onto the totals these
algorithms can run with (their weights are scaled by ``1/n``); it is post-processing of ``n̂``.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from dpopt.algorithms.base import PlannedMeasure
from dpopt.errors import ParameterError, PrivacyParameterError
from dpopt.model.queries.basic import Total
from dpopt.privacy.accountant import PrivacyCost, as_fraction
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate, measure

__all__ = ["COUNT_LABEL", "check_count_share", "count_step", "rest_of_budget", "scale_shares", "measure_count",
           "count_note", "PUBLIC_N_NOTE"]

#: The ledger label of the noisy record count.
COUNT_LABEL = "record count"
#: What a release that uses the exact n tells its reader (the papers' setting).
PUBLIC_N_NOTE = ("The record count n = {n:g} is treated as public, as in the paper; it is {where} and is NOT "
                 "protected by the privacy budget (set count_share to measure it with noise).")


def check_count_share(value) -> Fraction | None:
    """``None`` (the paper's public n) or an exact fraction in (0, 1) (ParameterError otherwise)."""
    if value is None:
        return None
    try:
        share = as_fraction(value, "count_share")
    except PrivacyParameterError:
        raise ParameterError(f"count_share must be a number in (0, 1), got {value!r}") from None
    if not 0 < share < 1:
        raise ParameterError(f"count_share must be in (0, 1) (the share of the budget for a noisy record count), "
                             f"got {value!r}")
    return share


def count_step(domain, budget: Budget, share: Fraction) -> PlannedMeasure:
    """The planned measurement of the record count at ``share`` of ``budget`` (module notes)."""
    total = budget.total
    if budget.accounting == "zcdp":
        cost = PrivacyCost.zcdp(total.rho * share)
    else:  # Laplace at share * epsilon; an (epsilon, delta) budget keeps its delta for the rest
        cost = PrivacyCost.pure(total.epsilon * share)
    query = Total(domain)
    law = calibrate(query, cost)
    return PlannedMeasure(COUNT_LABEL, query, law.mechanism, share, cost, law,
                          what="the number of records (noisy; used in place of the public n)", answers=1)


def rest_of_budget(budget: Budget, share: Fraction | None) -> Budget:
    """What is left of ``budget`` for the algorithm's own steps after the count's share."""
    if not share:
        return budget
    keep = 1 - share
    if budget.accounting == "pure":
        return Budget.pure(budget.epsilon * keep)
    if budget.accounting == "approx":
        return Budget.approx(budget.epsilon * keep, budget.delta)
    return Budget.zcdp(budget.total.rho * keep)


def scale_shares(steps, share: Fraction | None) -> list:
    """``steps`` planned on :func:`rest_of_budget`, their shares restated as shares of the whole."""
    if not share:
        return list(steps)
    return [replace(s, share=s.share * (1 - share)) for s in steps]


def measure_count(step: PlannedMeasure, data, accountant, rng):
    """``(measurement, n)``: the noisy count (charged first) and ``max(n̂, 1)`` (module notes)."""
    m = measure(step.query, data, step.law, accountant, rng, label=COUNT_LABEL)
    return m, max(int(round(float(m.values[0]))), 1)


def count_note(n: int, share: Fraction) -> str:
    """What a release that measured its record count tells its reader."""
    return (f"The record count was measured with noise ({COUNT_LABEL!r}, {share} of the budget): the algorithm "
            f"used n = {n} (the noisy count, at least 1) wherever its paper uses the public n, so the release is "
            "private for added or removed records.")
