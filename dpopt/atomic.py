"""Output directories that never destroy what dpopt did not write.

A release directory appears complete or not at all, and dpopt only ever replaces a directory
it wrote itself:

* Everything is written into a temporary sibling of the target (same parent, hence the same
  file system), which is renamed into place with :func:`os.replace` (atomic on POSIX).
* Every release directory carries a manifest, :data:`MANIFEST_NAME`, listing each file dpopt
  wrote with its size and SHA-256. ``overwrite=True`` replaces a directory only when it holds
  such a manifest, every file it lists is unchanged, and nothing else is there; otherwise the
  error names the foreign or changed files and nothing is touched.
* The target may never be the working directory, the spec's or the data's directory, or an
  ancestor of one of them (:func:`check_output_dir`'s ``protected``).
* SIGTERM, SIGHUP and SIGINT while the temporary directory exists remove it (the signals
  raise :class:`Interrupted`, and the cleanup and the final renames run with those signals
  blocked, so a second signal cannot cut them short). A run killed outright (SIGKILL, power
  loss) leaves its temporary directory behind; the next write to the same target removes it,
  and restores the previous release if the kill fell between the two renames that swap it.

Temporary names are ``.NAME.tmp-PID-XXXX`` (the new release) and ``.NAME.old-PID-XXXX`` (the
previous one while it is being swapped out). A stale one is only removed when its process
``PID`` is no longer running, so two runs never remove each other's work.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from dpopt.errors import DpoptError

__all__ = [
    "MANIFEST_NAME", "OutputExistsError", "Interrupted", "check_output_dir", "atomic_directory",
    "read_manifest", "clean_stale_temporaries", "handle_signals", "HANDLED_SIGNALS", "deferred_signals",
    "signal_pending", "run_interruptibly",
]

#: The manifest dpopt writes into every release directory (and reads before overwriting one).
MANIFEST_NAME = "dpopt-manifest.json"
#: Marks a temporary directory as dpopt's, with the PID of the process that owns it.
_OWNER_NAME = ".dpopt-owner"
_MANIFEST_FORMAT = "dpopt release manifest 1"
#: Signals that remove the temporary directory and stop the run with a one-line message.
HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


class OutputExistsError(DpoptError, FileExistsError):
    """The output directory cannot receive the release (it holds other files, or is protected)."""


class Interrupted(KeyboardInterrupt):
    """A handled signal (SIGTERM, SIGHUP, SIGINT) stopped the run.

    Attributes
    ----------
    signum : int
    written : Path or None
        The release directory, when the signal arrived after it was complete and in place.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.written: Path | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


# ---- checks --------------------------------------------------------------------------------------
def check_output_dir(
    target: str | os.PathLike,
    *,
    overwrite: bool = False,
    key: str = "--out",
    protected: Mapping[str, str | os.PathLike | None] | None = None,
) -> Path:
    """Raise :class:`OutputExistsError` unless ``target`` may receive a release.

    Parameters
    ----------
    target
        The output directory.
    overwrite
        Allow replacing a directory that holds a previous dpopt release (its manifest's files,
        unchanged) and nothing else.
    key
        The option or spec key that named the directory (for the error message).
    protected
        Directories the target may neither be nor contain, by what they are (``{"the working
        directory": Path.cwd(), "the data's directory": ...}``); None entries are skipped.

    Returns
    -------
    Path
    """
    path = Path(target)
    resolved = path.expanduser().resolve()
    for what, directory in (protected or {}).items():
        if directory is None:
            continue
        guarded = Path(directory).expanduser().resolve()
        if resolved == guarded or resolved in guarded.parents:
            relation = "is" if resolved == guarded else "is an ancestor of"
            raise OutputExistsError(
                f"{key}: {str(path)!r} {relation} {what} ({str(guarded)!r}); a release needs a directory "
                f"of its own, e.g. {str(path / 'release')!r}")
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{key}: {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"{key}: directory {str(path)!r} already holds files; choose another directory "
                "or pass --overwrite (overwrite=True) to replace a previous dpopt release there")
        _check_replaceable(path, key)
    return path


