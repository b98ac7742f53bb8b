"""The release's figures drawn in a forked child process, beside the release itself (issue #30).

Drawing the quickstart's three figures costs about 0.55 CPU-s of its ~2 s: 0.3 to import
matplotlib and 0.25 to draw. Neither depends on the release until the very end, so on a machine
with a second core they need not wait their turn: :meth:`PlotWorker.start` forks a child right
after the plan (before any data is read), the child imports matplotlib while the parent reads,
measures and solves, and :meth:`PlotWorker.submit` hands it the figures' inputs (plain arrays,
:func:`dpopt.plots.plot_inputs`) while the parent writes the tables. The child writes the PNGs
into the release's temporary directory (the same files as :func:`dpopt.plots.draw_plots` in
the parent, byte for byte) and answers with their names.

The child holds no confidential data the parent did not give it: it is forked before the data
is read and receives only what the figures show (noisy and released answers, public error
figures; the true answers only with ``evaluate``, which is never private).

Nothing is lost if the child cannot help: no ``fork`` (not Linux), a child that died, answered
with an error or took longer than :data:`TIMEOUT` -- the parent draws the figures itself, so
the release is the same. A parent that stops (error, signal) kills its child with SIGKILL; a
parent killed outright closes the child's pipe, and the child exits on end of file.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import warnings
from pathlib import Path

__all__ = ["PlotWorker", "AVAILABLE", "TIMEOUT"]

#: Forking is used where it is cheap and safe for this child (a copy-on-write process that only
#: imports matplotlib and draws): Linux. Elsewhere the figures are drawn in the parent.
AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "fork")
#: Seconds the parent waits for the child's answer before it draws the figures itself.
TIMEOUT = 300.0


class PlotWorker:
    """A forked child that imports matplotlib at once and draws one release's figures on request.

    Use :meth:`start` (None where forking is not available), then :meth:`submit` once and
    :meth:`result`; :meth:`close` always (it kills a child still running and reaps it).
    """

    def __init__(self, pid: int, jobs: int, answers: int) -> None:
        self.pid = pid
        self._jobs = jobs  # the parent's write end
        self._answers = answers  # the parent's read end
        self._submitted: tuple[list, Path] | None = None

    @classmethod
    def start(cls) -> "PlotWorker | None":
        """Fork the child; None where :data:`AVAILABLE` is False or the fork failed."""
        if not AVAILABLE:
            return None
        job_read, job_write = os.pipe()
        answer_read, answer_write = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python >= 3.12 warns that fork in a multi-threaded process may deadlock the
                # child (e.g. with OpenBLAS's idle threads); this child takes no lock another
                # thread holds: it imports matplotlib (the import lock is reset by fork) and draws.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            for fd in (job_read, job_write, answer_read, answer_write):
                os.close(fd)
            return None
        if pid == 0:  # the child: never returns
            os.close(job_write)
            os.close(answer_read)
            _child(job_read, answer_write)
        os.close(job_read)
        os.close(answer_write)
        return cls(pid, job_write, answer_read)

    def submit(self, inputs: list, directory: str | Path) -> None:
        """Ask the child to draw ``inputs`` (:func:`dpopt.plots.plot_inputs`) into ``directory``."""
        self._submitted = (inputs, Path(directory))
        job = pickle.dumps((inputs, str(directory)), protocol=pickle.HIGHEST_PROTOCOL)
        fd, self._jobs = self._jobs, -1
        try:
            # Length first: the child must not wait for end of file, which never comes while a
            # process forked later by this one (a worker pool) holds a copy of this pipe.
            with os.fdopen(fd, "wb") as fh:
                fh.write(len(job).to_bytes(8, "little") + job)
        except OSError:  # the child is gone: result() draws in the parent
            pass

    def result(self) -> dict[str, str]:
        """``{name: file name}`` of the figures drawn into the submitted directory.

        Drawn by the child, or by the parent (:func:`dpopt.plots.draw_plots`) when the child
        gave no answer within :data:`TIMEOUT` seconds, died or failed.
        """
        inputs, directory = self._submitted
        answer = self._read_answer()
        if isinstance(answer, dict):
            return answer
        from dpopt.plots import draw_plots

        return draw_plots(inputs, directory)

    def _read_answer(self):
        chunks = []
        end = time.monotonic() + TIMEOUT
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._answers], [], [], min(left, 0.1))
            if not ready:
                continue
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a child that died mid-answer: draw in the parent
            return None

    def close(self) -> None:
        """Kill the child if it still runs, reap it and close the pipes (idempotent)."""
        for fd in (self._jobs, self._answers):
            if fd >= 0:
                os.close(fd)
        self._jobs = self._answers = -1
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0


def _child(job_read: int, answer_write: int) -> None:
    """The forked child: import matplotlib, wait for one job, draw it, answer, exit."""
    status = 0
    try:
        # The parent's handlers turn signals into exceptions of the parent's run; here SIGINT
        # (a terminal's Ctrl-C reaches the whole group) is the parent's to handle, and it kills
        # this child; SIGTERM and SIGHUP end it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name in ("SIGTERM", "SIGHUP"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        from dpopt.plots import draw_plots, import_matplotlib

        import_matplotlib()
        with os.fdopen(job_read, "rb") as fh:
            size = fh.read(8)
            data = fh.read(int.from_bytes(size, "little")) if len(size) == 8 else b""
        if data:  # end of file without a job: the parent needs no figures
            inputs, directory = pickle.loads(data)
            try:
                answer = draw_plots(inputs, directory)
            except Exception as exc:  # noqa: BLE001 - the parent draws them itself and raises there
                answer = f"{type(exc).__name__}: {exc}"
            with os.fdopen(answer_write, "wb") as out:
                pickle.dump(answer, out, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - nothing of the parent's program may run in the child
        status = 1
    finally:
        os._exit(status)
