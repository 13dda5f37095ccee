#!/usr/bin/env bash
# tierctl geometry: the acceptance figures in JSON, the table, and usage errors; tierctl
# sidecar_key: the reference's §3.2 test vector.
#   tierctl_geometry_test.sh TIERCTL
set -uo pipefail
tierctl=$1
fail() { echo "FAIL: $*"; exit 1; }

field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
for spec in "v4-pro-fp8 1521920 26782720" "v4-pro-bf16 2283008 29237248"; do
  set -- $spec
  out=$("$tierctl" geometry --preset "$1" --json) || fail "geometry --preset $1 --json exited $?"
  [ "$(echo "$out" | field page_bytes_per_block)" = "$2" ] || fail "$1 page_bytes_per_block"
  [ "$(echo "$out" | field slot_bytes)" = "$3" ] || fail "$1 slot_bytes"
done
out=$("$tierctl" geometry --preset v4-flash-fp8) || fail "table exited $?"
echo "$out" | grep -q "SLOT   dsv4.main_kv.rope" || fail "table lacks the SLOT rope region: $out"
echo "$out" | grep -q "^page_bytes_per_block " || fail "table lacks page_bytes_per_block"
out=$("$tierctl" geometry --config '{"compress_ratios":[128,4,0],"num_blocks":2}' --json) \
  || fail "--config exited $?"
[ "$(echo "$out" | field envelope_rows)" = "66" ] || fail "--config envelope_rows"
out=$("$tierctl" geometry --preset v4-nano-fp8 2>&1) && fail "unknown preset accepted"
echo "$out" | grep -q "v4-pro-fp8" || fail "unknown preset does not list the presets: $out"
out=$("$tierctl" geometry --config '{"kv_dtpye":"fp8"}' 2>&1) && fail "unknown key accepted"
echo "$out" | grep -q 'did you mean "kv_dtype"' || fail "no hint for a misspelled key: $out"
out=$("$tierctl" sidecar_key --hash 0x123 --fingerprint 00112233445566778899aabbccddeeff \
  --tp 4/1) || fail "sidecar_key exited $?"
echo "$out" | grep -qx "canonical atom-slot-v1:4:1:0000000000000123:00112233445566778899aabbccddeeff" \
  || fail "sidecar_key canonical: $out"
echo "$out" | grep -qx "atom_storage_hash 10062454250606645" || fail "sidecar_key hash: $out"
echo "ok"