def _check_replaceable(path: Path, key: str) -> None:
    """Refuse to replace ``path`` unless it holds exactly the unchanged files of its manifest."""
    manifest = read_manifest(path)
    present = _files_under(path)
    if manifest is None:
        raise OutputExistsError(
            f"{key}: will not replace {str(path)!r}: it holds files dpopt did not write (no {MANIFEST_NAME}): "
            f"{_names(present)}; dpopt only replaces a directory holding a previous release and nothing else")
    listed = manifest["files"]
    foreign = sorted(set(present) - set(listed) - {MANIFEST_NAME})
    if foreign:
        raise OutputExistsError(
            f"{key}: will not replace {str(path)!r}: besides a previous release it holds files dpopt did not "
            f"write: {_names(foreign)}; move them away first")
    changed = [name for name, meta in listed.items() if name in present and not _unchanged(path / name, meta)]
    if changed:
        raise OutputExistsError(
            f"{key}: will not replace {str(path)!r}: files of the previous release were changed since dpopt "
            f"wrote them: {_names(changed)}; move them away first")


def _names(names: Iterable[str], k: int = 5) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def _files_under(path: Path) -> list[str]:
    """Every non-directory entry under ``path`` (symlinks included, not followed), as relative
    POSIX paths; directories that hold nothing are ignored."""
    out = []
    for root, dirs, files in os.walk(path, followlinks=False):
        rel = Path(root).relative_to(path)
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            out.append((rel / name).as_posix())
    return sorted(out)


def _unchanged(file: Path, meta: Mapping) -> bool:
    try:
        if file.is_symlink() or not file.is_file() or file.stat().st_size != meta.get("bytes"):
            return False
        return _sha256(file) == meta.get("sha256")
    except OSError:
        return False


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- the manifest -----------------------------------------------------------------------------------
def write_manifest(directory: Path, extra: Mapping | None = None) -> dict:
    """List every file under ``directory`` (size and SHA-256) in its :data:`MANIFEST_NAME`."""
    import dpopt

    files = {name: {"bytes": (directory / name).stat().st_size, "sha256": _sha256(directory / name)}
             for name in _files_under(directory) if name not in (MANIFEST_NAME, _OWNER_NAME)}
    manifest = {"format": _MANIFEST_FORMAT, "dpopt_version": dpopt.__version__, **dict(extra or {}),
                "files": files}
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict | None:
    """The manifest of a release directory, or None when it has none (or not a valid one)."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != _MANIFEST_FORMAT \
            or not isinstance(manifest.get("files"), dict):
        return None
    return manifest


# ---- signals ----------------------------------------------------------------------------------------
# A handled signal that arrives while the signals are held (cleanup, the final renames) waits
# here and is raised when the hold ends. This is done in Python rather than by masking the
# signal: another thread (BLAS, a solver) would receive a masked process signal anyway.
_hold_depth = 0
_pending: list[int] = []


def _raise_interrupted(signum, frame):  # noqa: ARG001 - the signal handler's signature
    if _hold_depth:
        _pending.append(int(signum))
        return
    raise Interrupted(signum)


@contextmanager
def handle_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP (and SIGINT) into :class:`Interrupted` inside the block.

    Only handlers still at their defaults are replaced, and only in the main thread (Python
    runs signal handlers there); the previous handlers come back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in HANDLED_SIGNALS:
        current = signal.getsignal(signum)
        if current in (signal.SIG_DFL, signal.default_int_handler):
            previous[signum] = current
            signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the handled signals until the block ends; then the first one held is raised."""
    global _hold_depth
    _hold_depth += 1
    try:
        yield
    finally:
        _hold_depth -= 1
        if _hold_depth == 0 and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)


