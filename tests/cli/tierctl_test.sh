#!/usr/bin/env bash
# tierctl as a user runs it: exit codes and messages of check, explain, schema and key.
set -uo pipefail
tierctl=$(realpath "$1") source=$2
fail() { echo "FAIL: $*"; exit 1; }

out=$("$tierctl" check "$source/profiles/cpu.json" 2>&1) || fail "check of a valid profile exited $?: $out"
grep -q "ok (1 tier)" <<<"$out" || fail "unexpected check output: $out"

out=$("$tierctl" check "$source/tests/cli/bad_profile.json" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "check of a bad profile exited $rc, expected 1"
grep -qF '/tiers/0/backend/mdoe: unknown option "mdoe"; did you mean "mode"?' <<<"$out" || fail "$out"
grep -qF '/tiers/1/capacity: expected a size like "64GiB", got -3' <<<"$out" || fail "$out"
grep -qF '2 errors' <<<"$out" || fail "$out"

out=$("$tierctl" explain --json "$source/profiles/cpu.json") || fail "explain exited $?"
grep -q '"capacity": "4GiB"' <<<"$out" || fail "explain does not show the default capacity: $out"
out=$(TIER_CPU_CAPACITY=3GiB "$tierctl" explain "$source/profiles/cpu.json") || fail "explain exited $?"
grep -q 'capacity 3GiB' <<<"$out" || fail "explain ignores TIER_CPU_CAPACITY: $out"

out=$("$tierctl" schema) || fail "schema exited $?"
grep -qF '"name": "capacity"' <<<"$out" || fail "schema does not list the tier keys: $out"
grep -qF '"name": "op_timeout"' <<<"$out" || fail "schema does not list the stack options: $out"

out=$("$tierctl" key --namespace '{"model":"deepseek-v4-pro","layout_version":1,"kv_dtype":"fp8","block_size":256,"chunk_size":256,"tp_size":8}' --tokens 1,2,3,4,5,6,7,8 --chunk 4) || fail "key exited $?"
grep -q 'namespace 6fe91321d1cb766be97f553a73bcd7f3' <<<"$out" || fail "$out"
grep -q 'chunk 1 tokens \[4, 8) key 9d2bcacea2eb4ce4329f22197e47b870' <<<"$out" || fail "$out"

"$tierctl" key --namespace '{' --tokens 1 >/dev/null 2>&1 && fail "key accepted invalid JSON"
"$tierctl" nonsense >/dev/null 2>&1 && fail "an unknown command succeeded"
# plugins / options: where each plugin comes from, and every option of the disk tier with its doc.
out=$("$tierctl" plugins) || fail "plugins exited $?"
grep -q '^backend  cpu ' <<<"$out" && grep -q 'from .*libtier_backend_cpu.so' <<<"$out" &&
  grep -q '^codec    identity .*' <<<"$out" || fail "plugins: $out"
if grep -q '^backend  disk ' <<<"$out"; then
  out=$("$tierctl" options disk) || fail "options disk exited $?"
  for o in path region_size block_size queue_depth durable lock_timeout preallocate mode; do
    grep -q "^  $o (" <<<"$out" || fail "options disk lacks $o: $out"
  done
  grep -q 'directory of the store' <<<"$out" || fail "options disk lacks the docs: $out"
  # A relative path option is taken from the profile's directory, after ${VAR} expansion.
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  echo '{"tiers": [{"name": "d", "capacity": "1GiB",
    "backend": {"type": "disk", "path": "${TIER_REL:-store}/x"}}]}' > "$tmp/p.json"
  out=$(cd / && "$tierctl" explain --json "$tmp/p.json") || fail "explain exited $?"
  grep -qF "\"path\": \"$tmp/store/x\"" <<<"$out" || fail "relative path not anchored: $out"
  out=$(cd / && TIER_REL=/abs "$tierctl" explain --json "$tmp/p.json") || fail "explain exited $?"
  grep -qF '"path": "/abs/x"' <<<"$out" || fail "absolute path changed: $out"
fi
"$tierctl" options nonsense >/dev/null 2>&1 && fail "options of an unknown plugin succeeded"

echo "tierctl behaves"
