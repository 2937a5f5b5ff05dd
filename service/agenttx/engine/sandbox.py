"""Files inside a transaction's sandbox root: confinement, atomic writes, saga undo.

Why: `fs.write` changes the real filesystem at step time (other processes can read the
file), so it is undone by compensation rather than by dropping a buffer. Everything here
must keep two promises: nothing is ever written outside the root (absolute paths, `..`,
NUL bytes and symlinks leading out are refused before any write), and a write is
atomic (temp file in the same directory + fsync + rename + directory fsync).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib

from ..tools.base import ToolError


def _escape(path: str) -> ToolError:
    return ToolError(f'permission denied for path "{path}": it resolves outside the sandbox',
                     argument="path")


def confine(root: str, path: str) -> pathlib.Path:
    """The absolute path for `path` under `root`, or a ToolError saying why not."""
    if path == "":
        raise ToolError('invalid value: string "", expected a non-empty relative file path',
                        argument="path")
    if "\x00" in path:
        shown = path.replace("\x00", "\\u0000")
        raise ToolError(f'invalid value: string "{shown}", expected a path without NUL bytes',
                        argument="path")
    pure = pathlib.PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise _escape(path)
    if path.endswith("/") or pure.name in ("", "."):
        raise ToolError(f"Is a directory: '{path}'", argument="path")
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, target]) != real_root or target == real_root:
        raise _escape(path)
    return pathlib.Path(target)


def read_state(target: pathlib.Path, path: str) -> bytes | None:
    """Current bytes of the file, None if absent. Refuses directories."""
    try:
        return target.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ToolError(f"Is a directory: '{path}'", argument="path") from None
    except NotADirectoryError:
        raise ToolError(f"Not a directory: '{path}'", argument="path") from None
    except PermissionError:
        raise ToolError(f"Permission denied: '{path}'", argument="path") from None


def temp_name(target: pathlib.Path, tx_id: str, step_id: int) -> pathlib.Path:
    """Deterministic, so crash recovery can find and remove a leftover temp file."""
    return target.with_name(f".{target.name}.agenttx-{tx_id[:8]}-{step_id}.tmp")


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(target: pathlib.Path, tmp: pathlib.Path, data: bytes, path: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except NotADirectoryError:
        raise ToolError(f"Not a directory: '{path}'", argument="path") from None
    except FileExistsError:
        raise ToolError(f"Not a directory: '{path}'", argument="path") from None
    except PermissionError:
        raise ToolError(f"Permission denied: '{path}'", argument="path") from None
    except OSError as exc:
        raise ToolError(f"{exc.strerror or exc}: '{path}'", argument="path") from None


def install_temp(tmp: pathlib.Path, target: pathlib.Path) -> None:
    os.replace(tmp, target)
    _fsync_dir(target.parent)


def discard_temp(tmp: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current_hash(target: pathlib.Path) -> str | None:
    try:
        return sha256(target.read_bytes())
    except OSError:
        return None


def restore(target: pathlib.Path, previous: bytes | None) -> None:
    """Saga undo, idempotent: put back the previous bytes, or remove a file the step
    created (an already-absent file is a success). Raises OSError when it cannot."""
    if previous is None:
        if target.is_dir() and not target.is_symlink():
            raise IsADirectoryError(f"Is a directory: '{target}'")
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        with contextlib.suppress(OSError):
            _fsync_dir(target.parent)
        return
    tmp = target.with_name(f".{target.name}.agenttx-restore.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        fh.write(previous)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.replace(tmp, target)
    except OSError:
        discard_temp(tmp)
        raise
    _fsync_dir(target.parent)


def confine_root(root: str) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(root))
