#!/usr/bin/env bash
# run_tests.sh - run every C test binary and the Python tests, then print the
# closing "N passed, N failed" line. A binary that dies before printing its
# RESULT line counts as one failure; a skipped pytest counts as skipped, never passed.
set -u
cd "$(dirname "$0")/.."
export KIPP_TEST_MODELS=${KIPP_TEST_MODELS:-build/models}
# The project's virtual environment (tools/install_deps.sh makes it), not the global Python.
PY=${PYTHON:-.venv/bin/python}
if ! [ -x "$PY" ] && ! command -v "$PY" >/dev/null; then
    echo "run_tests: $PY is missing; run tools/install_deps.sh (or make deps) first" >&2
    echo "0 passed, 1 failed"; exit 1
fi
BIN=${KIPP_TEST_BIN:-build/bin}
passed=0; failed=0; skipped=0
for t in "$BIN"/test_* "$BIN"/kcheck "$BIN"/kcheck_emu; do
    [ -x "$t" ] || continue
    echo "== $t"
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(FAIL|PASS)|check failed|RESULT|error' | tail -n 200
    line=$(printf '%s\n' "$out" | grep -E '^RESULT ' | tail -n 1)
    if [ -z "$line" ]; then
        echo "   $t exited $rc without a RESULT line: counted as 1 failure"
        printf '%s\n' "$out" | tail -n 20
        failed=$((failed + 1)); continue
    fi
    set -- $line
    passed=$((passed + $2)); failed=$((failed + $3))
    if [ "$rc" -ne 0 ] && [ "$3" -eq 0 ]; then echo "   $t exited $rc: counted as 1 failure"; failed=$((failed + 1)); fi
done
if [ -z "${KIPP_SKIP_PYTEST:-}" ]; then
    echo "== pytest tests/"
    xml=$(mktemp)
    "$PY" -m pytest -q -p no:cacheprovider tests --junitxml="$xml" 2>&1 | tail -n 40
    if [ -s "$xml" ]; then
        read -r pt pf ps < <("$PY" - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r if r.tag == "testsuite" else r.find("testsuite")
t, f, e, k = (int(s.get(x, 0)) for x in ("tests", "failures", "errors", "skipped"))
print(t - f - e - k, f + e, k)
PY
)
        passed=$((passed + pt)); failed=$((failed + pf)); skipped=$((skipped + ps))
    else
        echo "   pytest wrote no report: counted as 1 failure"; failed=$((failed + 1))
    fi
    rm -f "$xml"
fi
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
