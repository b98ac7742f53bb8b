"""The four mechanisms of :mod:`dpopt.privacy.mechanisms` as audit targets, on tiny domains.

Each target calls the real mechanism (charging a fresh accountant, then drawing from the
harness's seeded source) and returns its output as the statistics:

* ``laplace``: :func:`~dpopt.privacy.mechanisms.laplace_mechanism` on the histogram of a
  2-cell domain (L1 sensitivity 1): the noisy counts;
* ``gaussian``: :func:`~dpopt.privacy.mechanisms.gaussian_mechanism` under (ε, δ) on the same
  histogram: the noisy counts;
* ``exponential`` and ``report_noisy_max``: the index chosen among the cells of a 4-cell
  domain with scores ``u_i = 2·count_i - n`` (sensitivity 1). A record added to cell ``j``
  raises ``u_j`` by 1 and lowers every other score by 1: scores moving in opposite directions
  are the worst case of both mechanisms (with counts alone, which all move the same way, the
  exponential mechanism leaks at most ε/2).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpopt.audit.claims import Claim
from dpopt.audit.targets import AuditTarget, ledger_problem
from dpopt.errors import ParameterError
from dpopt.model.domain import Domain
from dpopt.model.queries.basic import Identity
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import (
    calibrate,
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    report_noisy_max,
)

__all__ = ["MechanismTarget", "mechanism_targets", "MECHANISMS"]

#: The audited mechanisms.
MECHANISMS = ("laplace", "gaussian", "exponential", "report_noisy_max")


@dataclass(frozen=True)
class _Step:
    """What the adversarial-cell search reads of a planned step."""

    label: str
    query: object
    law: object


class MechanismTarget(AuditTarget):
    """One mechanism of :data:`MECHANISMS` (module notes).

    Parameters
    ----------
    mechanism : str
    epsilon : number
        The claimed ε (exact rational).
    delta : number, optional
        δ of the Gaussian mechanism (default 1e-6).
    """

    def __init__(self, mechanism: str, epsilon=Fraction(1, 2), delta=Fraction(1, 10**6)) -> None:
        if mechanism not in MECHANISMS:
            raise ParameterError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        self.mechanism = mechanism
        self.epsilon = Fraction(epsilon)
        self.delta = Fraction(delta)
        self.name = mechanism
        if mechanism in ("laplace", "gaussian"):
            self.domain = Domain.from_dict({"x": 2})
            self.query = Identity(self.domain)
            self.names = [f"noisy count[x={i}]" for i in range(2)]
        else:
            self.domain = Domain.from_dict({"x": 4})
            self.query = None
            self.names = ["chosen index"]
        if mechanism == "gaussian":
            self.budget = Budget.approx(self.epsilon, self.delta)
            self.title = "discrete Gaussian on a 2-cell histogram (Canonne, Kamath, Steinke 2020)"
        else:
            self.budget = Budget.pure(self.epsilon)
            self.title = {"laplace": "discrete Laplace on a 2-cell histogram",
                          "exponential": "exponential mechanism over 4 candidates (McSherry, Talwar 2007)",
                          "report_noisy_max": "report noisy max over 4 candidates (Dwork, Roth 2014, Claim 3.9)"
                          }[mechanism]
        self.claim = Claim.of(self.budget)
        self.cost = self.budget.total

    def steps(self) -> list:
        if self.query is None:
            return []
        law = calibrate(self.query, self.budget.total, "gaussian" if self.mechanism == "gaussian" else "laplace")
        return [_Step(self.mechanism, self.query, law)]

    def run(self, data, rng):
        accountant = self.budget.accountant()
        if self.mechanism == "laplace":
            out = laplace_mechanism(self.query, data, self.epsilon, accountant, rng).values
        elif self.mechanism == "gaussian":
            out = gaussian_mechanism(self.query, data, accountant, rng, epsilon=self.epsilon, delta=self.delta).values
        else:
            counts = data.histogram()
            scores = 2 * counts - counts.sum()
            pick = exponential_mechanism if self.mechanism == "exponential" else report_noisy_max
            out = np.array([pick(scores, self.epsilon, accountant, rng, sensitivity=1)])
        return np.asarray(out, dtype=np.float64), ledger_problem(accountant, self.cost)


def mechanism_targets(epsilon=Fraction(1, 2), delta=Fraction(1, 10**6)) -> list[MechanismTarget]:
    """One target per mechanism, at the same claimed ε (δ for the Gaussian)."""
    return [MechanismTarget(m, epsilon, delta) for m in MECHANISMS]
