#!/usr/bin/env bash
# tierctl as a user runs it: exit codes and messages of check, explain, schema and key.
#   tierctl_test.sh TIERCTL SOURCE_ROOT CTOR_MARKER_PLUGIN
set -uo pipefail
tierctl=$(realpath "$1") source=$2 ctor_plugin=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT

out=$("$tierctl" check "$source/profiles/cpu.json" 2>&1) || fail "check of a valid profile exited $?: $out"
grep -q "ok (1 tier)" <<<"$out" || fail "unexpected check output: $out"

# Without --load-plugins the options of the built-in plugins are checked all the same, against
# the schema installed beside each (libtier_backend_cpu.json), without loading it.
out=$("$tierctl" check "$source/tests/cli/bad_profile.json" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "check of a bad profile exited $rc, expected 1"
grep -qF '/tiers/0/backend/mdoe: unknown option "mdoe"; did you mean "mode"?' <<<"$out" || fail "$out"
grep -qF '/tiers/1/capacity: expected a size like "64GiB", got -3' <<<"$out" || fail "$out"
grep -qF 'not checked' <<<"$out" && fail "check left options unchecked: $out"
# Issue 25's typo: a backend option misspelt, found without loading the plugin.
echo '{"tiers": [{"name": "c", "capacity": "1MiB", "backend": {"type": "cpu", "pinnned": true}}]}' \
  > "$tmp/typo.json"
out=$("$tierctl" check "$tmp/typo.json" 2>&1)
[ $? -eq 1 ] && grep -qF '/tiers/0/backend/pinnned: unknown option "pinnned"; did you mean "pinned"?' <<<"$out" ||
  fail "check of a misspelt option: $out"
plugins=$(dirname "$tierctl")/../../libtier/plugins
shopt -s nullglob
for so in "$plugins"/libtier_*.so; do  # every built-in plugin has its schema beside it
  [ -f "${so%.so}.json" ] || fail "no schema beside $so"
done
echo '{"tiers": [{"name": "d", "capacity": "1MiB", "backend": {"type": "disk", "path": "x", "queue_dpeth": 8}},
  {"name": "c", "capacity": "1MiB", "backend": "cpu", "stage": {"type": "zstd", "levle": 3}}]}' > "$tmp/typo2.json"
out=$("$tierctl" check "$tmp/typo2.json" 2>&1)
[ $? -eq 1 ] && grep -qF '/tiers/0/backend/queue_dpeth: unknown option' <<<"$out" &&
  grep -qF '/tiers/1/stage/levle: unknown option "levle"; did you mean "level"?' <<<"$out" ||
  fail "check of misspelt disk and zstd options: $out"
# A malformed schema beside a plugin is an error naming it, not a pass (the plugin is a copy of the
# cpu plugin's file under another name: it is never loaded).
if [ -f "$plugins/libtier_backend_cpu.so" ]; then
  mkdir -p "$tmp/plugins" && cp "$plugins/libtier_backend_cpu.so" "$tmp/plugins/libtier_backend_cpux.so"
  echo '[{"name": 3}]' > "$tmp/plugins/libtier_backend_cpux.json"
  echo '{"tiers": [{"name": "c", "capacity": "1MiB", "backend": "cpux"}]}' > "$tmp/cpux.json"
  out=$(TIER_PLUGIN_DIR=$tmp/plugins "$tierctl" check "$tmp/cpux.json" 2>&1)
  [ $? -eq 1 ] && grep -qF "libtier_backend_cpux.json: not an option schema" <<<"$out" ||
    fail "check with a malformed schema: $out"
fi

# The metrics endpoint and the log level a profile asks for, in explain.
echo '{"metrics": {"listen": "localhost:0"}, "log": {"level": "info"},
  "tiers": [{"name": "c", "capacity": "1MiB", "backend": "cpu"}]}' > "$tmp/metrics.json"
out=$("$tierctl" explain "$tmp/metrics.json") || fail "explain exited $?: $out"
grep -qF 'metrics: GET http://127.0.0.1:0/metrics' <<<"$out" && grep -qF 'log level: info' <<<"$out" ||
  fail "explain of metrics and log: $out"

# --version, and a mistyped command gets the nearest one, not the whole usage.
out=$("$tierctl" --version) || fail "--version exited $?"
grep -qE '^tierctl [0-9]+\.[0-9]+\.[0-9]+$' <<<"$out" || fail "--version: $out"
out=$("$tierctl" chek profiles/cpu.json 2>&1)
[ $? -eq 2 ] && grep -qF 'unknown command "chek"; did you mean "check"?' <<<"$out" ||
  fail "mistyped command: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] || fail "a mistyped command printed more than one line: $out"
