#!/usr/bin/env bash
# tierctl size --plot FILE.png draws the miss-ratio curve through plot_mrc.py and Debian's
# python3-matplotlib. Without matplotlib: a clear error (exit 1, nothing written), then exit 77.
#   tierctl_size_png_test.sh TIERCTL
set -uo pipefail
tierctl=$(realpath "$1")
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
for i in $(seq 0 199); do
  echo "{\"timestamp\": $i, \"input_length\": 512, \"hash_ids\": [0, $((i % 37)), $((i % 11))]}"
done > "$tmp/t.jsonl"

has_matplotlib=0
for py in python3 /usr/bin/python3; do
  "$py" -c 'import matplotlib' 2>/dev/null && has_matplotlib=1
done
out=$("$tierctl" size --trace "$tmp/t.jsonl" --at 20 --plot "$tmp/mrc.png" 2>&1)
rc=$?
if [ $has_matplotlib -eq 0 ]; then
  [ $rc -eq 1 ] && grep -qF "apt-get install python3-matplotlib" <<<"$out" || fail "$rc: $out"
  [ ! -e "$tmp/mrc.png" ] || fail "a PNG was written without matplotlib"
  echo "no matplotlib: the error is clear; PNG drawing skipped"
  exit 77
fi
[ $rc -eq 0 ] || fail "--plot png exited $rc: $out"
# A PNG of the script's size (9 x 5.5 in at 100 dpi), and more than an empty canvas.
python3 - "$tmp/mrc.png" <<'PY' || fail "not the PNG expected"
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (900, 550), (width, height)
assert len(data) > 10000, len(data)
PY
# The plot script's own errors are the tool's: an unwritable file.
out=$("$tierctl" size --trace "$tmp/t.jsonl" --plot "$tmp/no/such/dir/mrc.png" 2>&1)
[ $? -eq 1 ] && grep -qF "plot_mrc.py" <<<"$out" && grep -qF "failed (exit status" <<<"$out" ||
  fail "--plot into a missing folder: $out"
echo ok
