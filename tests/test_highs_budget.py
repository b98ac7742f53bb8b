"""HiGHS's MIP budget (``work_limit``, ``cpu_limit``; issue 30 item 4) and its signal check (issue 24)
share one interrupt callback: each still does its job when the other is set."""
import time

import numpy as np
import pytest
import scipy.sparse as sp

from dpopt.atomic import Interrupted, handle_signals, signal_pending
from dpopt.estimate.backends import get_backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import Status


def hard_knapsacks(n: int = 150) -> ProgramForm:
    """A 0/1 program with many overlapping knapsack rows: seconds to prove optimal at gap 0."""
    rng = np.random.default_rng(1)  # test input only
    A = sp.csr_matrix((rng.random((n, n)) < 0.3).astype(float))
    return ProgramForm(c=-rng.random(n), A=A, row_lower=np.full(n, -np.inf), row_upper=A.sum(axis=1).A1 / 2.3,
                       row_names=[f"r[{i}]" for i in range(n)], lower=np.zeros(n), upper=np.ones(n),
                       integrality=np.ones(n, bool))


def feasible(form: ProgramForm, x: np.ndarray) -> bool:
    return bool((form.A @ x <= form.row_upper + 1e-9).all() and np.array_equal(x, np.round(x)))


def test_a_work_limit_stops_at_the_same_point_every_time_with_its_incumbent():
    form = hard_knapsacks()
    runs = [get_backend("highs").solve(form, mip_gap=0.0, conflicts=False, work_limit=5, cpu_limit=60.0)
            for _ in range(2)]
    for out in runs:
        assert out.status is Status.ITERATION_LIMIT and out.extra["work"] == 5
        assert out.x is not None and feasible(form, out.x)
    assert np.array_equal(runs[0].x, runs[1].x)


def test_a_cpu_limit_stops_a_long_solve():
    form = hard_knapsacks()
    began = time.process_time()
    out = get_backend("highs").solve(form, mip_gap=0.0, conflicts=False, work_limit=10**9, cpu_limit=0.3)
    assert out.status is Status.TIME_LIMIT and out.extra["cpu_time"] >= 0.3
    assert time.process_time() - began < 5.0
    assert out.x is None or feasible(form, out.x)


def test_a_signal_still_stops_a_budgeted_solve_at_once(sigterm_in_one_second):
    """The budget's callback does not replace the signal check (t24a's): SIGTERM wins over the
    budget's status and is raised as Interrupted within the issue's 2 s."""
    form = hard_knapsacks()
    with pytest.raises(Interrupted):
        with handle_signals():
            sigterm_in_one_second.start()
            get_backend("highs").solve(form, time_limit=60, mip_gap=0.0, conflicts=False, work_limit=10**9,
                                       cpu_limit=60.0)
    assert time.perf_counter() - sigterm_in_one_second.sent[0] < 2.0
    assert not signal_pending()
