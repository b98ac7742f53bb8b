"""Shared fixtures. Tests that read the benchmark data skip with a reason when it is absent."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

# One BLAS thread per process, set before numpy loads (OpenBLAS reads it then; a value already in
# the environment wins). The suite runs one xdist worker per core (-n 2 on 2 cores): BLAS threads
# on top oversubscribe the cores and spin while they wait. The 27-attribute auto test took 87 CPU s
# with OpenBLAS's default threads and 12 s with one (2026-11-28). Subprocesses inherit the setting.
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

import numpy as np
import pandas as pd
import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(name: str) -> Path:
    """Path of a file in ../shared/data, or skip the test naming what is missing."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"benchmark data {path} is absent (expected ../shared/data beside the repo)")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    """Seeded generator for building test *inputs* (never privacy noise)."""
    return np.random.default_rng(20261122)


@pytest.fixture
def small_domain():
    from dpopt.model.domain import Domain

    return Domain.from_dict({"sex": ["F", "M"], "age": ["0-14", "15-64", "65+"], "region": 4})


@pytest.fixture
def small_frame(small_domain, rng) -> pd.DataFrame:
    n = 500
    return pd.DataFrame(
        {
            "sex": rng.choice(["F", "M"], n),
            "age": rng.choice(["0-14", "15-64", "65+"], n),
            "region": rng.integers(0, 4, n),
        }
    )


@pytest.fixture
def sigterm_in_one_second():
    """``start()`` sends SIGTERM to this process one second later; ``sent`` holds when it went
    (``time.perf_counter``). For the tests that a long solve stops within 2 s of a signal."""
    sent: list[float] = []

    def kill():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(1.0, kill)
    yield SimpleNamespace(start=timer.start, sent=sent)
    timer.cancel()
