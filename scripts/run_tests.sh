#!/usr/bin/env bash
# The test suite as `make test` runs it (and `make test-quick`, with QUICK=1), after the set-up:
#   1. the single-process tests (tests/core, tests/pt, tests/tf) on 2 pytest-xdist workers:
#      they start no ranks, so one per core;
#   2. the tests that start ranks, clusters and jobs (tests/readme, tests/parallel), two test
#      modules at a time (--dist loadfile: a module's launches and fixtures stay on one worker,
#      the README's blocks run in order): a 2-rank run alone leaves the cores idle part of the
#      time (start-up, Gloo timeouts in the elastic tests, SLURM's scheduling, polling; the
#      measured gain is about 8%);
#      the README module is collected first, so the longest module starts first;
#   3. the report: the 25 slowest tests and the time per directory (scripts/test_report.py).
# Both pytest runs always run; the exit status is the first failure's. Extra arguments go to
# both pytest runs (e.g. -x, -k PATTERN).
#   QUICK=1 FRAMEWORK=pt|tf   the editing loop: the framework-free core and one framework's
#                             unit tests only (about a minute here)
#   REPORTS=DIR               where the JUnit files go (default .test-reports)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
REPORTS=${REPORTS:-$ROOT/.test-reports}
WORKERS=${WORKERS:-2}
cd "$ROOT"
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
pytest_() { "$PY" -m pytest -q -p no:cacheprovider -o junit_duration_report=total "$@"; }

start=$SECONDS
status=0
if [[ ${QUICK:-0} == 1 ]]; then
    fw=${FRAMEWORK:-pt}
    [[ $fw == pt || $fw == tf ]] || { echo "run_tests: FRAMEWORK must be pt or tf, not '$fw'" >&2; exit 2; }
    pytest_ -n "$WORKERS" --junitxml="$REPORTS/1-unit.xml" tests/core "tests/$fw" "$@" || status=$?
else
    pytest_ -n "$WORKERS" --junitxml="$REPORTS/1-unit.xml" tests/core tests/pt tests/tf "$@" || status=$?
    unit=$((SECONDS - start))
    pytest_ -n "$WORKERS" --dist loadfile --junitxml="$REPORTS/2-ranks.xml" tests/readme tests/parallel "$@" \
        || { rc=$?; ((status)) || status=$rc; }
    echo "run_tests: single-process tests ${unit} s, multi-process tests $((SECONDS - start - unit)) s"
fi
echo "run_tests: $((SECONDS - start)) s in all (exit $status)"
"$PY" scripts/test_report.py "$REPORTS"/*.xml  # its last line: 'suite: N passed, N failed, N skipped'
exit "$status"
