"""Writing files safely, framework-free: every file the toolkit writes goes through here.

* ``atomic_write``: a temporary file in the same folder, created exclusively and without
  following a link (one planted under its name is removed, never written through), fsynced,
  then renamed over the final name (``os.replace`` replaces a link, not what it points to).
  A failure removes the temporary file and leaves the final name untouched.
* ``open_append``: a log file appended to (``metrics.jsonl``), refused if it is a link.
* ``atomic_folder``: a new folder written under a temporary name, renamed when complete.
* ``own_folder``: a folder inside a run folder that the toolkit writes into (``tensorboard/``),
  refused if it is a link; ``planted_link``: which of a run folder's names is a link.
* ``read_json_object``: a JSON object from a run or checkpoint folder, or a ValueError saying
  how the file is damaged.
* ``refuse_clash``: an output path that is, holds or lies inside a path the command reads or
  owns (by resolved path and by inode), refused before anything is written.
* ``os_error_line``: a resource error (no space left, a read-only or unwritable folder, a
  link where a file belongs) as the one line the user reads, with the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "owned_name", "usual_mode", "atomic_folder", "open_append", "own_folder",
           "planted_link", "os_error_line", "UnsafePath", "NoSpace", "clear_path", "read_json_object",
           "refuse_clash", "OutputClash", "kind_of", "refuse_special"]


class UnsafePath(OSError):
    """A link (or another kind of file) planted where the toolkit writes: one line, exit 2."""


class OutputClash(UnsafePath):
    """An output path that would replace or write into something the command reads: one line, exit 2."""


class NoSpace(OSError):
    """The disk filled while writing ``filename``; ``written``: the bytes that fitted."""

    def __init__(self, filename: str, written: int):
        super().__init__(errno.ENOSPC, "No space left on device", filename)
        self.written = written


def read_json_object(path: str | Path) -> dict:
    """A JSON object read from ``path``; a ValueError saying how it is damaged (not UTF-8, not
    JSON, not an object) otherwise (OSError if it cannot be read)."""
    import json

    try:
        got = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is damaged ({type(e).__name__}: {e})") from None
    if not isinstance(got, dict):
        raise ValueError(f"{path} is damaged (a JSON {type(got).__name__}, not an object)")
    return got


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _within(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies under it, by resolved path or by the folders' inodes."""
    if inner == outer or outer in inner.parents:
        return True
    ident = _identity(outer)
    return ident is not None and any(_identity(p) == ident for p in (inner, *inner.parents) if p.exists())


# the names the toolkit gives what it writes into run and data folders
_OWNED = ("ckpt-*", "best.*", "dataset.json", "part-*", "config.json", "bert_config.json", "task.json",
          "vocab.txt", "metrics.jsonl", "tensorboard", ".hvd_bert.lock", "*.tfrecord", "ncf.npz",
          "tokenizer*.json", "model.safetensors", "pytorch_model.bin")


def owned_name(rel: Path) -> bool:
    """Whether a path (relative to a folder) passes through a name the toolkit gives its own files."""
    import fnmatch

    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in _OWNED)


def refuse_clash(output: str | Path, reads: dict[str, str | Path | None], *, what: str = "--output",
                 folder: bool = False, run_folder: bool = False) -> None:
    """Refuse (``OutputClash``) an ``output`` that would replace or write into something the
    command reads or owns: ``reads`` maps a description (``"the input"``, ``"the checkpoint's
    run folder"``) to its path. A file output clashes with a path that is the same file (resolved,
    or the same inode: a hard link), and, inside a folder read, with a file there or a name the
    toolkit gives its own files (``ckpt-*``, ``dataset.json``, ...); a ``folder`` output with any
    folder read that it is, holds or lies inside; a ``run_folder`` (a job's ``train.output_dir``,
    which only adds files of its own) with one that it is, or that it lies inside under a name the
    toolkit gives its own files. Nothing is written before this check."""
    out = Path(output).expanduser()
    out_r = out.resolve()
    for desc, path in reads.items():
        if path is None or str(path) == "":
            continue
        p = Path(path).expanduser()
        p_r = p.resolve()
        same = out_r == p_r or (_identity(out_r) is not None and _identity(out_r) == _identity(p_r))
        if same:
            problem = f"is {desc} {p}"
        elif p_r.is_dir() and _within(out_r, p_r) and (
                folder or (not run_folder and (out_r.exists() or out_r.is_symlink()))
                or owned_name(out_r.relative_to(p_r) if p_r in out_r.parents else Path(out_r.name))):
            problem = f"would replace a file of {desc} {p}" if not folder else f"lies inside {desc} {p}"
        elif folder and _within(p_r, out_r):
            problem = f"holds {desc} {p}"
        elif (twin := _hard_link_in(out_r, p_r)) is not None:
            problem = f"is a hard link of {twin}, a file of {desc} {p}"
        else:
            continue
        raise OutputClash(errno.EEXIST, f"{what} {out} {problem}, which this command reads: writing it would "
                                        f"destroy that; give {what} a path outside it", str(out))


