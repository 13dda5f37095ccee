#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, coverage on libtier too) in their own
# build directory and runs each for SECONDS on a scratch copy of its seed corpus.
#   tests/fuzz/run_fuzzers.sh SOURCE_ROOT BUILD_DIR SECONDS
# Exits 77 (skip) when clang or libFuzzer is missing; nonzero when a target finds a crash, which
# libFuzzer saves as crash-* in the scratch directory it prints.
set -euo pipefail
src=$(realpath "$1")
build=$(realpath -m "$2")
seconds=${3:-4}
targets=(aos1 capi engine_wire object_header profile)

if ! command -v clang++ >/dev/null; then
  echo "clang++ not found: install clang (and libclang-rt-dev) to fuzz"; exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$probe/p.cpp"
if ! clang++ -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2>/dev/null; then
  echo "clang++ cannot link libFuzzer: install libclang-rt-dev"; exit 77
fi

if [ ! -f "$build/build.ninja" ]; then
  CXX=clang++ CC=clang meson setup "$build" "$src" -Dfuzz=enabled -Dbuildtype=plain \
    -Db_sanitize=address,undefined -Db_lundef=false -Dcpp_args='-O1 -g -fsanitize=fuzzer-no-link' \
    -Dio_uring=disabled -Dredis=disabled -Dgpu=disabled >"$probe/setup.log" 2>&1 \
    || { cat "$probe/setup.log"; exit 1; }
fi
fuzzers=()
for t in "${targets[@]}"; do fuzzers+=("tests/fuzz/${t}_fuzzer"); done
# The capi target loads the cpu plugin (built with the same sanitizers).
ninja -C "$build" -j2 "${fuzzers[@]}" libtier/plugins/libtier_backend_cpu.so >"$probe/build.log" 2>&1 ||
  { tail -50 "$probe/build.log"; exit 1; }
export TIER_PLUGIN_DIR="$build/libtier/plugins"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  rm -rf "$work" && mkdir -p "$work/corpus"
  cp "$src/tests/fuzz/corpus/$t"/* "$work/corpus/"
  echo "== $t: ${seconds}s"
  if ! (cd "$work" && "$build/tests/fuzz/${t}_fuzzer" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 corpus >fuzz.log 2>&1); then
    tail -40 "$work/fuzz.log"
    echo "== $t FAILED; reproducer in $work"
    status=1
  else
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/fuzz.log" | tail -2
  fi
done
exit $status
