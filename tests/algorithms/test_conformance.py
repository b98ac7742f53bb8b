"""Conformance of every registered algorithm to the Algorithm interface.

Parametrised over :data:`dpopt.algorithms.REGISTRY`, so an algorithm registered later is
checked by these same tests, unchanged. Each algorithm runs its own ``example`` parameters
on a tiny binary domain: the ledger sums exactly to the budget under every accounting it
supports, a seeded run is reproducible, an over-budget run raises before any random draw,
the result is a :class:`Release` with a :class:`Status`, and every constraint kind it claims
to keep (structural zeros, invariants, non-negativity, integrality) holds exactly in the
released table. A last test checks the layering: ``dpopt.estimate`` never imports the
private side (``dpopt.privacy``, ``dpopt.model.data``).
"""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms import REGISTRY, Release
from dpopt.errors import BudgetExceededError
from dpopt.estimate.status import Status
from dpopt.model.constraints import (
    ConstraintSet,
    Integrality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom

REPO = Path(__file__).resolve().parents[2]
BUDGETS = {"pure": Budget.pure(1), "approx": Budget.approx(1, Fraction(1, 10**6)), "zcdp": Budget.zcdp(Fraction(1, 2))}
ZERO_RULE = "a0 == 1 and a1 == 1"


class CountingRandom(SeededRandom):
    """A seeded source that counts the words drawn from it."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.drawn = 0

    def words(self, n: int) -> np.ndarray:
        self.drawn += int(n)
        return super().words(n)


def tiny_case(n: int = 400, seed: int = 5):
    """A 4-bit domain and records that avoid the cells ``ZERO_RULE`` forbids."""
    domain = Domain.from_dict({f"a{i}": 2 for i in range(4)})
    gen = np.random.default_rng(seed)  # test input, not privacy noise
    frame = pd.DataFrame(gen.integers(0, 2, size=(n, 4)), columns=domain.attrs)
    frame = frame[~((frame.a0 == 1) & (frame.a1 == 1))].reset_index(drop=True)
    return domain, Dataset.from_frame(frame, domain)


def algorithm_cases():
    domain, _ = tiny_case()
    for name, cls in REGISTRY.items():
        params = cls.example(domain)
        if params is None:
            yield pytest.param(name, None, marks=pytest.mark.skip(reason=f"{name} has no example on a binary domain"))
        else:
            yield pytest.param(name, params, id=name)


def run_once(name, params, budget, constraints=None, seed=1, accountant=None, rng=None):
    domain, data = tiny_case()
    cls = REGISTRY[name]
    algorithm = cls(params)
    constraints = constraints if constraints is not None else ConstraintSet(domain)
    plan = algorithm.plan(domain, constraints, budget)
    accountant = accountant if accountant is not None else budget.accountant()
    return algorithm, plan, algorithm.run(plan, data, accountant, rng or SeededRandom(seed))


def released_values(release: Release) -> list:
    out = []
    if release.counts is not None:
        out.append(np.asarray(release.counts))
    for label in sorted(release.answers):
        out.append(release.answers[label].to_numpy())
    if release.records is not None:
        out.append(release.records.to_numpy())
    return out


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_ledger_sums_exactly_to_the_budget_under_every_accounting(name, params):
    for accounting in REGISTRY[name].accountings:
        budget = BUDGETS[accounting]
        _, plan, release = run_once(name, params, budget)
        ledger = release.accountant.ledger_frame()
        for component, value in (("epsilon", budget.epsilon), ("delta", budget.delta), ("rho", budget.rho)):
            if component in ledger.columns and accounting != "zcdp" or component == "rho" and accounting == "zcdp":
                assert sum(ledger[component], Fraction(0)) == value, (name, accounting, component)
        planned = sum((s.share for s in plan.steps), Fraction(0))
        assert planned == 1, f"{name}: the plan's steps share {planned} of the budget, not all of it"


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_a_seeded_run_is_reproducible(name, params):
    budget = BUDGETS[REGISTRY[name].accountings[0]]
    first = released_values(run_once(name, params, budget, seed=11)[2])
    again = released_values(run_once(name, params, budget, seed=11)[2])
    assert first and len(first) == len(again)
    for a, b in zip(first, again):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_an_over_budget_run_raises_before_any_random_draw(name, params):
    accounting = REGISTRY[name].accountings[0]
    budget = BUDGETS[accounting]
    smaller = {"pure": Budget.pure(Fraction(1, 2)), "approx": Budget.approx(Fraction(1, 2), Fraction(1, 10**7)),
               "zcdp": Budget.zcdp(Fraction(1, 4))}[accounting]
    source = CountingRandom(3)
    with pytest.raises(BudgetExceededError):
        run_once(name, params, budget, accountant=smaller.accountant(), rng=source)
    assert source.drawn == 0


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_every_algorithm_returns_a_release_with_a_status(name, params):
    _, _, release = run_once(name, params, BUDGETS[REGISTRY[name].accountings[0]])
    assert isinstance(release, Release) and isinstance(release.status, Status)
    assert release.success == release.status.releasable and release.success
    assert release.algorithm == name and release.reference == REGISTRY[name].reference
    assert release.counts is not None or release.answers or release.records is not None


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_declared_zeros_and_invariants_hold_exactly(name, params):
    cls = REGISTRY[name]
    domain, data = tiny_case()
    kinds = [k for k in ("structural_zeros", "invariants", "nonnegative", "integer") if k in cls.supports]
    if not {"structural_zeros", "invariants"} & set(kinds):
        pytest.skip(f"{name} keeps neither structural zeros nor invariants")
    for integer in (False, True) if "integer" in kinds else (False,):
        cs = ConstraintSet(domain)
        if "nonnegative" in kinds:
            cs.add(NonNegativity())
        if integer:
            cs.add(Integrality())
        if "structural_zeros" in kinds:
            cs.add(StructuralZeros(ZERO_RULE, name="no a0 and a1 together"))
        if "invariants" in kinds:
            cs.invariant_from_data(Marginal(domain, ("a2",)), data, "a2 published")
        _, _, release = run_once(name, params, BUDGETS[cls.accountings[0]], constraints=cs)
        assert release.success and release.counts is not None, f"{name} released no table to check"
        x = np.asarray(release.counts, dtype=np.float64)
        if "structural_zeros" in kinds:
            assert np.all(x[cs.zero_mask()] == 0)
        if "invariants" in kinds:
            (inv,) = cs.invariants
            tol = 0 if integer else 1e-6 * (1 + np.abs(inv.values).max())
            assert np.abs(inv.query.matvec(x) - inv.values).max() <= tol, (name, integer)
        if "nonnegative" in kinds:
            assert (x >= 0).all()
        if integer:
            assert np.array_equal(x, np.round(x)) and np.asarray(release.counts).dtype.kind in "iu"


@pytest.mark.parametrize("name, params", list(algorithm_cases()))
def test_the_plan_refuses_what_the_algorithm_cannot_keep(name, params):
    cls = REGISTRY[name]
    domain, _ = tiny_case()
    from dpopt.errors import ParameterError
    from dpopt.model.constraints import LinearInequality
    from dpopt.model.queries.basic import Total

    unsupported = [a for a in ("pure", "approx", "zcdp") if a not in cls.accountings]
    for accounting in unsupported:
        with pytest.raises(ParameterError, match="accounting"):
            cls(params).plan(domain, ConstraintSet(domain), BUDGETS[accounting])
    if "inequalities" not in cls.supports:
        cs = ConstraintSet(domain, [LinearInequality(Total(domain), 0.0, 1e9, name="cap")])
        with pytest.raises(ParameterError, match="inequalities"):
            cls(params).plan(domain, cs, BUDGETS[cls.accountings[0]])


def test_estimate_never_imports_the_private_side():
    """Post-processing sees neither data nor randomness: no import of dpopt.privacy or dpopt.model.data."""
    offenders = []
    for path in sorted((REPO / "dpopt" / "estimate").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("dpopt.privacy") or name.startswith("dpopt.model.data"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_the_registry_holds_the_landed_algorithms():
    assert {"measure_reconstruct", "barak", "mwem", "mwem_factored"} <= set(REGISTRY)