out=$("$tierctl" zzzzzz 2>&1)
[ $? -eq 2 ] && grep -qF 'the commands are: ' <<<"$out" || fail "unknown command: $out"
out=$("$tierctl" check --load-plugins "$source/tests/cli/bad_profile.json" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "check --load-plugins of a bad profile exited $rc, expected 1"
grep -qF '/tiers/0/backend/mdoe: unknown option "mdoe"; did you mean "mode"?' <<<"$out" || fail "$out"
grep -qF '/tiers/1/capacity: expected a size like "64GiB", got -3' <<<"$out" || fail "$out"
grep -qF '2 errors' <<<"$out" || fail "$out"

# check runs no plugin code unless asked: the plugin's ELF constructor creates $TIER_TEST_MARKER.
export TIER_TEST_MARKER=$tmp/marker
ctor_profile() {  # OPTIONS of the ctor_marker backend
  cat > "$tmp/ctor.json" <<JSON
{"plugins": ["$ctor_plugin"],
 "tiers": [{"name": "t", "capacity": "1MiB", "backend": {"type": "ctor_marker"$1}}]}
JSON
}
ctor_profile ', "levle": 3'
out=$("$tierctl" check "$tmp/ctor.json" 2>&1) || fail "check exited $?: $out"
[ ! -e "$TIER_TEST_MARKER" ] || fail "check loaded the profile's plugin (its constructor ran)"
grep -qF "/plugins/0: plugin $ctor_plugin not loaded" <<<"$out" &&
  grep -qF '/tiers/0/backend: backend "ctor_marker" is not registered; it may come from' <<<"$out" &&
  grep -qF 'ok (1 tier); plugins not loaded' <<<"$out" || fail "check: $out"
out=$("$tierctl" check --load-plugins "$tmp/ctor.json" 2>&1)
[ $? -eq 1 ] || fail "check --load-plugins accepted an unknown option: $out"
[ -e "$TIER_TEST_MARKER" ] || fail "check --load-plugins did not load the profile's plugin"
grep -qF '/tiers/0/backend/levle: unknown option "levle"; did you mean "level"?' <<<"$out" ||
  fail "check --load-plugins: $out"
rm -f "$TIER_TEST_MARKER"
ctor_profile ', "level": 3'
out=$("$tierctl" check --load-plugins "$tmp/ctor.json" 2>&1) || fail "check --load-plugins exited $?: $out"
grep -qF 'ok (1 tier)' <<<"$out" && [ -e "$TIER_TEST_MARKER" ] || fail "check --load-plugins: $out"
# A plugin that is not there is an error without loading anything; so is an unknown type.
sed -i "s|$ctor_plugin|$tmp/missing.so|" "$tmp/ctor.json"
out=$("$tierctl" check "$tmp/ctor.json" 2>&1)
[ $? -eq 1 ] && grep -qF "/plugins/0: plugin \"$tmp/missing.so\" not found" <<<"$out" ||
  fail "check of a missing plugin: $out"
echo '{"tiers": [{"name": "t", "capacity": "1MiB", "backend": "cpuu"}]}' > "$tmp/unknown.json"
out=$("$tierctl" check "$tmp/unknown.json" 2>&1)
[ $? -eq 1 ] && grep -qF '/tiers/0/backend: unknown backend "cpuu" (did you mean "cpu"?)' <<<"$out" ||
  fail "check of an unknown backend: $out"
unset TIER_TEST_MARKER

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
  echo '{"tiers": [{"name": "d", "capacity": "1GiB",
    "backend": {"type": "disk", "path": "${TIER_REL:-store}/x"}}]}' > "$tmp/p.json"
  out=$(cd / && "$tierctl" explain --json "$tmp/p.json") || fail "explain exited $?"
  grep -qF "\"path\": \"$tmp/store/x\"" <<<"$out" || fail "relative path not anchored: $out"
  out=$(cd / && TIER_REL=/abs "$tierctl" explain --json "$tmp/p.json") || fail "explain exited $?"
  grep -qF '"path": "/abs/x"' <<<"$out" || fail "absolute path changed: $out"
fi
"$tierctl" options nonsense >/dev/null 2>&1 && fail "options of an unknown plugin succeeded"

# Secrets are redacted in every form of explain (issue 26: the text form printed them).
if grep -q '^backend  redis ' <<<"$("$tierctl" plugins)"; then
  echo '{"tiers": [{"name": "r", "capacity": "1GiB", "backend": {"type": "redis",
    "url": "redis://alice:urlsecret@127.0.0.1:1/0", "password": "optsecret"}}]}' > "$tmp/r.json"
  for form in "" --json; do
    out=$("$tierctl" explain $form "$tmp/r.json" 2>&1) || fail "explain $form exited $?: $out"
    grep -q 'secret' <<<"$out" && fail "explain $form prints a secret: $out"
    grep -qF '(redacted)' <<<"$out" || fail "explain $form: no (redacted): $out"
  done
fi

# A tier name from the environment that is not UTF-8 (issue 26: explain --json aborted on an
# uncaught nlohmann type_error): written as U+FFFD.
echo '{"tiers": [{"name": "${TIER_TEST_NAME}", "capacity": "1GiB", "backend": {"type": "cpu"}}]}' \
  > "$tmp/n.json"
out=$(TIER_TEST_NAME=$'cpu\xff' "$tierctl" explain --json "$tmp/n.json" 2>&1)
[ $? -eq 0 ] || fail "explain --json of a non-UTF-8 name exited $?: $out"
grep -qF '"name": "cpu'$'\xef\xbf\xbd''"' <<<"$out" || fail "no U+FFFD in: $out"

# A FIFO named as a plugin is refused, never opened (dlopen would block for ever).
mkfifo "$tmp/plugin.so"
echo "{\"plugins\": [\"$tmp/plugin.so\"], \"tiers\": [{\"name\": \"c\", \"capacity\": \"1MiB\",
  \"backend\": {\"type\": \"cpu\"}}]}" > "$tmp/fifo.json"
out=$(timeout 20 "$tierctl" check --load-plugins "$tmp/fifo.json" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "check --load-plugins of a FIFO plugin exited $rc: $out"
grep -qF 'not a regular file' <<<"$out" || fail "FIFO plugin: $out"

# Deep nesting in --namespace is an error, not a stack overflow (issue 26; 20,000 levels: one
# argument may hold at most 128 KiB).
deep=$(printf '[%.0s' $(seq 20000))$(printf ']%.0s' $(seq 20000))
out=$("$tierctl" key --namespace "$deep" --tokens 1 2>&1)
[ $? -eq 2 ] || fail "key of a deep namespace: $out"
grep -qF 'deeper than 64 levels' <<<"$out" || fail "key of a deep namespace: $out"

echo "tierctl behaves"
