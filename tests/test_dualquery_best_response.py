"""The data player's integer program against exhaustive search over every record of tiny domains."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import InconsistentConstraintsError, SolverError
from dpopt.estimate.engines.best_response import RecordProgram, best_response, merge_sampled
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Hierarchy, StructuralZeros
from dpopt.model.domain import Domain
from dpopt.model.queries import Conjunctions


def domain():
    return Domain.from_dict({"a": 3, "b": 2, "c": 4, "d": 2, "e": 3})


def constraint_sets(dom):
    yield "none", ConstraintSet(dom)
    box = ConstraintSet(dom)
    box.add(StructuralZeros("a == 1 and c >= 2", name="box"))
    box.add(StructuralZeros("e == 2", name="one attribute"))
    yield "box and single attribute", box
    odd = ConstraintSet(dom)  # not a product: forces the grouped rows
    odd.add(StructuralZeros("(a == 0 and c == 1) or (a == 2 and c == 3) or (a == 2 and c == 0)", name="pairs"))
    odd.add(StructuralZeros("b == 1 and d == 1 and e != 0", name="three-way"))
    yield "grouped patterns", odd
    geo = ConstraintSet(dom)
    geo.add(Hierarchy("b", "c", {0: 0, 1: 0, 2: 1, 3: 1}))
    yield "hierarchy", geo


def exhaustive_best(dom, program, queries, mult):
    cells = dom.unravel(np.arange(dom.size))
    allowed = program.allows(cells)
    scores = np.array([mult[queries.satisfied(c)].sum() for c in cells])
    return scores[allowed].max(), allowed


@pytest.mark.parametrize("case", ["none", "box and single attribute", "grouped patterns", "hierarchy"])
def test_best_response_equals_exhaustive_search(case):
    dom = domain()
    cs = dict(constraint_sets(dom))[case]
    program = RecordProgram(dom, cs)
    pool = Conjunctions.random(dom, 3, 40, seed=11).with_negations()
    mixed = Conjunctions(dom, np.concatenate([pool.positions, [[1, -1, -1], [4, 0, -1]]]),
                         np.concatenate([pool.values, [[1, 0, 0], [0, 1, 0]]]),
                         np.concatenate([pool.negated, [False, True]]))
    gen = np.random.default_rng(3)  # which queries get sampled: test input
    for trial in range(12):
        rows = np.unique(gen.integers(0, mixed.num_rows, 30))
        mult = gen.integers(1, 4, rows.size)
        sampled = mixed.rows(rows)
        br = best_response(program, sampled, mult)
        best, allowed = exhaustive_best(dom, program, sampled, mult)
        assert br.status is Status.OPTIMAL and br.gap == 0
        assert br.score == best == br.bound
        assert program.allows(br.codes)[0]
        assert br.score == mult[sampled.satisfied(br.codes)].sum()
        assert not allowed.all() or case == "none"


def test_cbc_through_pulp_agrees_with_highs():
    dom = domain()
    cs = dict(constraint_sets(dom))["grouped patterns"]
    program = RecordProgram(dom, cs)
    pool = Conjunctions.random(dom, 2, 30, seed=2).with_negations()
    gen = np.random.default_rng(8)
    for trial in range(3):
        rows = np.unique(gen.integers(0, pool.num_rows, 20))
        sampled = pool.rows(rows)
        a = best_response(program, sampled, backend="highs")
        b = best_response(program, sampled, backend="pulp")
        # Both certify optimality of integral scores: equal optimal values, exactly.
        assert a.score == b.score and b.status is Status.OPTIMAL
        assert program.allows(b.codes)[0]


def test_the_structural_zero_rows_forbid_exactly_the_zero_cells():
    dom = domain()
    for _, cs in constraint_sets(dom):
        program = RecordProgram(dom, cs)
        cells = dom.unravel(np.arange(dom.size))
        mask = cs.zero_mask() if cs.zero_rules else np.zeros(dom.size, dtype=bool)
        assert np.array_equal(program.allows(cells), ~mask)
        # Every one-hot point satisfies the rows iff its record is allowed.
        z = np.zeros((dom.size, program.num_values))
        z[np.arange(dom.size)[:, None], program.offsets + cells] = 1
        A = program.base_A.toarray()
        feasible = ((A @ z.T >= program.base_lower[:, None] - 1e-9) & (A @ z.T <= program.base_upper[:, None] + 1e-9)
                    ).all(axis=0) & (z <= program.value_upper).all(axis=1)
        assert np.array_equal(feasible, ~mask)


def test_merging_positive_and_negated_copies():
    dom = domain()
    q = Conjunctions.from_literals(dom, [{"a": 1, "b": 0}, {"a": 1, "b": 0}, {"c": 2}], negated=[False, True, True])
    pos, val, weight, constant = merge_sampled(q, np.array([3, 5, 2]))
    got = {(tuple(p), tuple(v)): w for p, v, w in zip(pos, val, weight)}
    assert got == {((0, 1), (1, 0)): -2, ((2, -1), (2, 0)): -2}
    assert constant == 7


def test_no_allowed_record_is_an_error_naming_the_zeros():
    dom = Domain.from_dict({"a": 2, "b": 2})
    cs = ConstraintSet(dom)
    cs.add(StructuralZeros("a == 0", name="no a0"))
    cs.add(StructuralZeros("a == 1 and b == 0", name="x"))
    cs.add(StructuralZeros("a == 1 and b == 1", name="y"))
    with pytest.raises(InconsistentConstraintsError):
        RecordProgram(dom, cs).any_record()
    all_a = ConstraintSet(dom)
    all_a.add(StructuralZeros("a in [0, 1]", name="every a"))
    with pytest.raises(InconsistentConstraintsError, match="every value of 'a'"):
        RecordProgram(dom, all_a)


def test_a_backend_without_milp_is_refused():
    dom = domain()
    q = Conjunctions.random(dom, 2, 3, seed=0)
    with pytest.raises(SolverError, match="MILP backend"):
        best_response(RecordProgram(dom), q, backend="cvxpy")
