#!/usr/bin/env python3
"""Refresh the lock files from requirements.txt and requirements-dev.txt (``make lock``).

    python3 scripts/lock.py              # keep every pin that still satisfies the requirements
    python3 scripts/lock.py --upgrade    # every package at its newest allowed version

``requirements-dev.lock`` is pip-tools' ``pip-compile --generate-hashes`` of both files (pip's
own resolver and configuration: torch's CPU build where pip finds it, as the set-up does);
``requirements.lock`` is its run-time part, the packages that requirements.txt asks for and what
they need, at the same versions. pip-tools runs from its own venv under the cache
(``$HVD_BERT_CACHE/lock-tools``), pinned below; the files are replaced atomically, and only when
both were written. requirements-bench.txt (the benchmarks' peers) is not installed by the set-up
and not locked."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hvd_bert.cluster.lock import read_lock  # noqa: E402

PIP_TOOLS = "pip-tools==7.7.0"
RUNTIME = "-r requirements.txt"


def tools() -> Path:
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    cache = Path(os.environ.get("HVD_BERT_CACHE") or xdg / "hvd_bert")
    venv = cache / "lock-tools"
    exe = venv / "bin" / "pip-compile"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", PIP_TOOLS], check=True)
    return exe


def runtime_part(dev_lock: Path) -> str:
    """The blocks of ``dev_lock`` that requirements.txt needs: what it names, and, transitively,
    what those need (pip-compile's ``# via`` lines say who asked for each package)."""
    pins = read_lock(dev_lock)
    keep = {n for n, p in pins.items() if RUNTIME in p.via}
    grew = True
    while grew:
        more = {n for n, p in pins.items() if n not in keep and any(v in keep for v in p.via)}
        keep |= more
        grew = bool(more)
    out, block, name = [], [], None
    for line in dev_lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            if name in keep:
                out += block
            block, name = [], line.split("==")[0].lower().replace("_", "-").replace(".", "-")
        if name is not None:
            block.append(line)
    if name in keep:
        out += block
    head = ["#", "# requirements.lock: the run-time packages of requirements-dev.lock (written by",
            "# scripts/lock.py from it: requirements.txt's packages and what they need, the same",
            "# versions and hashes). Refresh both with: make lock", "#"]
    return "\n".join(head + out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upgrade", action="store_true", help="every package at its newest allowed version")
    a = ap.parse_args()
    dev = ROOT / "requirements-dev.lock"
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        out = Path(tmp) / dev.name
        if dev.exists():
            out.write_bytes(dev.read_bytes())  # (pip-compile keeps the pins that still fit)
        cmd = [str(tools()), "-q", "--generate-hashes", "--allow-unsafe", "--strip-extras",
               "--no-emit-index-url", "--no-emit-find-links", "--no-emit-trusted-host",
               "--output-file", str(out),
               "requirements.txt", "requirements-dev.txt"] + (["--upgrade"] if a.upgrade else [])
        env = dict(os.environ, CUSTOM_COMPILE_COMMAND="make lock")
        if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
            print("lock: pip-compile failed (its error is above); the lock files are unchanged",
                  file=sys.stderr)
            return 1
        text = out.read_text().replace(str(out), dev.name)
        (Path(tmp) / "dev").write_text(text)
        (Path(tmp) / "run").write_text(runtime_part(Path(tmp) / "dev"))
        os.replace(Path(tmp) / "dev", dev)
        os.replace(Path(tmp) / "run", ROOT / "requirements.lock")
    n_dev, n_run = len(read_lock(dev)), len(read_lock(ROOT / "requirements.lock"))
    print(f"lock: {dev.name} pins {n_dev} packages, requirements.lock {n_run} (run-time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
