"""Measures the suite's float tolerances (tests/closeness.py): runs the tests that use them on
several inputs (seed shifts 0..N-1; shift 0 is the suite's own) and prints, for each site, the
worst ratio of a difference to its bound over all of them (below 1 passes; the margin is its
inverse). Not collected by pytest. Run it on every CPU kind CI runs on; ``--write`` puts this
machine's table into tests/bounds/MEASURED.md (a section per CPU model, others kept).

    .venv/bin/python tests/bounds/measure.py [--shifts 8] [--write] [PYTEST_ARGS ...]

Without PYTEST_ARGS: every test module that calls ``assert_close``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
TABLE = TESTS / "bounds" / "MEASURED.md"


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")
                  if re.search(r"\bassert_close\(", p.read_text()))


def cpu_model() -> str:
    """The model name and the vector ISAs the kernels pick from (a VM may hide the model)."""
    name, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'})"


HEADER = "| site | seed shifts | comparisons | worst ratio to the bound | margin |\n|---|---|---|---|---|"


def write(cpu: str, rows: dict[str, str]) -> None:
    """Merge ``rows`` into this CPU kind's table in MEASURED.md (a site measured again replaces
    its row; other sites and other CPU kinds are kept); atomic."""
    sections: dict[str, dict[str, str]] = {}
    if TABLE.exists():
        for part in re.split(r"(?m)^## ", TABLE.read_text())[1:]:
            lines = part.splitlines()
            sections[lines[0].strip()] = {m.group(1): ln for ln in lines
                                          if (m := re.match(r"\| `([^`]+)` \|", ln))}
    sections.setdefault(cpu, {}).update(rows)
    text = ["# Measured float tolerances", "",
            "Written by `tests/bounds/measure.py --write`: for each comparison site of tests/closeness.py, "
            "the worst ratio of |actual - desired| to its bound (atol + rtol |desired|) over the seed "
            "shifts measured, per CPU kind. Below 1 passes; the margin is the inverse.", ""]
    for name in sorted(sections):
        text += [f"## {name}", "", HEADER, *(sections[name][k] for k in sorted(sections[name])), ""]
    tmp = TABLE.with_suffix(".tmp")
    tmp.write_text("\n".join(text))
    tmp.replace(TABLE)
    print(f"wrote {TABLE}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shifts", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="update tests/bounds/MEASURED.md")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args(argv)
    targets = args.pytest_args or modules()
    worst: dict[str, tuple[float, int]] = {}
    counts: dict[str, int] = defaultdict(int)
    with tempfile.TemporaryDirectory() as tmp:
        for shift in range(args.shifts):
            log = Path(tmp) / f"shift{shift}.jsonl"
            env = dict(os.environ, HVD_BERT_TEST_SEED_SHIFT=str(shift), HVD_BERT_BOUNDS_LOG=str(log))
            res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "-n", "2", *targets], cwd=ROOT, env=env, capture_output=True, text=True)
            tail = res.stdout.strip().splitlines()[-1:] or [res.stderr.strip()[-300:]]
            print(f"shift {shift}: {tail[0]}", flush=True)
            for line in log.read_text().splitlines() if log.exists() else []:
                rec = json.loads(line)
                counts[rec["site"]] += 1
                if rec["site"] not in worst or rec["ratio"] > worst[rec["site"]][0]:
                    worst[rec["site"]] = (rec["ratio"], shift)
    cpu = cpu_model()
    rows = {site: f"| `{site}` | 0-{args.shifts - 1} | {counts[site]} | {r:.2g} | "
                  f"{(1 / r if r else float('inf')):.3g}x |" for site, (r, _) in worst.items()}
    print("\n".join([f"\n{cpu}", HEADER, *(rows[k] for k in sorted(rows))]))
    if args.write:
        write(cpu, rows)
    return 0 if all(r <= 1 for r, _ in worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
