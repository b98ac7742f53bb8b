"""Exact privacy accounting: budgets in rationals, charged before any noise is drawn.

An :class:`Accountant` holds a total budget in one *currency* and a ledger of charges:

* ``Accountant.pure(ε)``: currency ε; sequential composition, ε adds.
* ``Accountant.approx(ε, δ)``: currency (ε, δ); basic sequential composition, ε and δ add.
* ``Accountant.zcdp(ρ)``: currency ρ; ρ adds (Bun & Steinke 2016, Lemma 2.3).
* ``Accountant.zcdp_from_approx(ε, δ)``: as ``zcdp`` with ρ = ``approx_dp_to_zcdp(ε, δ)``;
  the summary and ledger frame report the (ε, δ)-DP guarantee of what is spent.

A mechanism states what one invocation costs as a :class:`PrivacyCost` and calls
``accountant.charge(cost, label)`` *before* it samples noise. The charge is converted into the
accountant's currency:

* pure ε under zCDP costs ρ = ε²/2 (Bun & Steinke 2016, Prop. 1.4); a cost stating both ρ and
  a pure ε is charged min(ρ, ε²/2), both being valid guarantees;
* a zCDP cost under an (ε, δ) accountant is accepted only if it also states its (ε, δ);
  under a pure accountant only if it also states a pure ε;
* an (ε, δ) cost with δ > 0 cannot be charged to a pure or a zCDP accountant.

If the converted cost does not fit the remaining budget (exact Fraction comparison) the charge
raises :class:`~dpopt.errors.BudgetExceededError` and changes nothing.

Numbers: every budget is a :class:`fractions.Fraction`. Floats are read through their decimal
repr, so ``0.1`` means exactly 1/10; strings such as ``"1/3"`` are accepted
(see :func:`dpopt.privacy.conversions.as_fraction`).

Composition helpers: :meth:`Accountant.split` (exact proportional shares),
:meth:`Accountant.parallel` (parallel composition over disjoint parts, McSherry 2009,
Theorem 4: the parts' mechanisms together cost the maximum of their costs, reserved once) and
:meth:`Accountant.advanced_block` (k steps under advanced composition, Dwork, Rothblum, Vadhan
2010). Accountants are not thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import pandas as pd

from dpopt.errors import BudgetExceededError, PrivacyParameterError
from dpopt.privacy.conversions import (
    advanced_composition,
    approx_dp_to_zcdp,
    as_fraction,
    validate_delta,
    validate_epsilon,
    validate_rho,
    validate_steps,
    zcdp_to_approx_dp,
)

# as_fraction is re-exported: mechanisms read user numbers the same way as budgets.
__all__ = ["PrivacyCost", "LedgerEntry", "Accountant", "ParallelBudget", "AdvancedBlock", "as_fraction"]

Kind = Literal["pure", "approx", "zcdp"]

# Components of the budget, per currency.
_COMPONENTS: dict[str, tuple[str, ...]] = {
    "pure": ("epsilon",),
    "approx": ("epsilon", "delta"),
    "zcdp": ("rho",),
    "advanced": ("epsilon", "delta"),
}


def _fmt(q: Fraction) -> str:
    """'1/10 (0.1)': exact value and a float for reading."""
    return f"{q} ({float(q):.6g})"


# --------------------------------------------------------------------------------------------
# Cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivacyCost:
    """What one mechanism invocation costs, or an amount of budget in an accountant's currency.

    The fields state guarantees the invocation satisfies: (ε, δ)-DP when ``epsilon > 0`` or
    ``delta > 0`` (δ = 0 means pure ε-DP), and ρ-zCDP when ``rho`` is not None. A cost may
    state both (e.g. a Gaussian mechanism's ρ and its (ε, δ)); the mechanism is responsible
    for both being true.

    Parameters
    ----------
    epsilon
        ε >= 0 (Fraction; ints, floats-as-decimals and numeric strings are converted).
    delta
        δ in [0, 1).
    rho
        ρ >= 0, or None when no zCDP guarantee is stated.

    Use the constructors :meth:`pure`, :meth:`approx`, :meth:`zcdp`, which also require the
    stated parameters to be positive.
    """

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", validate_epsilon(self.epsilon, "epsilon", allow_zero=True))
        object.__setattr__(self, "delta", validate_delta(self.delta, "delta", allow_zero=True))
        if self.rho is not None:
            object.__setattr__(self, "rho", validate_rho(self.rho, "rho", allow_zero=True))

    @classmethod
    def pure(cls, epsilon: object) -> PrivacyCost:
        """An ε-DP invocation, ε > 0."""
        return cls(epsilon=validate_epsilon(epsilon, "epsilon"))

    @classmethod
    def approx(cls, epsilon: object, delta: object) -> PrivacyCost:
        """An (ε, δ)-DP invocation, ε >= 0, δ in [0, 1), not both zero."""
        eps = validate_epsilon(epsilon, "epsilon", allow_zero=True)
        dlt = validate_delta(delta, "delta", allow_zero=True)
        if eps == 0 and dlt == 0:
            raise PrivacyParameterError("approx cost needs epsilon > 0 or delta > 0, got epsilon=0, delta=0")
        return cls(epsilon=eps, delta=dlt)

    @classmethod
    def zcdp(cls, rho: object, *, epsilon: object = None, delta: object = None) -> PrivacyCost:
        """A ρ-zCDP invocation, ρ > 0; optionally also stating the (ε, δ)-DP it satisfies."""
        rho_q = validate_rho(rho, "rho")
        if epsilon is None and delta is None:
            return cls(rho=rho_q)
        if epsilon is None:
            raise PrivacyParameterError("zcdp cost: delta given without epsilon")
        eps = validate_epsilon(epsilon, "epsilon", allow_zero=True)
        dlt = validate_delta(0 if delta is None else delta, "delta", allow_zero=True)
        return cls(epsilon=eps, delta=dlt, rho=rho_q)

    @property
    def states_approx(self) -> bool:
        """True when the cost states an (ε, δ)-DP guarantee (pure when δ = 0)."""
        return self.epsilon > 0 or self.delta > 0

    def __str__(self) -> str:
        parts = []
        if self.states_approx or self.rho is None:
            parts.append(f"epsilon={self.epsilon}")
            if self.delta:
                parts.append(f"delta={self.delta}")
        if self.rho is not None:
            parts.append(f"rho={self.rho}")
        return "PrivacyCost(" + ", ".join(parts) + ")"


def _amount(kind: str, **values: Fraction) -> PrivacyCost:
    """A budget amount in a currency; zero components allowed."""
    if kind == "zcdp":
        return PrivacyCost(rho=values.get("rho", Fraction(0)))
    return PrivacyCost(epsilon=values.get("epsilon", Fraction(0)), delta=values.get("delta", Fraction(0)))


def _components(kind: str, amount: PrivacyCost) -> dict[str, Fraction]:
    return {name: getattr(amount, name) or Fraction(0) for name in _COMPONENTS[kind]}


def _add(kind: str, a: PrivacyCost, b: PrivacyCost) -> PrivacyCost:
    ca, cb = _components(kind, a), _components(kind, b)
    return _amount(kind, **{n: ca[n] + cb[n] for n in ca})


def _sub(kind: str, a: PrivacyCost, b: PrivacyCost) -> PrivacyCost:
    ca, cb = _components(kind, a), _components(kind, b)
    return _amount(kind, **{n: ca[n] - cb[n] for n in ca})


def _fits(kind: str, cost: PrivacyCost, room: PrivacyCost) -> bool:
    cc, cr = _components(kind, cost), _components(kind, room)
    return all(cc[n] <= cr[n] for n in cc)


def _describe(kind: str, amount: PrivacyCost) -> str:
    return ", ".join(f"{n}={_fmt(v)}" for n, v in _components(kind, amount).items())


def _check_cost(cost: object) -> PrivacyCost:
    if not isinstance(cost, PrivacyCost):
        raise PrivacyParameterError(f"cost must be a PrivacyCost, got {type(cost).__name__} {cost!r}")
    if not cost.states_approx and not cost.rho:
        raise PrivacyParameterError(f"cost {cost} states no privacy loss; nothing to charge")
    return cost


def _check_label(label: object) -> str:
    if not isinstance(label, str) or not label.strip():
        raise PrivacyParameterError(f"label must be a non-empty string, got {label!r}")
    return label


def _convert(kind: str, cost: PrivacyCost) -> PrivacyCost:
    """The cost in the currency ``kind``; PrivacyParameterError when it cannot be paid there."""
    if kind == "zcdp":
        options = []
        if cost.rho is not None:
            options.append(cost.rho)
        if cost.states_approx and cost.delta == 0:
            options.append(cost.epsilon * cost.epsilon / 2)  # Bun & Steinke 2016, Prop. 1.4
        if not options:
            raise PrivacyParameterError(
                f"cost {cost} is (epsilon, delta)-DP with delta > 0 and states no rho; "
                "it cannot be charged to a zCDP accountant"
            )
        return _amount("zcdp", rho=min(options))
    if kind == "pure":
        if not cost.states_approx:
            raise PrivacyParameterError(
                f"cost {cost} states only rho; a zCDP cost cannot be charged to a pure-DP accountant"
            )
        if cost.delta > 0:
            raise PrivacyParameterError(
                f"cost {cost} has delta > 0; an (epsilon, delta) cost cannot be charged to a pure-DP accountant"
            )
        return _amount("pure", epsilon=cost.epsilon)
    # approx and advanced
    if not cost.states_approx:
        raise PrivacyParameterError(
            f"cost {cost} states only rho; a zCDP cost can be charged to an (epsilon, delta) "
            "accountant only if it also states its (epsilon, delta), see PrivacyCost.zcdp"
        )
    return _amount(kind, epsilon=cost.epsilon, delta=cost.delta)


# --------------------------------------------------------------------------------------------
# Ledger
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One charge.

    Attributes
    ----------
    label
        What was charged (e.g. ``"county marginals, level 2"``).
    cost
        The charge in the accountant's currency.
    cumulative
        Total spent after this charge, in the accountant's currency.
    detail
        Free-form information given by the caller (mechanism, scale, query...).
    requested
        The cost as the mechanism stated it, before conversion to the currency.
    """

    label: str
    cost: PrivacyCost
    cumulative: PrivacyCost
    detail: object = None
    requested: PrivacyCost | None = None


class _Ledgered:
    """Shared ledger, reporting and charging skeleton of Accountant and AdvancedBlock."""

    kind: str
    _currency: str
    _spent: PrivacyCost
    _ledger: list[LedgerEntry]
    _report_delta: Fraction | None = None

    @property
    def spent(self) -> PrivacyCost:
        """Sum of all charges, in the currency (the ledger's costs sum to it exactly)."""
        return self._spent

    @property
    def ledger(self) -> list[LedgerEntry]:
        """The charges in order (a copy)."""
        return list(self._ledger)

    def _record(self, label: str, converted: PrivacyCost, requested: PrivacyCost, detail: object) -> LedgerEntry:
        self._spent = _add(self._currency, self._spent, converted)
        entry = LedgerEntry(label, converted, self._spent, detail, requested)
        self._ledger.append(entry)
        return entry

    def ledger_frame(self) -> pd.DataFrame:
        """The ledger as a DataFrame.

        Columns: ``label``; per budget component c (``epsilon``/``delta`` or ``rho``) the exact
        charge ``c`` and ``cumulative_c`` as Fraction objects (``frame[c].sum()`` is exact)
        and ``c_float``; for an accountant built with :meth:`Accountant.zcdp_from_approx`,
        ``cumulative_epsilon_at_delta`` (float, CKS 2020 conversion at the declared δ); and
        ``detail``.
        """
        names = _COMPONENTS[self._currency]
        columns: dict[str, pd.Series] = {"label": pd.Series([e.label for e in self._ledger], dtype=object)}
        for n in names:
            costs = [getattr(e.cost, n) for e in self._ledger]
            columns[n] = pd.Series(costs, dtype=object)
            columns[f"{n}_float"] = pd.Series([float(c) for c in costs], dtype=float)
            columns[f"cumulative_{n}"] = pd.Series([getattr(e.cumulative, n) for e in self._ledger], dtype=object)
        if self._report_delta is not None:
            columns["cumulative_epsilon_at_delta"] = pd.Series(
                [zcdp_to_approx_dp(e.cumulative.rho, self._report_delta) for e in self._ledger], dtype=float
            )
        columns["detail"] = pd.Series([e.detail for e in self._ledger], dtype=object)
        return pd.DataFrame(columns)

    def _amount_summary(self, amount: PrivacyCost) -> tuple[dict[str, str], dict[str, float]]:
        comps = _components(self._currency, amount)
        return {n: str(v) for n, v in comps.items()}, {n: float(v) for n, v in comps.items()}


# --------------------------------------------------------------------------------------------
# Accountant
# --------------------------------------------------------------------------------------------


class Accountant(_Ledgered):
    """A privacy budget in exact rationals with a ledger of charges.

    Build one with :meth:`pure`, :meth:`approx`, :meth:`zcdp` or :meth:`zcdp_from_approx`.
    Mechanisms call :meth:`charge` before drawing noise.

    Attributes
    ----------
    kind
        ``"pure"``, ``"approx"`` or ``"zcdp"``.
    total
        The budget, a :class:`PrivacyCost` in the currency.
    """

    def __init__(
        self,
        kind: Kind,
        total: PrivacyCost,
        *,
        report_delta: Fraction | None = None,
        requested: tuple[Fraction, Fraction] | None = None,
    ) -> None:
        # Internal: the classmethods validate user input; children of parallel blocks may
        # have a zero component (e.g. an approx child with delta 0).
        if kind not in ("pure", "approx", "zcdp"):
            raise PrivacyParameterError(f"kind must be 'pure', 'approx' or 'zcdp', got {kind!r}")
        self.kind = kind
        self._currency = kind
        self.total = _amount(kind, **_components(kind, total))
        self._spent = _amount(kind)
        self._ledger = []
        self._report_delta = report_delta
        self._requested = requested

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def pure(cls, epsilon: object) -> Accountant:
        """Pure ε-DP budget, ε > 0; sequential composition (ε adds)."""
        return cls("pure", _amount("pure", epsilon=validate_epsilon(epsilon, "epsilon")))

    @classmethod
    def approx(cls, epsilon: object, delta: object) -> Accountant:
        """(ε, δ)-DP budget, ε > 0, 0 < δ < 1; basic sequential composition (ε and δ add)."""
        eps = validate_epsilon(epsilon, "epsilon")
        dlt = validate_delta(delta, "delta")
        return cls("approx", _amount("approx", epsilon=eps, delta=dlt))

    @classmethod
    def zcdp(cls, rho: object) -> Accountant:
        """ρ-zCDP budget, ρ > 0; ρ adds over charges."""
        return cls("zcdp", _amount("zcdp", rho=validate_rho(rho, "rho")))

    @classmethod
    def zcdp_from_approx(cls, epsilon: object, delta: object) -> Accountant:
        """zCDP budget ρ = approx_dp_to_zcdp(ε, δ), so that the whole release is (ε, δ)-DP.

        The ledger frame and the summary report the (ε, δ)-DP guarantee of what has been spent
        (Canonne, Kamath, Steinke 2020, Cor. 13).
        """
        eps = validate_epsilon(epsilon, "epsilon")
        dlt = validate_delta(delta, "delta")
        rho = approx_dp_to_zcdp(eps, dlt)
        return cls("zcdp", _amount("zcdp", rho=rho), report_delta=dlt, requested=(eps, dlt))

    # -- budget ------------------------------------------------------------------------------

    @property
    def remaining(self) -> PrivacyCost:
        """total − spent, in the currency."""
        return _sub(self.kind, self.total, self._spent)

    def convert(self, cost: PrivacyCost) -> PrivacyCost:
        """``cost`` in this accountant's currency (PrivacyParameterError if it cannot be paid here)."""
        return _convert(self.kind, _check_cost(cost))

    def can_afford(self, cost: PrivacyCost) -> bool:
        """Whether ``cost`` fits the remaining budget (exact comparison)."""
        return _fits(self.kind, self.convert(cost), self.remaining)

    def charge(self, cost: PrivacyCost, label: str, *, detail: object = None) -> LedgerEntry:
        """Spend ``cost``; call it BEFORE drawing any noise.

        Parameters
        ----------
        cost
            The invocation's cost (see :class:`PrivacyCost`); converted to the currency.
        label
            Non-empty description for the ledger.
        detail
            Free-form information stored in the ledger entry.

        Returns
        -------
        LedgerEntry

        Raises
        ------
        BudgetExceededError
            When the converted cost exceeds the remaining budget; nothing is recorded.
        PrivacyParameterError
            When ``cost`` or ``label`` is malformed or the cost cannot be paid in this currency.
        """
        label = _check_label(label)
        converted = self.convert(cost)
        remaining = self.remaining
        if not _fits(self.kind, converted, remaining):
            raise BudgetExceededError(
                f"charge {label!r} asks {_describe(self.kind, converted)} but only "
                f"{_describe(self.kind, remaining)} remains (total {_describe(self.kind, self.total)})"
            )
        return self._record(label, converted, cost, detail)

    # -- composition helpers -----------------------------------------------------------------

    def split(
        self, shares: Mapping[str, object], *, of: Literal["remaining", "total"] = "remaining"
    ) -> dict[str, PrivacyCost]:
        """Exact proportional split of the remaining (or total) budget into named shares.

        Nothing is charged; each share is a :class:`PrivacyCost` in the currency to pass to
        :meth:`charge`. Share i gets w_i / Σ w · budget in every component, so the shares sum
        exactly to the budget.

        Parameters
        ----------
        shares
            Non-empty mapping name → positive weight (int, float-as-decimal, Fraction, str).
        of
            ``"remaining"`` (default) or ``"total"``.
        """
        if of not in ("remaining", "total"):
            raise PrivacyParameterError(f"of must be 'remaining' or 'total', got {of!r}")
        if not isinstance(shares, Mapping) or not shares:
            raise PrivacyParameterError(f"shares must be a non-empty mapping name -> weight, got {shares!r}")
        weights = {}
        for name, weight in shares.items():
            _check_label(name)
            weights[name] = validate_epsilon(weight, f"shares[{name!r}]")
        budget = _components(self.kind, self.remaining if of == "remaining" else self.total)
        if all(v == 0 for v in budget.values()):
            raise BudgetExceededError(f"nothing left to split: the {of} budget is zero")
        weight_sum = sum(weights.values())
        return {
            name: _amount(self.kind, **{n: v * w / weight_sum for n, v in budget.items()})
            for name, w in weights.items()
        }

    def parallel(self, label: str, cost: PrivacyCost, *, detail: object = None) -> ParallelBudget:
        """Parallel composition over disjoint parts of the data (McSherry 2009, Theorem 4).

        ``cost`` is charged ONCE to this accountant now (so before any draw); each
        ``ParallelBudget.part(name)`` is then a child accountant whose total is ``cost``.
        Mechanisms run on different parts together cost the maximum of their costs, which
        is at most ``cost``. The caller is responsible for the parts being disjoint (each
        record in at most one part, e.g. one county's records per part).

        Raises
        ------
        BudgetExceededError
            When ``cost`` does not fit the remaining budget.
        """
        entry = self.charge(cost, label, detail="parallel composition over disjoint parts" if detail is None else detail)
        return ParallelBudget(label, self.kind, entry.cost)

    def advanced_block(
        self, label: str, k: int, eps0: object, delta0: object, delta_prime: object
    ) -> AdvancedBlock:
        """k adaptive steps of at most (ε0, δ0) each, paid with advanced composition.

        Charges (ε, δ) = :func:`~dpopt.privacy.conversions.advanced_composition`
        (ε0, δ0, k, δ') to this (ε, δ) accountant up front and returns an
        :class:`AdvancedBlock` from which exactly k steps of at most (ε0, δ0) each may be
        charged (Dwork, Rothblum, Vadhan 2010, Theorem III.3). For small k basic composition
        is cheaper: compare with (kε0, kδ0) first.

        Raises
        ------
        PrivacyParameterError
            On a pure or zCDP accountant (the composed δ > 0 cannot be paid there; under
            zCDP charge pure steps directly, ρ = ε0²/2 each), or on bad parameters.
        BudgetExceededError
            When the composed cost does not fit.
        """
        label = _check_label(label)
        if self.kind != "approx":
            raise PrivacyParameterError(
                f"advanced_block needs an (epsilon, delta) accountant; this one is {self.kind!r}"
            )
        steps = validate_steps(k, "k")
        eps0_q = validate_epsilon(eps0, "eps0")
        delta0_q = validate_delta(delta0, "delta0", allow_zero=True)
        eps, dlt = advanced_composition(eps0_q, delta0_q, steps, delta_prime)
        detail = {
            "composition": "advanced (Dwork, Rothblum, Vadhan 2010)",
            "k": steps,
            "eps0": eps0_q,
            "delta0": delta0_q,
            "delta_prime": validate_delta(delta_prime, "delta_prime"),
        }
        entry = self.charge(PrivacyCost.approx(eps, dlt), label, detail=detail)
        return AdvancedBlock(label, steps, _amount("advanced", epsilon=eps0_q, delta=delta0_q), entry.cost)

    # -- reporting ---------------------------------------------------------------------------

    def summary(self) -> dict[str, object]:
        """Budget summary for reports (JSON-friendly).

        Keys: ``kind``, ``charges`` (count), ``total``/``spent``/``remaining`` (component →
        exact fraction string) and ``total_float``/``spent_float``/``remaining_float``. For
        :meth:`zcdp_from_approx` also ``declared`` ({epsilon, delta} as strings) and
        ``epsilon_at_delta`` ({total, spent} floats).
        """
        out: dict[str, object] = {"kind": self.kind, "charges": len(self._ledger)}
        for name, amount in (("total", self.total), ("spent", self._spent), ("remaining", self.remaining)):
            exact, approx = self._amount_summary(amount)
            out[name], out[f"{name}_float"] = exact, approx
        if self._report_delta is not None:
            eps, dlt = self._requested
            out["declared"] = {"epsilon": str(eps), "delta": str(dlt)}
            spent_rho = self._spent.rho
            out["epsilon_at_delta"] = {
                "total": zcdp_to_approx_dp(self.total.rho, dlt),
                "spent": zcdp_to_approx_dp(spent_rho, dlt) if spent_rho > 0 else 0.0,
            }
        return out

    def __repr__(self) -> str:
        return (
            f"Accountant({self.kind}, total: {_describe(self.kind, self.total)}, "
            f"spent: {_describe(self.kind, self._spent)}, charges: {len(self._ledger)})"
        )


# --------------------------------------------------------------------------------------------
# Parallel composition and advanced-composition blocks
# --------------------------------------------------------------------------------------------


class ParallelBudget:
    """Budget for mechanisms run on disjoint parts, already paid once in the parent.

    Obtain it from :meth:`Accountant.parallel`. ``part(name)`` returns the child accountant
    of that part (the same object for the same name), whose total is the reserved cost.
    """

    def __init__(self, label: str, kind: str, cost: PrivacyCost) -> None:
        self.label = label
        self.kind = kind
        self.cost = cost
        self._parts: dict[str, Accountant] = {}

    def part(self, name: str) -> Accountant:
        """Child accountant of the part ``name`` (created on first use)."""
        name = _check_label(name)
        if name not in self._parts:
            self._parts[name] = Accountant(self.kind, self.cost)
        return self._parts[name]

    @property
    def parts(self) -> dict[str, Accountant]:
        """The parts created so far (a copy)."""
        return dict(self._parts)

    @property
    def max_spent(self) -> PrivacyCost:
        """Componentwise maximum of the parts' spending: the actual parallel cost (<= cost)."""
        spent = [_components(self.kind, p.spent) for p in self._parts.values()]
        names = _COMPONENTS[self.kind]
        return _amount(self.kind, **{n: max((s[n] for s in spent), default=Fraction(0)) for n in names})

    def __repr__(self) -> str:
        return f"ParallelBudget({self.label!r}, cost: {_describe(self.kind, self.cost)}, parts: {len(self._parts)})"


class AdvancedBlock(_Ledgered):
    """k steps of at most (ε0, δ0) each, whose advanced composition is already paid.

    Obtain it from :meth:`Accountant.advanced_block`. Mechanisms charge it like an
    accountant (``block.charge(PrivacyCost.pure(eps0), label)``). A charge exceeding the
    per-step cap, or a (k+1)-th charge, raises :class:`~dpopt.errors.BudgetExceededError`.

    Attributes
    ----------
    total
        The composed (ε, δ) guarantee paid by the parent.
    step_cap
        (ε0, δ0), the largest cost of one step.
    steps_total
        k.

    ``spent`` is the basic sum of the steps' costs (the ledger sums to it exactly); it is a
    record, not the privacy loss, which is ``total`` by advanced composition.
    """

    kind = "advanced"

    def __init__(self, label: str, k: int, step_cap: PrivacyCost, total: PrivacyCost) -> None:
        self.label = label
        self.steps_total = k
        self.step_cap = step_cap
        self.total = total
        self._currency = "advanced"
        self._spent = _amount("advanced")
        self._ledger = []

    @property
    def steps_used(self) -> int:
        return len(self._ledger)

    @property
    def steps_remaining(self) -> int:
        return self.steps_total - len(self._ledger)

    def can_afford(self, cost: PrivacyCost) -> bool:
        """Whether a step remains and ``cost`` is within the per-step cap."""
        converted = _convert("advanced", _check_cost(cost))
        return self.steps_remaining > 0 and _fits("advanced", converted, self.step_cap)

    def charge(self, cost: PrivacyCost, label: str, *, detail: object = None) -> LedgerEntry:
        """Spend one step; call it BEFORE drawing noise. See :meth:`Accountant.charge`."""
        label = _check_label(label)
        converted = _convert("advanced", _check_cost(cost))
        if self.steps_remaining <= 0:
            raise BudgetExceededError(
                f"charge {label!r}: advanced-composition block {self.label!r} allows "
                f"{self.steps_total} steps and all are used"
            )
        if not _fits("advanced", converted, self.step_cap):
            raise BudgetExceededError(
                f"charge {label!r} asks {_describe('advanced', converted)} but block {self.label!r} "
                f"allows at most {_describe('advanced', self.step_cap)} per step"
            )
        return self._record(label, converted, cost, detail)

    def summary(self) -> dict[str, object]:
        """Keys: ``kind``, ``charges``, ``steps_total``, ``steps_remaining``, ``total``,
        ``step_cap``, ``spent`` (exact strings) and their ``*_float`` versions."""
        out: dict[str, object] = {
            "kind": self.kind,
            "charges": len(self._ledger),
            "steps_total": self.steps_total,
            "steps_remaining": self.steps_remaining,
        }
        for name, amount in (("total", self.total), ("step_cap", self.step_cap), ("spent", self._spent)):
            exact, approx = self._amount_summary(amount)
            out[name], out[f"{name}_float"] = exact, approx
        return out

    def __repr__(self) -> str:
        return (
            f"AdvancedBlock({self.label!r}, {self.steps_used}/{self.steps_total} steps of at most "
            f"{_describe('advanced', self.step_cap)}, guarantee {_describe('advanced', self.total)})"
        )