def _hard_link_in(out: Path, folder: Path) -> Path | None:
    """A file directly in ``folder`` that is the same file as ``out`` (another name of one inode),
    or None (``out`` not an existing file, or ``folder`` not a folder)."""
    ident = _identity(out) if out.is_file() else None
    if ident is None or not folder.is_dir():
        return None
    try:
        return next((f for f in folder.iterdir() if f.is_file() and _identity(f) == ident), None)
    except OSError:
        return None


def usual_mode(path: str | Path) -> None:
    """Give a written file the mode a plain ``open()`` gives (0666 less the umask): some writers
    (safetensors) create theirs 0600."""
    mask = os.umask(0)
    os.umask(mask)
    if Path(path).is_file():
        os.chmod(path, 0o666 & ~mask)


def clear_path(path: Path) -> None:
    """Remove whatever is at ``path`` (a leftover temporary file or folder, or a planted link:
    the link itself, never what it points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path)


def _exclusive(path: Path) -> None:
    clear_path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Path], None], size: int = 0) -> Path:
    """Call ``write(tmp_path)``, fsync it, and rename it to ``path`` with the usual file mode. On
    any error the temporary file is removed and ``path`` is untouched; a full disk is named as
    such (some writers report it otherwise, e.g. PyTorch's "unexpected pos"), with ``size`` (the
    bytes the file will take, if the caller knows) as what to free."""
    path = Path(path)
    refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _exclusive(tmp)
        write(tmp)
        usual_mode(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if path.is_dir() and not path.is_symlink():
            raise UnsafePath(errno.EISDIR, f"{path} is a folder where hvd_bert writes a file; move it away",
                             str(path))
        os.replace(tmp, path)
    except BaseException as e:
        full = _out_of_space(tmp.parent) or (isinstance(e, OSError) and e.errno == errno.ENOSPC)
        written = tmp.stat().st_size if tmp.is_file() and not tmp.is_symlink() else 0
        with contextlib.suppress(OSError):
            clear_path(tmp)
        if full:
            raise NoSpace(str(path), max(written, size)) from e
        raise
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def kind_of(path: Path) -> str | None:
    """What ``path`` is when it is neither missing, a regular file nor a folder: a symbolic link,
    a named pipe, a device, a socket (None otherwise)."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def refuse_special(path: Path) -> None:
    """An output that would replace a pipe, a device or a socket (``/dev/null`` among them: a
    rename over it replaces it system-wide) is refused: UnsafePath, one line. (A link planted
    there is replaced, never followed: its target stays as it was.)"""
    kind = kind_of(Path(path))
    if kind and kind != "a symbolic link":
        raise UnsafePath(errno.EEXIST, f"{path} is {kind}, not a regular file: hvd_bert writes its outputs "
                                       f"as files it replaces whole, never over one; give the path of a file",
                         str(path))


def _out_of_space(folder: Path) -> bool:
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20  # under 1 MiB left


