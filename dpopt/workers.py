"""Worker processes that do not outlive the process that started them; threads and BLAS's pools."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable

from threadpoolctl import ThreadpoolController

from dpopt.errors import ParameterError

__all__ = ["MAX_THREADS", "THREADS_VARIABLE", "blas_pools", "die_with_parent", "in_threads", "split_range",
           "worker_threads"]

#: The most threads :func:`worker_threads` gives by default.
MAX_THREADS = 8
#: The environment variable that sets dpopt's own threads (a positive integer; 1: the calling
#: thread only). BLAS's threads are set by its own variables (``OPENBLAS_NUM_THREADS``, ...).
THREADS_VARIABLE = "DPOPT_THREADS"


def worker_threads() -> int:
    """Threads for dpopt's own parallel loops: :data:`THREADS_VARIABLE` when set, else the cores
    this process may run on, at most :data:`MAX_THREADS`."""
    value = os.environ.get(THREADS_VARIABLE)
    if value is not None and value.strip():
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ParameterError(f"{THREADS_VARIABLE} must be a positive integer, got {value!r}")
        return threads
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_THREADS, available))


@functools.lru_cache(maxsize=None)
def blas_pools() -> ThreadpoolController:
    """The process's thread pools, found once (numpy and scipy have loaded BLAS by the first call):
    threadpoolctl's scan of the loaded libraries costs about 4 ms of CPU, which ``threadpool_limits``
    pays again on every call. ``blas_pools().limit(limits=1, user_api="blas")`` holds BLAS to one
    thread where dpopt runs its own."""
    return ThreadpoolController()


def die_with_parent() -> None:
    """In a worker process (a pool's initialiser): on Linux, ask for SIGTERM when the process that
    started it dies (``PR_SET_PDEATHSIG``), so that a run killed with SIGKILL, which runs no
    clean-up, leaves no orphaned workers computing on. Elsewhere, nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl: nothing to arm
        pass


def in_threads(work: Callable[[int], object], count: int) -> list:
    """``[work(0), ..., work(count - 1)]``: the first on the calling thread, the others on threads
    started here and joined before returning (none outlives a call: the audit forks, and threads do
    not survive a fork), with BLAS held to one thread meanwhile (:func:`blas_pools`: its own
    threads on top of these slowed dpopt's maps). numpy releases the GIL in its array loops, so
    pieces of array work run at once. An error in any piece is raised here, after all have ended."""
    if count <= 1:
        return [work(0)] if count == 1 else []
    results: list = [None] * count
    errors: list[Exception] = []

    def run(t: int) -> None:
        try:
            results[t] = work(t)
        except Exception as exc:  # raised again on the calling thread
            errors.append(exc)

    helpers = [threading.Thread(target=run, args=(t,), name=f"dpopt-worker-{t}", daemon=True) for t in range(1, count)]
    with blas_pools().limit(limits=1, user_api="blas"):
        for helper in helpers:
            helper.start()
        run(0)
        for helper in helpers:
            helper.join()
    if errors:
        raise errors[0]
    return results


def split_range(size: int, parts: int) -> list[tuple[int, int]]:
    """``[0, size)`` in ``parts`` contiguous ranges of about equal length (the first ones longer)."""
    parts = max(1, min(int(parts), int(size))) if size > 0 else 1
    base, extra = divmod(int(size), parts)
    bounds = [0]
    for t in range(parts):
        bounds.append(bounds[-1] + base + (t < extra))
    return list(zip(bounds[:-1], bounds[1:]))
