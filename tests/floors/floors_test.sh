#!/usr/bin/env bash
# The floor check passes on the tree, and fails when an upward include is added (a copy of the
# library folders with the core including a DSV4 codec header).
set -euo pipefail
source=$1
check="$source/tests/floors/check_floors.py"
python3 "$check" "$source"
work=$(mktemp -d /tmp/libtier-floors.XXXXXX)
trap 'rm -rf "$work"' EXIT
for d in libtier hip engine codecs backends layouts capi; do cp -r "$source/$d" "$work/"; done
echo '#include "tier/dsv4/geometry.hpp"' >> "$work/libtier/src/status.cpp"
if out=$(python3 "$check" "$work"); then
  echo "FAIL: the check accepted the core including a codec header"; exit 1
fi
grep -q 'libtier/src/status.cpp:.*libtier (floor 0) includes codecs/dsv4/include/tier/dsv4/geometry.hpp' <<<"$out" || {
  echo "FAIL: unexpected report: $out"; exit 1; }
echo "upward include refused: $(head -1 <<<"$out")"
