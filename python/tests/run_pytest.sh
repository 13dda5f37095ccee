#!/bin/sh
# Runs the Python package's tests: run_pytest.sh PYTHON TESTDIR.
# Exit 77 (skip) when pytest or numpy is missing; pytest's exit 5 (no tests collected) fails.
python=$1
dir=$2
"$python" -c 'import pytest, numpy' 2>/dev/null || { echo "SKIP: pytest or numpy missing for $python"; exit 77; }
"$python" -m pytest -q -p no:cacheprovider "$dir"
rc=$?
[ "$rc" -eq 5 ] && { echo "FAIL: pytest collected no tests"; exit 1; }
exit "$rc"
