"""Worker processes that do not outlive the process that started them."""

from __future__ import annotations

import sys

__all__ = ["die_with_parent"]


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
