"""MovieLens ratings in their published formats, framework-free, told apart by content: ml-20m /
ml-25m / ml-latest(-small) ``ratings.csv`` (``userId,movieId,rating,timestamp`` with a header),
ml-1m / ml-10m ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``) and ml-100k ``u.data``
(tab-separated user, item, rating, timestamp). A malformed line is named with its number."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from hvd_bert.data.records import DatasetError

__all__ = ["load_movielens", "movielens_layout", "RATINGS_FILES", "LAYOUTS"]

RATINGS_FILES = ("ratings.csv", "ratings.dat", "u.data")
# layout name: (what it is, column separator, has a header)
LAYOUTS = {"csv": ("ml-20m / ml-25m / ml-latest ratings.csv", ",", True),
           "dat": ("ml-1m / ml-10m ratings.dat", "::", False),
           "u.data": ("ml-100k u.data", "\t", False)}


def movielens_layout(first_line: str, source: str) -> str:
    """Which published MovieLens layout a file is, from its first line (not its name)."""
    line = first_line.strip()
    if "::" in line:
        return "dat"
    if line.replace(" ", "").startswith("userId,movieId"):
        return "csv"
    if len(line.split("\t")) == 4:
        return "u.data"
    raise DatasetError(f"{source} is not a MovieLens ratings file: its first line {line[:80]!r} is none of "
                       f"ml-20m/25m/latest's 'userId,movieId,rating,timestamp' header, ml-1m/10m's "
                       f"'UserID::MovieID::Rating::Timestamp' or ml-100k's tab-separated u.data")


def _bad_line(lines: list[str], sep: str, first: int, ncols: int) -> tuple[int, str] | None:
    """The first line (1-based number, text) that is not ``ncols`` numbers separated by ``sep``."""
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        parts = line.split(sep)
        try:
            if len(parts) != ncols:
                raise ValueError
            [float(x) for x in parts]
        except ValueError:
            return n + first, line
    return None


def load_movielens(path: str | Path, skip_bad_lines: bool = False,
                   report=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(users, items, timestamps)`` from a MovieLens ratings file in any published layout
    (:data:`LAYOUTS`, told apart by content), or the folder that holds one. A malformed line
    is an error naming it, unless ``skip_bad_lines`` (then ``report(text)`` says how many were
    dropped)."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in RATINGS_FILES if (p / n).is_file()]
        p = found[0] if found else p
    if not p.is_file():
        raise DatasetError(f"no MovieLens ratings at {path}: give ratings.csv (ml-20m, ml-25m, ml-latest), "
                           f"ratings.dat (ml-1m, ml-10m) or u.data (ml-100k), or the folder that holds one")
    text = p.read_text(encoding="latin-1")  # MovieLens' files are Latin-1; the ratings are ASCII
    lines = text.splitlines()
    if not any(ln.strip() for ln in lines):
        raise DatasetError(f"{p} holds no ratings")
    layout = movielens_layout(next(ln for ln in lines if ln.strip()), str(p))
    what, sep, header = LAYOUTS[layout]
    first = 1
    if header:
        names = [h.strip() for h in lines[0].split(",")]
        if "timestamp" not in names:
            raise DatasetError(f"{p}: header {names} has no timestamp column (MovieLens' is "
                               f"userId,movieId,rating,timestamp)")
        cols, ncols, lines, first = (0, 1, names.index("timestamp")), len(names), lines[1:], 2
    else:
        cols, ncols = (0, 1, 3), 4
    body = "\n".join(lines).replace("::", ",") if sep == "::" else "\n".join(lines)
    delim = "," if sep in ("::", ",") else "\t"
    try:
        arr = np.loadtxt(io.StringIO(body), delimiter=delim, dtype=np.float64, ndmin=2)
        if arr.shape[1] != ncols:
            raise ValueError("column count")
    except ValueError:
        bad = _bad_line(lines, sep, first, ncols)
        if bad is None:
            raise DatasetError(f"{p}: not in the {what} layout") from None
        if not skip_bad_lines:
            raise DatasetError(f"{p} line {bad[0]}: {bad[1][:80]!r} is not {ncols} numbers separated by "
                               f"{sep!r} ({what}); fix the file, or pass --skip-bad-lines to drop such "
                               f"lines") from None
        kept = [ln for ln in lines if ln.strip() and _bad_line([ln], sep, 0, ncols) is None]
        if report is not None:
            report(f"{p}: skipped {sum(1 for ln in lines if ln.strip()) - len(kept)} malformed line(s), the "
                   f"first at line {bad[0]}")
        if not kept:
            raise DatasetError(f"{p}: no well-formed rating lines are left") from None
        body = "\n".join(kept).replace("::", ",") if sep == "::" else "\n".join(kept)
        arr = np.loadtxt(io.StringIO(body), delimiter=delim, dtype=np.float64, ndmin=2)
    for c, name in zip(cols, ("user id", "item id", "timestamp")):
        col = arr[:, c]
        limit = 2**31 if name != "timestamp" else 2**62
        bad = np.flatnonzero(~np.isfinite(col) | (col != np.floor(col)) | (col < 0) | (col >= limit))
        if len(bad):
            r = int(bad[0])
            raise DatasetError(
                f"{p} line {r + first}: {name} {col[r].item():g} is not an integer in [0, {limit}) "
                f"({len(bad)} such rows); MovieLens ids and timestamps are non-negative integers: fix or "
                f"drop those rows")
    return tuple(arr[:, c].astype(np.int64) for c in cols)
