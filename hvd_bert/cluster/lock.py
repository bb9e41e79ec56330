"""The lock files: every Python package the set-up installs, transitive ones included, pinned
with its hashes (``requirements-dev.lock``: the run-time and the test tools, what the venv
holds; ``requirements.lock``: the run-time alone, what the images hold). ``scripts/lock.py``
writes them with pip-tools' ``pip-compile --generate-hashes``; ``scripts/setup.sh`` installs
from one with ``--require-hashes`` and records which in the venv (``.hvd_bert_lock``), which
``hvd-bert doctor`` prints with its digest, so that a report names exactly what ran.

Standard library only (``importlib.metadata`` for what is installed)."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Pin", "read_lock", "digest", "norm", "installed_lock", "differences", "STAMP"]

STAMP = ".hvd_bert_lock"  # in the venv (sys.prefix): "<lock file name> <sha256>", written by setup.sh
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


@dataclass
class Pin:
    name: str
    version: str
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)  # what asked for it ("-r requirements.txt", a package)


def norm(name: str) -> str:
    """A distribution's canonical name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str | Path) -> dict[str, Pin]:
    """A pip-compile lock file's pins by canonical name, with their hashes and ``# via`` lines."""
    pins: dict[str, Pin] = {}
    cur, in_via = None, False
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        m = _PIN.match(raw)
        if m:
            cur = pins[norm(m.group(1))] = Pin(norm(m.group(1)), m.group(2))
            in_via = False
            continue
        if cur is None:
            continue
        if line.startswith("--hash="):
            cur.hashes.append(line.split("=", 1)[1].rstrip(" \\"))
        elif line.startswith("# via"):
            rest = line[len("# via"):].strip()
            in_via = not rest
            if rest:
                cur.via.append(rest)
        elif in_via and line.startswith("#   "):
            cur.via.append(line[1:].strip())
        elif not line:
            cur, in_via = None, False
    return pins


def digest(path: str | Path) -> str:
    """The first 16 hex digits of a lock file's SHA-256."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def installed_lock(prefix: str | Path | None = None) -> tuple[str, str] | None:
    """``(lock file name, its sha256)`` the environment at ``prefix`` (this interpreter's) was set
    up from, as ``scripts/setup.sh`` recorded it; None when it recorded none."""
    stamp = Path(prefix or sys.prefix) / STAMP
    try:
        name, sha = stamp.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return name, sha


def differences(pins: dict[str, Pin]) -> list[str]:
    """``name installed (lock: version)`` for each pinned distribution installed at another
    version or missing (a local version label, ``2.13.0+cpu``, must match too)."""
    from importlib import metadata

    out = []
    for name, pin in sorted(pins.items()):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "missing"
        if have != pin.version:
            out.append(f"{name} {have} (lock: {pin.version})")
    return out
