#!/usr/bin/env bash
# tierctl size as a user runs it (docs/sizing.md): usage errors exit 2 with a message (never a
# signal); a malformed trace names its line; the table, --at and the JSON's shape; the SVG plot;
# the hit ratio equals `tierbench replay`'s on one LRU tier at several capacities; on the real
# trace (when TRACE exists) at 8192 blocks too, and --sample 0.01 stays within the error it states.
#   tierctl_size_test.sh TIERCTL TIERBENCH SOURCE_ROOT TRACE
set -uo pipefail
tierctl=$(realpath "$1") tierbench=$(realpath "$2") source=$3 trace=$4
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT

# Multi-turn conversations sharing a system prompt, like the Mooncake trace, in small.
python3 - "$tmp/small.jsonl" <<'PY'
import json, random, sys
rng = random.Random(3)
live, out, next_id = [], [], 4
for t in range(600):
    if not live or rng.random() < 0.3:
        live.append([0, 1, 2, 3][: rng.randint(1, 4)])
    s = rng.choice(live)
    for _ in range(rng.randint(1, 4)):
        s.append(next_id)
        next_id += 1
    out.append({"timestamp": t, "input_length": 512 * len(s), "output_length": 10,
                "hash_ids": list(s)})
    if rng.random() < 0.1:
        live.remove(s)
with open(sys.argv[1], "w") as f:
    for r in out:
        f.write(json.dumps(r) + "\n")
PY
small=$tmp/small.jsonl

usage_error() {  # MESSAGE ARGS...: exit 2 with MESSAGE on stderr
  local want=$1
  shift
  out=$("$tierctl" size "$@" 2>&1)
  local rc=$?
  [ $rc -eq 2 ] || fail "size $*: exit $rc, expected 2: $out"
  grep -qF -- "$want" <<<"$out" || fail "size $*: expected \"$want\": $out"
}
usage_error "--trace is required"
usage_error "cannot open trace" --trace "$tmp/missing.jsonl"
usage_error "cannot open trace: it is a directory" --trace "$tmp"
for bad in 0 -0.1 1.5 abc nan inf 0.5x ""; do
  usage_error "--sample: expected a rate in (0, 1]" --trace "$small" --sample="$bad"
done
usage_error "--sample: 1e-9 is below the smallest rate" --trace "$small" --sample 1e-9
usage_error '--at: expected an unsigned integer, got "-5"' --trace "$small" --at=-5
usage_error "--at: 99999999999999999999 is larger than 2^64 - 1" --trace "$small" \
  --at 99999999999999999999
usage_error "--block-bytes: expected 1B to 1TiB, got 0B" --trace "$small" --block-bytes 0
usage_error "--block-bytes: expected 1B to 1TiB" --trace "$small" --block-bytes 2TiB
usage_error '--block-bytes: expected a size like "1MiB"' --trace "$small" --block-bytes 1.5x
usage_error "--max-tracked: expected 1 to 4294967296, got 0" --trace "$small" --max-tracked 0
usage_error 'unknown plot format ".jpg"; the file must end in .svg or .png' --trace "$small" \
  --plot "$tmp/mrc.jpg"
usage_error 'unknown plot format ""' --trace "$small" --plot "$tmp/mrc"
usage_error "unknown option --smaple" --trace "$small" --smaple 0.1
usage_error 'unexpected argument "extra"' --trace "$small" extra
[ ! -e "$tmp/mrc.jpg" ] || fail "a refused plot was written"

# Malformed traces: exit 1, the file and line named; memory-bound refusals say what to do.
printf '%s\n' '{"timestamp": 0, "input_length": 1, "hash_ids": [1]}' \
  '{"timestamp": 0, "input_length": 1, "hash_ids": [1, -2]}' > "$tmp/bad.jsonl"
out=$("$tierctl" size --trace "$tmp/bad.jsonl" 2>&1)
[ $? -eq 1 ] && grep -qF "$tmp/bad.jsonl:2: hash_ids/1: expected an unsigned integer" <<<"$out" ||
  fail "malformed trace: $out"
out=$("$tierctl" size --trace "$small" --max-tracked 100 2>&1)
[ $? -eq 1 ] && grep -qF "more than 100 distinct blocks to track" <<<"$out" &&
  grep -qF -- "--sample" <<<"$out" || fail "--max-tracked: $out"

# The table: round sizes, the knee, the saturation.
out=$("$tierctl" size --trace "$small") || fail "size exited $?: $out"
grep -qE '^ +64 +[0-9.]+[KMG]iB +[0-9.]+% +[0-9.]+%' <<<"$out" && grep -qF '<- knee' <<<"$out" &&
  grep -qF '<- every repeat hits' <<<"$out" && grep -qF 'knee: ' <<<"$out" ||
  fail "size table: $out"
out=$("$tierctl" size --trace "$small" --at 100) || fail "size --at exited $?"
grep -qE '^100 blocks \(.*\): hit ratio 0\.[0-9]{6} \(' <<<"$out" || fail "size --at: $out"

