"""What an audit checks: the (ε, δ) a release claims, read from its budget.

A pure budget claims ``(ε, 0)``; an (ε, δ) budget claims itself. A zCDP budget is audited as
the (ε, δ)-DP guarantee it implies (Canonne, Kamath, Steinke 2020, Cor. 13) at its declared δ,
or at :data:`AUDIT_DELTA` when only ρ was given: an audit sees events, and events are bounded
in (ε, δ), not in ρ.

:meth:`Claim.group` is the guarantee for datasets two add/remove steps apart (moving one
record), used when the audit must keep published-exact statistics such as the record count
equal: ``kε`` for pure DP, ``(kε, k e^{(k-1)ε} δ)`` for (ε, δ)-DP (Dwork and Roth 2014,
Theorem 2.2 and its approximate form), ``k²ρ`` for zCDP (Bun and Steinke 2016, Prop. 1.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpopt.privacy.budget import Budget
from dpopt.privacy.conversions import zcdp_to_approx_dp

__all__ = ["Claim", "AUDIT_DELTA"]

#: δ at which a zCDP budget given as ρ alone is audited.
AUDIT_DELTA = Fraction(1, 10**6)


@dataclass(frozen=True)
class Claim:
    """The guarantee under audit: (ε, δ)-DP for one neighbour relation.

    Attributes
    ----------
    epsilon, delta : float
    notion : str
        ``"pure"``, ``"approx"`` or ``"zcdp"`` (the accounting it came from).
    text : str
        The budget as declared, for reports.
    rho : Fraction or None
        ρ of a zCDP claim.
    distance : int
        Add/remove steps between the audited neighbours (1; 2 for a moved record).
    """

    epsilon: float
    delta: float
    notion: str
    text: str
    rho: Fraction | None = None
    distance: int = 1

    @classmethod
    def of(cls, budget: Budget) -> "Claim":
        """The claim of a budget (module notes)."""
        if budget.accounting == "pure":
            return cls(float(budget.epsilon), 0.0, "pure", f"epsilon = {budget.epsilon}")
        if budget.accounting == "approx":
            return cls(float(budget.epsilon), float(budget.delta), "approx",
                       f"epsilon = {budget.epsilon}, delta = {budget.delta}")
        delta = budget.delta if budget.delta is not None else AUDIT_DELTA
        eps = zcdp_to_approx_dp(budget.rho, delta)
        text = (f"rho = {budget.rho}" + (f" (declared as epsilon = {budget.epsilon}, delta = {budget.delta})"
                                          if budget.epsilon is not None else f", audited at delta = {delta}"))
        return cls(eps, float(delta), "zcdp", text, rho=budget.rho)

    def group(self, k: int = 2) -> "Claim":
        """The guarantee between datasets ``k`` add/remove steps apart (module notes)."""
        if self.notion == "zcdp":
            rho = self.rho * k * k
            eps = zcdp_to_approx_dp(rho, Fraction(self.delta).limit_denominator(10**12))
            return Claim(eps, self.delta, "zcdp", f"{self.text}; {k} steps apart: rho = {rho}", rho=rho,
                         distance=k * self.distance)
        eps = k * self.epsilon
        delta = k * math.exp((k - 1) * self.epsilon) * self.delta
        return Claim(eps, delta, self.notion, f"{self.text}; {k} steps apart (group privacy)",
                     distance=k * self.distance)

    def describe(self) -> str:
        """``epsilon = 0.5`` or ``epsilon = 1.03, delta = 1e-06`` (what is audited)."""
        text = f"epsilon = {self.epsilon:.4g}"
        return text + (f", delta = {self.delta:.3g}" if self.delta else "")

    def to_dict(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta, "notion": self.notion, "declared": self.text,
                "rho": None if self.rho is None else str(self.rho), "neighbour_distance": self.distance}
