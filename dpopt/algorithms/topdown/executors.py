"""Where the parents' problems run: in this process, in a local process pool, or on Spark.

Every executor maps :func:`~dpopt.algorithms.topdown.solve.solve_parent` over a list of
:class:`~dpopt.algorithms.topdown.solve.ParentTask` and returns the solutions in task order.
The tasks carry the noise already drawn on the driver, and each solve is deterministic, so
the release does not depend on the executor (nor does its privacy: no worker draws noise).

* :class:`SerialExecutor` — one after the other (small releases, debugging);
* :class:`PoolExecutor` — a local ``concurrent.futures`` process pool (the default on one
  machine), fed largest problems first so that one big parent does not finish last;
* :class:`SparkExecutor` — ``SparkContext.parallelize(tasks).map(solve_parent)`` on a Spark
  master: ``local[*]`` on one machine, ``spark://host:7077`` (or ``yarn``, ``k8s://...``) for a
  cluster; dpopt is shipped to the executors as a zip unless ``ship=False`` (when it is
  installed there).
"""

from __future__ import annotations

import abc
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from dpopt.errors import ParameterError, at_key
from dpopt.workers import die_with_parent

__all__ = ["Executor", "SerialExecutor", "PoolExecutor", "SparkExecutor", "make_executor", "spark_session", "EXECUTORS"]

#: Executor names a spec (``[topdown] executor``) may give.
EXECUTORS = ("serial", "pool", "spark")
#: Bytes of task data sent to Spark in one ``parallelize`` (see :meth:`SparkExecutor.map`).
SPARK_BATCH_BYTES = 64 * 2**20
#: The driver JVM's heap on a ``local`` master unless ``conf`` names one (Spark's default is 1g;
#: in local mode the executors share it, and the tasks pass through it).
LOCAL_DRIVER_MEMORY = "4g"
#: pyspark is an optional dependency (the ``spark`` extra): the error when Spark is asked for without it.
SPARK_MISSING = ("executor 'spark' needs pyspark, which is not installed: pip install \"dpopt[spark]\" "
                 "(and Java 17 or later)")


class Executor(abc.ABC):
    """Maps a picklable function over tasks; results in task order."""

    name: str = "executor"

    @abc.abstractmethod
    def map(self, fn: Callable, tasks: Sequence, *, sizes: Sequence[int] | None = None, progress=None) -> list:
        """``[fn(t) for t in tasks]``; ``sizes`` (work per task) lets the executor start big ones first;
        ``progress`` (a tqdm bar) is advanced as tasks finish."""

    def close(self) -> None:
        """Release the workers."""

    def describe(self) -> str:
        return self.name

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SerialExecutor(Executor):
    """Every task in this process, in order."""

    name = "serial"

    def map(self, fn, tasks, *, sizes=None, progress=None):
        out = []
        for t in tasks:
            out.append(fn(t))
            if progress is not None:
                progress.update(1)
        return out


class PoolExecutor(Executor):
    """A local process pool (the platform's default start method: ``fork`` on Linux, so a script
    needs no ``if __name__ == "__main__"`` guard there).

    Parameters
    ----------
    workers : int, optional
        Processes (default: the machine's cores).
    """

    name = "pool"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ParameterError(f"workers must be an integer >= 1, got {workers!r}")
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def _get(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(),
                                             initializer=_single_threaded)
        return self._pool

    def map(self, fn, tasks, *, sizes=None, progress=None):
        tasks = list(tasks)
        if not tasks:
            return []
        order = _largest_first(sizes, len(tasks))
        pool = self._get()
        futures = {pool.submit(fn, tasks[i]): i for i in order}
        out: list = [None] * len(tasks)
        from concurrent.futures import as_completed

        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            if progress is not None:
                progress.update(1)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def describe(self) -> str:
        return f"pool ({self.workers} processes)"


