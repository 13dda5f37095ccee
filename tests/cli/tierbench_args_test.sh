#!/usr/bin/env bash
# tierbench's numeric arguments and sizes (issue 14): numbers past 2^64 - 1, negative numbers and
# junk suffixes are errors (exit 2), never silently capped; counts and sizes whose buffers cannot
# fit in memory are refused with a message before anything is allocated, never an abort.
set -uo pipefail
tierbench=$(realpath "$1") source=$2
fail() { echo "FAIL: $*"; exit 1; }
profile="$source/profiles/cpu.json"

# expect_error EXPECTED-TEXT ARGS...: exit 2 (not a signal, not success) with the text.
expect_error() {
  local want=$1
  shift
  local out rc
  out=$("$tierbench" micro --profile "$profile" --tier cpu "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "micro $* exited $rc (expected 2): $out"
  grep -qF -- "$want" <<<"$out" || fail "micro $*: no \"$want\" in: $out"
}

expect_error 'larger than 2^64 - 1' --objects 18446744073709551616
expect_error 'larger than 2^64 - 1' --objects 99999999999999999999999999
expect_error 'expected an unsigned integer, got "-1"' --objects -1
expect_error 'expected an unsigned integer, got "12x"' --objects 12x
expect_error 'expected an unsigned integer, got "+3"' --depth +3
expect_error 'expected a size like "1MiB" below 16EiB, got "18446744073709551616"' \
  --object-size 18446744073709551616
expect_error 'expected a size like "1MiB" below 16EiB, got "20000000TiB"' --object-size 20000000TiB
expect_error 'got "-4KiB"' --object-size -4KiB
expect_error 'got "1MiBs"' --object-size 1MiBs
expect_error 'more than 2^64 bytes' --objects 18446744073709551615 --object-size 1MiB
expect_error 'of memory, more than' --objects 1000000000000 --object-size 1MiB
expect_error 'larger than 1TiB' --object-size 2TiB
expect_error '--processes: expected 1 to 64, got 0' --processes 1,0
expect_error 'at most 64 unsigned integers, got "99999999999999999999999"' \
  --processes 99999999999999999999999
expect_error '--processes: expected 1 to 64, got 65' --processes 2,65
expect_error '--threads: expected 1 to 1024, got 0' --threads 0
expect_error '--threads: expected 1 to 1024, got 2000' --threads 1,2000

# The largest number that fits is taken exactly (and then refused for its memory, not capped).
expect_error '--objects 18446744073709551615 of' --objects 18446744073709551615

# Issue 26's reproductions: each an exit 2 with a message, not a signal.
expect_exit2() {  # EXPECTED-TEXT COMMAND ARGS...
  local want=$1
  shift
  local out rc
  out=$("$tierbench" "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "$* exited $rc (expected 2): $out"
  grep -qF -- "$want" <<<"$out" || fail "$*: no \"$want\" in: $out"
}
expect_exit2 '--rounds: expected 1 to 1000, got 0' codec --rounds 0
if "$tierbench" help | grep -q '^  tierbench gpu '; then  # a build with the GPU floor
  expect_exit2 '--blocks: expected a comma-separated list' gpu --blocks 1,x
  expect_exit2 '--tier-objects: expected a comma-separated list' gpu --tier-objects 99999999999999999999
  expect_exit2 '--verify-threads: expected 0 to 1024' gpu --verify-threads 5000
fi
expect_exit2 '--threads: expected a comma-separated list' verify --threads 99999999999999999999999
expect_exit2 '--depth: expected 1 to 65536, got 18446744073709551615' \
  micro --profile "$profile" --tier cpu --depth 18446744073709551615
expect_exit2 '--concurrency: expected 1 to 65536' \
  micro --profile "$profile" --tier cpu --concurrency 18446744073709551615

# A tier name from the environment that is not UTF-8 reaches --json as U+FFFD (was: an abort).
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
echo '{"tiers": [{"name": "${TIER_TEST_NAME}", "capacity": "64MiB", "backend": {"type": "cpu"}}]}' \
  > "$tmp/n.json"
out=$(TIER_TEST_NAME=$'cpu\xff' "$tierbench" micro --profile "$tmp/n.json" --tier $'cpu\xff' \
  --objects 4 --object-size 4KiB --rounds 1 --json 2>&1) || fail "micro --json exited $?: $out"
grep -qF '"tier":"cpu'$'\xef\xbf\xbd''"' <<<"$out" || fail "no U+FFFD in: $out"

# A small run still works.
out=$("$tierbench" micro --profile "$profile" --tier cpu --objects 4 --object-size 4KiB \
  --rounds 1 2>&1) || fail "a small micro run exited $?: $out"
# Sizes that are not a multiple of the tier's alignment, down to the header's: every get reads
# back what its put stored (was: 64 and 1000 bytes failed every get, the image shorter than the
# padded buffer stored), sealed, and with each phase's fastest round reported.
for size in 64 1000; do
  out=$("$tierbench" micro --profile "$profile" --tier cpu --objects 4 --object-size $size \
    --rounds 3 --seal --best --json 2>&1) || fail "micro --object-size $size exited $?: $out"
  [ "$(grep -c '"errors":0,' <<<"$out")" -eq 2 ] || fail "micro --object-size $size: $out"
done
# A list of process counts runs each in turn and ends with a table, one row per count.
out=$("$tierbench" micro --profile "$profile" --tier cpu --objects 4 --object-size 4KiB \
  --rounds 1 --processes 1,2 2>&1) || fail "micro --processes 1,2 exited $?: $out"
grep -qE '^ *processes +put GB/s +get GB/s +memcpy GB/s +put/memcpy +get/memcpy$' <<<"$out" ||
  fail "micro --processes 1,2: no table in: $out"
[ "$(grep -cE '^ +[12] +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' <<<"$out")" -eq 2 ] ||
  fail "micro --processes 1,2: not one row per count in: $out"
# --stack: the profile's TierStack saves and loads the same objects on the same tier, its rates
# as ratios to the tier alone; one process, and a profile of one tier.
out=$("$tierbench" micro --profile "$profile" --tier cpu --objects 4 --object-size 4KiB \
  --rounds 3 --best --stack --json 2>&1) || fail "micro --stack exited $?: $out"
[ "$(grep -c '"errors":0,' <<<"$out")" -eq 4 ] || fail "micro --stack: $out"
[ "$(grep -c '"sealed_puts":true' <<<"$out")" -eq 2 ] || fail "micro --stack without sealing: $out"
for op in stack_put stack_get; do
  grep -qE "\"op\":\"$op\",\"ratio_to_tier\":[0-9.]+" <<<"$out" || fail "micro --stack: no $op in: $out"
done
expect_error '--stack runs in one process' --stack --processes 2
echo '{"tiers": [{"name": "a", "capacity": "64MiB", "backend": {"type": "cpu"}},
                 {"name": "b", "capacity": "64MiB", "backend": {"type": "cpu"}}]}' > "$tmp/two.json"
out=$("$tierbench" micro --profile "$tmp/two.json" --tier a --stack 2>&1)
[ $? -eq 2 ] && grep -qF 'with its only tier' <<<"$out" || fail "micro --stack of two tiers: $out"
echo "tierbench arguments behave"
