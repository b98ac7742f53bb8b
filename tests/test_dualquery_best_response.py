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


# ---- issue 30: warm starts and a work budget that does not depend on the machine's load ---------
def _sample(dom, seed, count=40):
    pool = Conjunctions.random(dom, 3, 60, seed=seed).with_negations()
    gen = np.random.default_rng(seed)  # which queries get sampled: test input
    rows = np.unique(gen.integers(0, pool.num_rows, count))
    return pool.rows(rows), gen.integers(1, 4, rows.size)


def _score(queries, mult, record) -> float:
    return float(mult[queries.satisfied(record)].sum())


@pytest.mark.parametrize("case", ["none", "grouped patterns"])
def test_improve_record_reaches_a_local_optimum_against_every_single_change(case):
    from dpopt.estimate.engines.best_response import improve_record

    dom = domain()
    program = RecordProgram(dom, dict(constraint_sets(dom))[case])
    for seed in range(6):
        queries, mult = _sample(dom, seed)
        pos, val, weight, _ = merge_sampled(queries, mult)
        start = np.zeros(len(dom), dtype=np.int64)
        record = improve_record(program.sizes, pos, val, weight, start)
        assert _score(queries, mult, record) >= _score(queries, mult, start)
        for a, size in enumerate(dom.sizes):  # no attribute alone can do better
            for v in range(size):
                moved = record.copy()
                moved[a] = v
                assert _score(queries, mult, moved) <= _score(queries, mult, record)


def test_a_warm_start_is_never_lost_and_the_work_limit_is_deterministic():
    dom = domain()
    program = RecordProgram(dom, dict(constraint_sets(dom))["box and single attribute"])
    queries, mult = _sample(dom, 5, count=60)
    earlier = dom.unravel(np.arange(0, dom.size, 37))
    earlier = earlier[program.allows(earlier)]
    best_earlier = max(_score(queries, mult, r) for r in earlier)
    for backend in ("highs", "pulp"):
        br = best_response(program, queries, mult, backend=backend, start=earlier,
                           work_limit=1 if backend == "highs" else None)
        assert br.found and program.allows(br.codes)[0]
        assert br.score >= max(best_earlier, br.info["start_score"]) and br.score == _score(queries, mult, br.codes)
        assert br.status in (Status.OPTIMAL, Status.ITERATION_LIMIT)
    runs = [best_response(program, queries, mult, start=earlier, work_limit=2, options={"presolve": False})
            for _ in range(3)]
    assert all(np.array_equal(r.codes, runs[0].codes) and r.info["work"] == runs[0].info["work"] for r in runs)
    assert runs[0].info["work"] <= 2 or runs[0].status is Status.OPTIMAL
    best, _ = exhaustive_best(dom, program, queries, mult)
    assert best_response(program, queries, mult, start=earlier, work_limit=1000).score == best


def test_bad_budgets_and_starts_are_named_errors():
    from dpopt.estimate.backends import get_backend

    dom = domain()
    program = RecordProgram(dom)
    queries, mult = _sample(dom, 1)
    with pytest.raises(SolverError, match="work_limit"):
        best_response(program, queries, mult, work_limit=0)
    with pytest.raises(SolverError, match="cpu_limit"):
        best_response(program, queries, mult, options={"cpu_limit": -1})
    with pytest.raises(SolverError, match="mip_start has 3 values"):
        get_backend("highs").solve(program.form(np.zeros(program.num_values)), mip_start=np.zeros(3))
    with pytest.raises(Exception, match="codes"):
        best_response(program, queries, mult, start=np.zeros((1, 2), dtype=np.int64))
