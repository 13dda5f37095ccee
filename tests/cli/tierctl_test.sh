#!/usr/bin/env bash
# tierctl as a user runs it: exit codes and messages of check, explain, schema and key.
set -uo pipefail
tierctl=$1 source=$2
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
echo "tierctl behaves"
