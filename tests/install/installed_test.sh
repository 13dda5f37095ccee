#!/usr/bin/env bash
# libtier as installed, used only through its installed files (as a third party would):
#  1. `meson install --destdir`; the installed tierctl runs without LD_LIBRARY_PATH (RUNPATH) and
#     loads libtier's own cpu plugin from <libdir>/libtier/plugins for a profile;
#  2. a backend plugin built against the installed headers and libtier.pc loads from a profile;
#  3. every installed header set (one per pkg-config file) compiles and links in a program.
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d /tmp/libtier-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

meson install -C "$build" --destdir "$root" --quiet >/dev/null
pcdir=$(find "$root" -name libtier.pc -printf '%h\n' | head -1)
export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$root
tierctl=$(find "$root" -type f -name tierctl | head -1)
libdir=$root$(PKG_CONFIG_SYSROOT_DIR= pkg-config --variable=libdir libtier)

# 1. The installed program finds its libraries and plugins relative to itself.
out=$(env -u LD_LIBRARY_PATH -u TIER_PLUGIN_DIR "$tierctl" explain "$source/profiles/cpu.json")
grep -q "backend cpu ($libdir/libtier/plugins/libtier_backend_cpu.so)" <<<"$out" || {
  echo "FAIL: the installed tierctl did not load the installed cpu plugin:"; echo "$out"; exit 1; }
echo "installed tierctl runs without LD_LIBRARY_PATH and loads $libdir/libtier/plugins/libtier_backend_cpu.so"

# 2. A third party's backend plugin, built against the installed files only.
g++ -O1 -fPIC -shared -DTIER_BUILD_AS_PLUGIN -fvisibility=hidden $(pkg-config --cflags libtier) \
  "$source/tests/plugins/mock_backend_plugin.cpp" $(pkg-config --libs libtier) \
  -o "$work/libtier_backend_mock.so"
cat > "$work/profile.json" <<JSON
{"plugins": ["$work/libtier_backend_mock.so"],
 "tiers": [{"name": "ext", "capacity": "1MiB", "backend": {"type": "mock"}}]}
JSON
out=$("$tierctl" explain "$work/profile.json")
grep -q "backend mock ($work/libtier_backend_mock.so)" <<<"$out" || {
  echo "FAIL: the external plugin did not load:"; echo "$out"; exit 1; }
echo "external plugin built against the installed headers loads from a profile"

# 3. Each installed header set in a program of its own, compiled and linked against its .pc only.
includedir=$root$(PKG_CONFIG_SYSROOT_DIR= pkg-config --variable=includedir libtier)
checked=0
for pc in "$pcdir"/*.pc; do
  module=$(basename "$pc" .pc)
  case $module in  # where the set's headers are, and the include root its cflags name
    libtier) dir=tier base=. ;;
    libtier_engine) dir=tier/engine base=. ;;
    libtier_gpu) dir=tier/gpu base=tier/gpu ;;
    libtier_dsv4) dir=tier/dsv4/dsv4 base=tier/dsv4 ;;
    libtier_dsv4_layout) dir=tier/dsv4/dsv4/layout base=tier/dsv4 ;;
    libtier_c)  # the C API: its one header, compiled as C
      printf '#include "tier/tier.h"\nint main(void) { return tier_abi_version() == TIER_C_ABI_VERSION ? 0 : 1; }\n' > "$work/$module.c"
      gcc -std=c99 -Wall -Werror $(pkg-config --cflags "$module") "$work/$module.c" \
        $(pkg-config --libs "$module") -Wl,-rpath,"$libdir" -o "$work/$module" ||
        { echo "FAIL: $module's header as C"; exit 1; }
      "$work/$module"
      echo "$module: tier/tier.h compiles as C and links"
      checked=$((checked + 1))
      continue ;;
    *) echo "FAIL: unexpected pkg-config file $pc"; exit 1 ;;
  esac
  tu=$work/$module.cpp
  : > "$tu"
  for h in "$includedir/$dir"/*.hpp; do
    echo "#include \"$(realpath --relative-to="$includedir/$base" "$h")\"" >> "$tu"
  done
  echo 'int main() { return 0; }' >> "$tu"
  g++ -O0 $(pkg-config --cflags "$module") "$tu" $(pkg-config --libs "$module") \
    -Wl,-rpath,"$libdir" -o "$work/$module" || { echo "FAIL: $module's headers"; cat "$tu"; exit 1; }
  "$work/$module"
  echo "$module: $(grep -c include "$tu") installed headers compile and link"
  checked=$((checked + 1))
done
[ "$checked" -ge 4 ] || { echo "FAIL: only $checked pkg-config files installed"; exit 1; }