# The JSON's shape, and its agreement with the table's ratios.
"$tierctl" size --trace "$small" --json --at 100 --block-bytes 4096 > "$tmp/curve.json" ||
  fail "size --json exited $?"
python3 - "$tmp/curve.json" <<'PY' || fail "size --json: $(head -c 600 "$tmp/curve.json")"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("trace", "requests", "blocks", "tracked_blocks", "exact", "sample_rate", "block_bytes",
          "image_bytes", "max_hit_ratio", "saturation", "knee", "table", "curve", "at"):
    assert k in d, k
assert d["exact"] is True and d["sample_rate"] == 1 and "max_error" not in d
assert d["requests"] == 600 and d["block_bytes"] == 4096 and d["image_bytes"] > 4096
b, h = d["curve"]["blocks"], d["curve"]["hit_ratio"]
assert len(b) == len(h) > 10
assert all(x < y for x, y in zip(b, b[1:])) and all(x < y for x, y in zip(h, h[1:]))
assert b[-1] == d["saturation"]["blocks"] and h[-1] == d["max_hit_ratio"]
def at(c):  # the step function
    r = 0.0
    for x, y in zip(b, h):
        if x <= c:
            r = y
    return r
for row in d["table"] + [d["at"], d["knee"], d["saturation"]]:
    assert set(row) == {"blocks", "bytes", "hit_ratio"}, row
    assert row["hit_ratio"] == at(row["blocks"]), row
    assert row["bytes"] == row["blocks"] * d["image_bytes"], row
assert d["at"]["blocks"] == 100
PY

# The SVG plot: well-formed, the curve drawn, the knee and --at marked.
out=$("$tierctl" size --trace "$small" --at 100 --plot "$tmp/mrc.svg") || fail "--plot svg: $out"
python3 - "$tmp/mrc.svg" <<'PY' || fail "the SVG plot"
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg"
lines = root.findall(ns + "polyline")
assert len(lines) == 1 and len(lines[0].get("points").split()) > 100
texts = " ".join(t.text or "" for t in root.iter(ns + "text"))
assert "knee:" in texts and "100 blocks" in texts and "miss ratio" in texts, texts
PY
out=$("$tierctl" size --trace "$small" --plot "$tmp/no/such/dir/mrc.svg" 2>&1)
[ $? -eq 1 ] && grep -qF "cannot write" <<<"$out" || fail "--plot into a missing folder: $out"

# The replay's hit ratio on one LRU tier of C blocks (capacity floor(bytes / image) == C) equals
# tierctl size's at C.
agree() {  # TRACE CAPACITY-BLOCKS
  local json image bytes want got
  json=$("$tierctl" size --trace "$1" --block-bytes 4096 --at "$2" --json) || fail "size exited $?"
  image=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["image_bytes"])' <<<"$json")
  want=$(python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["at"]["hit_ratio"]))' <<<"$json")
  bytes=$(($2 * image + image - 1))
  got=$(TIER_CPU_CAPACITY=$bytes "$tierbench" replay --json --block-bytes 4096 \
    --profile "$source/profiles/cpu.json" --trace "$1" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(repr(d["hit_rate"]), d["tiers"]["cpu"]["capacity_objects"])') ||
    fail "tierbench replay failed"
  [ "$got" = "$want $2" ] || fail "$1 at $2 blocks: replay (hit rate, capacity) $got, size $want"
  echo "$(basename "$1") at $2 blocks: replay and size agree, hit ratio $want"
}
for c in 1 5 40 300 1000; do agree "$small" $c; done

if [ ! -f "$trace" ]; then
  echo "no $trace: the real trace's checks skipped"
  exit 0
fi
agree "$trace" 8192
# --sample 0.01 within the error it states, at every row of the table.
"$tierctl" size --trace "$trace" --json > "$tmp/exact.json" || fail "size exited $?"
"$tierctl" size --trace "$trace" --json --sample 0.01 > "$tmp/sampled.json" || fail "size exited $?"
python3 - "$tmp/exact.json" "$tmp/sampled.json" <<'PY' || fail "--sample 0.01 outside its error"
import json, sys
exact, sampled = (json.load(open(p)) for p in sys.argv[1:])
assert sampled["exact"] is False and abs(sampled["sample_rate"] - 0.01) < 1e-6
b, h = exact["curve"]["blocks"], exact["curve"]["hit_ratio"]
def at(c):
    r = 0.0
    for x, y in zip(b, h):
        if x <= c:
            r = y
    return r
worst = 0
for row in sampled["table"]:
    err = abs(row["hit_ratio"] - at(row["blocks"]))
    assert err <= row["error"], (row, at(row["blocks"]))
    worst = max(worst, err)
print("--sample 0.01: largest error %.4f, largest stated %.4f" % (worst, sampled["max_error"]))
PY
