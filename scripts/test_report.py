"""The suite's closing report, from the JUnit XML files its pytest runs wrote: the 25 slowest
tests and the wall time per test directory (setup, call and teardown of every test added up;
a module or session fixture's time is charged to the first test that needed it).

    python scripts/test_report.py REPORT.xml [REPORT.xml ...] [--slowest 25]

A test run by several xdist workers at once is still counted by its own time, so the total per
directory is CPU-side work, not the elapsed time of that phase; the elapsed time of each pytest
run is printed by pytest itself and by ``make test``.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def cases(paths: list[Path]) -> list[tuple[str, float, str]]:
    """``(test id, seconds, outcome)`` of every test case in the reports."""
    out = []
    for path in paths:
        if not path.is_file():
            print(f"test_report: {path} is missing (its pytest run did not finish); skipped", file=sys.stderr)
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            cls, name = case.get("classname", ""), case.get("name", "")
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            out.append((f"{cls.replace('.', '/')}.py::{name}", float(case.get("time") or 0.0), outcome))
    return out


def directory(test_id: str) -> str:
    parts = test_id.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--slowest", type=int, default=25)
    args = ap.parse_args(argv)
    rows = cases(args.reports)
    if not rows:
        print("test_report: no test cases in the reports")
        return 0
    print(f"\n===== the {args.slowest} slowest tests (setup + call + teardown) =====")
    for test_id, secs, outcome in sorted(rows, key=lambda r: -r[1])[: args.slowest]:
        print(f"{secs:8.1f} s  {test_id}" + ("" if outcome == "passed" else f"  [{outcome}]"))
    per_dir: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for test_id, secs, _ in rows:
        d = per_dir[directory(test_id)]
        d[0] += secs
        d[1] += 1
    print("\n===== time per directory (tests' own time, summed) =====")
    for d, (secs, n) in sorted(per_dir.items(), key=lambda kv: -kv[1][0]):
        print(f"{secs / 60:8.1f} min  {n:4d} tests  {d}")
    total = sum(s for _, s, _ in rows)
    print(f"{total / 60:8.1f} min  {len(rows):4d} tests  in all")
    count = {o: sum(1 for r in rows if r[2] == o) for o in ("passed", "failed", "error", "skipped")}
    print(f"suite: {count['passed']} passed, {count['failed'] + count['error']} failed, "
          f"{count['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
