#!/usr/bin/env bash
# The AMD build (issue 23): configures BUILD-hip-check with -Dgpu=hip (Debian's hipcc, the
# default targets gfx90a and gfx940) and builds every target of it, so a break that only HIP sees
# (a CUDA-only intrinsic, a host-only header in a device compile, a link error against
# libamdhip64) fails `make test`. Then checks what it built: libtier_gpu links libamdhip64 and
# carries a code object for each target, and a GPU test program exits 77 (SKIP) on a machine
# without an AMD GPU, or passes on one that has it.
#   tests/build/hip_build_test.sh SOURCE_ROOT BUILD_DIR
# The directory sits beside BUILD_DIR, not in it: at the same depth every compile command reads
# the same, so ccache serves the host objects the main build compiled and the HIP objects of its
# check (hip/meson.build); a first run on a cold cache compiles the whole tree once more.
# Options the objects depend on (buildtype, static_plugins) are taken from BUILD_DIR.
# Exits 77 when hipcc or libamdhip64 is missing.
set -euo pipefail
# (grep without -q: under pipefail an early exit of grep -q can fail the pipeline with SIGPIPE.)
src=$(realpath "$1")
main=$(realpath "$2")
dir="$main-hip-check"

if ! command -v hipcc >/dev/null; then
  echo "hipcc not found: .ci/install-deps installs Debian's hipcc, libamdhip64-dev, rocm-device-libs"
  exit 77
fi
if ! ldconfig -p | grep 'libamdhip64\.so ' >/dev/null; then
  echo "libamdhip64.so not found: install libamdhip64-dev"
  exit 77
fi

option() {  # NAME: its value in the main build
  meson introspect --buildoptions "$main" |
    python3 -c "import json,sys; print([o['value'] for o in json.load(sys.stdin) if o['name']=='$1'][0])"
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
opts=(-Dgpu=hip -Dbuildtype="$(option buildtype)" -Dstatic_plugins="$(option static_plugins)")
if [ -f "$dir/build.ninja" ]; then
  meson configure "$dir" "${opts[@]}" >"$log" 2>&1 || { cat "$log"; exit 1; }
else
  rm -rf "$dir"
  meson setup "$dir" "$src" --wrap-mode=nofallback "${opts[@]}" >"$log" 2>&1 ||
    { cat "$log"; exit 1; }
fi
start=$(date +%s)
ninja -C "$dir" -j2 >"$log" 2>&1 || { tail -60 "$log"; exit 1; }
echo "== built $dir in $(( $(date +%s) - start ))s"

status=0
lib=$(ls "$dir"/hip/libtier_gpu.so.*.*.* | head -1)
if readelf -d "$lib" | grep 'NEEDED.*libamdhip64' >/dev/null; then
  echo "== $(basename "$lib") links libamdhip64"
else
  echo "FAIL: $(basename "$lib") does not link libamdhip64"; status=1
fi
# The code objects in the offload bundle of each HIP object (roc-obj-ls lists them per target).
for target in gfx90a gfx940; do
  if roc-obj-ls "$lib" | grep "hipv4-amdgcn-amd-amdhsa--$target" >/dev/null; then
    echo "== $(basename "$lib") carries a code object for $target"
  else
    echo "FAIL: no $target code object in $(basename "$lib")"; status=1
  fi
done

# The GPU test programs skip without an AMD GPU (and run where there is one).
set +e
"$dir/tests/unit/gpu_test" >"$log" 2>&1
rc=$?
set -e
case $rc in
  77) echo "== gpu_test: SKIP (no AMD GPU here), as expected" ;;
  0) echo "== gpu_test passed on an AMD GPU" ;;
  *) tail -40 "$log"; echo "FAIL: gpu_test exited $rc"; status=1 ;;
esac
exit $status