# ---- signals during a solver call ----------------------------------------------------------------
# A Python signal handler only runs when the main thread executes Python code, so a signal that
# arrives while the main thread is inside a C solver waits for the solve to end (35-340 s late in
# issue 24). Solvers that call back into Python (HiGHS's interrupt callbacks) run the handler
# there; inside :func:`deferred_signals` it only records the signal, the callback sees
# :func:`signal_pending` and stops the solver, and the exception is raised once the solver has
# returned (raising inside a C++ callback would unwind through the solver).
_deferred: list[tuple[int, object]] = []
_defer_depth = 0


def _record_signal(signum, frame):  # noqa: ARG001 - the signal handler's signature
    _deferred.append((int(signum), _deferring.get(int(signum))))


_deferring: dict[int, object] = {}


def signal_pending() -> bool:
    """True when a handled signal arrived inside :func:`deferred_signals` (the solve should stop)."""
    return bool(_deferred)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Inside a solver call: handled signals are recorded, not raised, until the block ends.

    Covers the CLI's handlers (SIGTERM, SIGHUP, SIGINT → :class:`Interrupted`) and Python's
    default SIGINT handler (→ ``KeyboardInterrupt``); other handlers are left alone. Main thread
    only; nests. On exit the first recorded signal is raised as its handler would have.
    """
    global _defer_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed = {}
    if _defer_depth == 0:
        for signum in HANDLED_SIGNALS:
            current = signal.getsignal(signum)
            if current is _raise_interrupted or current is signal.default_int_handler:
                installed[signum] = current
                _deferring[int(signum)] = current
                signal.signal(signum, _record_signal)
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
        for signum, handler in installed.items():
            signal.signal(signum, handler)
            _deferring.pop(int(signum), None)
        if _defer_depth == 0 and _deferred:
            signum, handler = _deferred[0]
            _deferred.clear()
            if handler is _raise_interrupted:
                _raise_interrupted(signum, None)  # raises Interrupted, or holds it during a cleanup
            elif handler is signal.default_int_handler:
                raise KeyboardInterrupt


class _SolverThread:
    """One long-lived daemon thread that runs solver calls handed to it.

    Long-lived on purpose: a solver that keeps per-thread state (HiGHS's task scheduler, also
    inside scipy) deadlocks when every solve runs on a new short-lived thread (HiGHS PR #1886).
    A daemon thread never keeps the process alive. If a call was abandoned (its caller was
    interrupted) and still runs, the next call gets a fresh thread.
    """

    def __init__(self) -> None:
        import queue

        self.jobs: "queue.Queue" = queue.Queue()
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name="dpopt-solver", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            function, args, kwargs, outcome, done = self.jobs.get()
            try:
                outcome["value"] = function(*args, **kwargs)
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc
            finally:
                self.busy = False
                done.set()


_solver_thread: _SolverThread | None = None


def run_interruptibly(function, *args, **kwargs):
    """``function(*args, **kwargs)`` on dpopt's solver thread while the main thread waits in short steps.

    For solvers that never call back into Python (Clarabel through cvxpy, scipy's HiGHS): the
    main thread keeps running Python, so a signal's handler runs within 0.1 s and its exception
    (:class:`Interrupted`, ``KeyboardInterrupt``) propagates at once; the abandoned solve goes on
    in a daemon thread, which does not keep the process alive. Outside the main thread the call
    is made directly.
    """
    global _solver_thread
    if threading.current_thread() is not threading.main_thread():
        return function(*args, **kwargs)
    if _solver_thread is None or _solver_thread.busy or not _solver_thread.thread.is_alive():
        _solver_thread = _SolverThread()
    worker = _solver_thread
    outcome: dict = {}
    done = threading.Event()
    worker.busy = True
    worker.jobs.put((function, args, kwargs, outcome, done))
    while not done.wait(0.1):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# ---- stale temporaries -------------------------------------------------------------------------------
def _temp_pattern(name: str) -> re.Pattern:
    return re.compile(rf"^\.{re.escape(name)}\.(tmp|old)-(\d+)-[A-Za-z0-9_]+$")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # it exists, owned by someone else
    return True


def clean_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Remove what an earlier, killed write to ``target`` left beside it; return what was removed.

    A ``.NAME.tmp-PID-*`` directory of a process that is gone is deleted (it holds dpopt's owner
    mark). A ``.NAME.old-PID-*`` directory (a previous release being swapped out) is put back
    when ``target`` is missing, else deleted; it must hold a dpopt manifest. Anything else, and
    anything of a running process, is left alone.
    """
    target = Path(target).absolute()
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = _temp_pattern(target.name)
    removed = []
    for entry in sorted(parent.iterdir()):
        match = pattern.match(entry.name)
        if not match or not entry.is_dir() or entry.is_symlink() or _alive(int(match.group(2))):
            continue
        if match.group(1) == "tmp":
            if (entry / _OWNER_NAME).is_file():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        elif read_manifest(entry) is not None:
            if not target.exists():
                os.replace(entry, target)  # the kill fell between the two renames: undo the first
            else:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def _make_temp(parent: Path, name: str, kind: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f".{name}.{kind}-{os.getpid()}-", dir=parent))
    (path / _OWNER_NAME).write_text(f"{os.getpid()}\n", encoding="utf-8")
    return path


# ---- the atomic directory -------------------------------------------------------------------------------
@contextmanager
def atomic_directory(
    target: str | os.PathLike,
    *,
    overwrite: bool = False,
    key: str = "--out",
    protected: Mapping[str, str | os.PathLike | None] | None = None,
    manifest: Mapping | None = None,
) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``target``, with its manifest, when the block succeeds.

    Parameters
    ----------
    target
        The final directory. Missing parent directories are created (and removed again if the
        block fails).
    overwrite
        Replace an existing ``target`` that holds a previous dpopt release and nothing else (see
        :func:`check_output_dir`). The old directory is moved aside, the new one renamed into
        place, then the old one deleted; if the rename fails the old one is put back.
    key
        Name of the option that chose ``target``, for error messages.
    protected
        Directories ``target`` may neither be nor contain (see :func:`check_output_dir`).
    manifest
        Extra entries for the manifest (e.g. ``{"not_private": "..."}``).

    Examples
    --------
    >>> with atomic_directory("release") as tmp:        # doctest: +SKIP
    ...     (tmp / "report.json").write_text("{}")
    """
    target = Path(target).absolute()
    check_output_dir(target, overwrite=overwrite, key=key, protected=protected)
    with handle_signals():
        with _signals_held():
            clean_stale_temporaries(target)
            created = _make_parents(target.parent)
            tmp = _make_temp(target.parent, target.name, "tmp")
        committed = False
        try:
            yield tmp
            with _signals_held():
                (tmp / _OWNER_NAME).unlink()
                write_manifest(tmp, manifest)
                _commit(tmp, target, overwrite=overwrite, key=key, protected=protected)
                committed = True
        except BaseException as exc:
            if committed:  # a signal held during the commit arrived after it: the release is in place
                if isinstance(exc, Interrupted):
                    exc.written = target
                raise
            with _signals_held():
                shutil.rmtree(tmp, ignore_errors=True)
                for directory in reversed(created):  # deepest first; only the ones made here
                    try:
                        directory.rmdir()
                    except OSError:
                        break
            raise


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; return the ones created, outermost first."""
    missing = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    missing.reverse()
    for d in missing:
        d.mkdir()
    return missing


def _commit(tmp: Path, target: Path, *, overwrite: bool, key: str, protected=None) -> None:
    # Re-check: another process may have written the target while the release was computed.
    check_output_dir(target, overwrite=overwrite, key=key, protected=protected)
    if not target.exists():
        os.replace(tmp, target)
        return
    if not any(target.iterdir()):
        target.rmdir()
        os.replace(tmp, target)
        return
    old = _make_temp(target.parent, target.name, "old")
    shutil.rmtree(old)  # only the unique name is wanted
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