def open_append(path: str | Path):
    """``path`` opened for appending text (created if missing), never through a link."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(errno.ELOOP, f"{path} is a symbolic link; hvd_bert does not write through one: "
                                          f"remove it", str(path)) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def planted_link(folder: str | Path, names) -> str | None:
    """Why ``folder`` cannot be written into: one of ``names`` (files appended to, folders
    written into) is a symbolic link; None otherwise."""
    for name in names:
        p = Path(folder) / name
        if p.is_symlink():
            return f"{p} is a symbolic link; hvd_bert does not write through one: remove it"
    return None


def own_folder(path: str | Path) -> Path:
    """``path`` as a folder the toolkit writes into (made if missing), refused if it is a link."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafePath(errno.ELOOP, f"{path} is a symbolic link; hvd_bert does not write through one: "
                                      f"remove it", str(path))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_folder(folder: str | Path, exists_error: type[Exception] = FileExistsError,
                  overwrite: bool = False):
    """Write a new folder atomically: yields a temporary folder beside it, renamed to ``folder``
    when the block ends without error, removed otherwise. An existing non-empty ``folder`` is
    refused (``exists_error``), unless ``overwrite``: then it is replaced only once the new one is
    complete (a failure leaves it as it was); a link there is removed, never followed."""
    folder = Path(folder)
    if not overwrite and (folder.is_symlink() or (folder.exists() and any(folder.iterdir()))):
        raise exists_error(f"{folder} exists and is not empty; give a new --output folder, or --overwrite to "
                           f"replace it")
    if folder.exists() and not folder.is_dir():
        raise exists_error(f"{folder} is a file; give a folder path as --output")
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    clear_path(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if folder.is_symlink() or folder.exists():
            clear_path(old)
            folder.rename(old)  # (the link itself, or the old folder: removed once the new one is in place)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() or old.is_symlink():
            old.rename(folder)
        raise
    clear_path(old)


_FIXES = {
    errno.ENOSPC: "",
    errno.EDQUOT: "free space within your quota or give another {out}",
    errno.EROFS: "give a writable {out}",
    errno.EACCES: "you may not write there: give a folder you own as {out}",
    errno.EPERM: "you may not write there: give a folder you own as {out}",
}


def os_error_line(e: OSError, output: str = "train.output_dir (--output)") -> str | None:
    """The one line for a resource error the user fixes (full or read-only disk, no permission,
    a link planted where a file belongs); None for any other OSError (a bug keeps its traceback).
    ``output``: the setting that names where the command writes (a training job's
    train.output_dir, another command's --output)."""
    if isinstance(e, UnsafePath):
        return e.strerror
    if e.errno in (errno.EEXIST, errno.ENOTDIR) and e.filename:
        return _not_a_folder(e, output)
    fix = _FIXES.get(e.errno)
    if fix is None:
        return None
    where = e.filename or "a file"
    if e.errno == errno.ENOSPC:
        mb = getattr(e, "written", 0) / 2**20
        need = f"free at least {mb:.0f} MB" if mb >= 1 else "free space"
        kept = "; the checkpoints already there are intact" if output.startswith("train.") else ""
        if not e.filename:  # (a writer that did not name its file: no mount to name either)
            return (f"no space left on the device {output} writes to (the writer named no file); {need} "
                    f"there or give another {output}{kept}")
        return (f"no space left on {_mount_of(where)} while writing {where}; {need} there or give another "
                f"{output}{kept}")
    what = {errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}
    what = what.get(e.errno, "permission denied")
    return f"{what} while writing {where}: {fix.format(out=output)}"


def _not_a_folder(e: OSError, output: str) -> str:
    """A folder was wanted where a file (or a pipe, a device) is: the path, what is in the way."""
    where = Path(e.filename)
    block = next((p for p in [where, *where.parents] if p.exists() and not p.is_dir()), where)
    kind = kind_of(block) or ("a file" if block.is_file() else "not a folder")
    if block == where and e.errno == errno.EEXIST:
        return (f"{where} is {kind} where a folder is needed; move it away or give another {output}")
    import re

    named = re.sub(r"/\.([^/]+)\.tmp-\d+$", r"/\1", str(e.filename))  # (a temporary name: the path meant)
    return f"{named}: {block} is {kind}, not a folder, so nothing can be read or written under it; " \
           f"give a path whose folders are folders"


def _mount_of(path: str) -> str:
    """The mount point holding ``path`` (the device the user frees space on)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        dev = p.stat().st_dev
        while p != p.parent and p.parent.stat().st_dev == dev:
            p = p.parent
    except OSError:
        pass
    return str(p)