class SparkExecutor(Executor):
    """Spark: one task per parent, shipped to the executors and collected on the driver.

    Parameters
    ----------
    master : str
        A Spark master URL: ``"local[*]"``, ``"local[2]"``, ``"spark://host:7077"``, ...
        Ignored when ``context`` is given.
    context : pyspark.SparkContext, optional
        An existing context (e.g. of a notebook); it is not stopped by :meth:`close`.
    ship : bool, optional
        Add dpopt as a zip to the context's Python path (default: True except on ``local``
        masters, whose workers import the driver's dpopt).
    conf : dict, optional
        More Spark settings (``{"spark.executor.memory": "8g"}``).
    """

    name = "spark"

    def __init__(self, master: str = "local[*]", *, context=None, ship: bool | None = None,
                 conf: dict | None = None) -> None:
        if context is None and (not isinstance(master, str) or not master):
            raise ParameterError(f"spark master must be a URL such as 'local[*]' or 'spark://host:7077', got {master!r}")
        if context is None and importlib.util.find_spec("pyspark") is None:  # found, not imported (0.5 s)
            raise at_key(ParameterError(SPARK_MISSING), ("topdown", "executor"))  # the spec key that asks for it
        self.master = master
        self._context = context
        self._owned = context is None
        self._ship = ship
        self._conf = dict(conf or {})
        self._zip: str | None = None

    @property
    def context(self):
        if self._context is None:
            self._context = spark_session(self.master, self._conf).sparkContext
        if self._zip is None and (self._ship if self._ship is not None else not self.master.startswith("local")):
            self._zip = _zip_dpopt()
            self._context.addPyFile(self._zip)
        return self._context

    def map(self, fn, tasks, *, sizes=None, progress=None):
        """Largest problems first, in batches of at most :data:`SPARK_BATCH_BYTES` of task data (a
        task's ``nbytes``, else one byte per unit of ``sizes``): ``parallelize`` and the tasks it
        ships live in the driver JVM's heap (all 3,200 national tract problems at once ran it out of
        memory), and two batches run at a time (two Spark jobs from two driver threads) so that one
        batch's slowest problems do not leave cores idle."""
        from concurrent.futures import ThreadPoolExecutor

        tasks = list(tasks)
        if not tasks:
            return []
        sc = self.context
        order = _largest_first(sizes, len(tasks))
        weights = [int(getattr(tasks[i], "nbytes", sizes[i] if sizes is not None else 1)) for i in order]
        batches, current, load = [], [], 0
        for i, weight in zip(order, weights):
            if current and load + weight > SPARK_BATCH_BYTES:
                batches.append(current)
                current, load = [], 0
            current.append(i)
            load += weight
        batches.append(current)
        parallelism = max(1, sc.defaultParallelism)

        def run(batch):
            indexed = [(i, tasks[i]) for i in batch]
            pairs = sc.parallelize(indexed, min(len(batch), parallelism * 8)).map(
                lambda item: (item[0], fn(item[1]))).collect()
            if progress is not None:
                progress.update(len(batch))
            return pairs

        out: list = [None] * len(tasks)
        with ThreadPoolExecutor(max_workers=min(2, len(batches))) as threads:
            for pairs in threads.map(run, batches):
                for i, result in pairs:
                    out[i] = result
        return out

    def close(self) -> None:
        if self._owned and self._context is not None:
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()
            else:
                self._context.stop()
            self._context = None
        if self._zip is not None and os.path.exists(self._zip):
            os.unlink(self._zip)
            self._zip = None

    def describe(self) -> str:
        return f"spark ({self.master if self._owned else 'given context'})"


def spark_session(master: str = "local[*]", conf: dict | None = None):
    """A SparkSession whose Python workers run this interpreter and import this dpopt.

    ``conf`` adds Spark settings (e.g. ``{"spark.executor.memory": "8g"}``).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ParameterError(SPARK_MISSING) from None
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    # Local workers start the interpreter PYSPARK_PYTHON names (else "python3" on the PATH, which
    # may lack this environment's packages); read when the context starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName("dpopt-topdown")
               .config("spark.pyspark.python", sys.executable).config("spark.pyspark.driver.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", path).config("spark.executorEnv.OPENBLAS_NUM_THREADS", "1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    if master.startswith("local") and "spark.driver.memory" not in (conf or {}):
        builder = builder.config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def make_executor(name: str | Executor = "pool", *, workers: int | None = None, spark: str = "local[*]") -> Executor:
    """An executor by name (``"serial"``, ``"pool"``, ``"spark"``), or the one given."""
    if isinstance(name, Executor):
        return name
    if name == "serial":
        return SerialExecutor()
    if name == "pool":
        return PoolExecutor(workers)
    if name == "spark":
        return SparkExecutor(spark if workers is None or spark != "local[*]" else f"local[{workers}]")
    raise ParameterError(f"executor must be one of {list(EXECUTORS)}, got {name!r}")


def _largest_first(sizes, n: int) -> list[int]:
    if sizes is None:
        return list(range(n))
    return sorted(range(n), key=lambda i: -sizes[i])


def _single_threaded() -> None:
    """Worker initialiser: one BLAS/OpenMP thread per process (the pool already uses every core); and
    on Linux, SIGTERM when the process that started the worker dies, so that a release killed with
    SIGKILL (which runs no clean-up) leaves no orphaned workers solving on.

    Two limits, for the two ways a worker gets BLAS: under ``fork`` it inherits BLAS already loaded
    and sized by the parent, which only threadpoolctl can limit (the variables would change
    nothing); under ``spawn`` or ``forkserver`` BLAS may load after this runs, sized by the
    variables. Each parent solve also takes its own threadpoolctl limit
    (:func:`~dpopt.algorithms.topdown.solve.solve_parent`). Neither is restored: they last the
    worker's life.
    """
    from threadpoolctl import threadpool_limits

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    threadpool_limits(limits=1)
    die_with_parent()


def _zip_dpopt() -> str:
    """dpopt's sources as a zip for ``SparkContext.addPyFile`` (cluster executors import it)."""
    import dpopt

    package = Path(dpopt.__file__).resolve().parent
    fd, name = tempfile.mkstemp(prefix="dpopt-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in package.rglob("*.py"):
            zf.write(path, path.relative_to(package.parent))
    return name
