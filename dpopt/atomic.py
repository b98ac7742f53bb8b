"""Atomic output directories: a release appears complete or not at all.

Everything is written into a temporary sibling of the target (same parent directory, hence
the same file system), which is then renamed into place with :func:`os.replace`. A rename
within one file system is atomic on POSIX, so a reader never sees half a release; on any
failure the temporary directory (and any parent directory this module created) is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dpopt.errors import DpoptError


class OutputExistsError(DpoptError, FileExistsError):
    """The output directory already holds files and overwriting was not asked for."""


def check_output_dir(target: str | os.PathLike, *, overwrite: bool = False, key: str = "--out") -> Path:
    """Raise unless ``target`` can receive a release (absent, empty, or ``overwrite``).

    Parameters
    ----------
    target
        The output directory.
    overwrite
        Allow replacing a non-empty directory.
    key
        The option or spec key that named the directory (for the error message).
    """
    path = Path(target)
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{key}: {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"{key}: directory {str(path)!r} already holds files; choose another directory "
            "or pass --overwrite (overwrite=True) to replace it"
        )
    return path


@contextmanager
def atomic_directory(target: str | os.PathLike, *, overwrite: bool = False, key: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` when the block succeeds.

    Parameters
    ----------
    target
        The final directory. Missing parent directories are created (and removed again if
        the block fails).
    overwrite
        Replace an existing non-empty ``target``. The old directory is moved aside, the new
        one renamed into place, then the old one deleted; if the rename fails the old one
        is put back.
    key
        Name of the option that chose ``target``, for error messages.

    Examples
    --------
    >>> with atomic_directory("release") as tmp:        # doctest: +SKIP
    ...     (tmp / "report.json").write_text("{}")
    """
    target = Path(target).absolute()
    check_output_dir(target, overwrite=overwrite, key=key)
    created = _make_parents(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        _commit(tmp, target, overwrite=overwrite, key=key)
    except BaseException:
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


def _commit(tmp: Path, target: Path, *, overwrite: bool, key: str) -> None:
    # Re-check: another process may have written the target while the release was computed.
    check_output_dir(target, overwrite=overwrite, key=key)
    if not target.exists():
        os.replace(tmp, target)
        return
    if not any(target.iterdir()):
        target.rmdir()
        os.replace(tmp, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    old.rmdir()  # only the unique name is wanted
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
