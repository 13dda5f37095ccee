#!/usr/bin/env bash
# libtier as installed, used only through its installed files (as a third party would):
#  1. `meson install --destdir`; the installed tierctl runs without LD_LIBRARY_PATH (RUNPATH) and
#     loads libtier's own cpu plugin from <libdir>/libtier/plugins for a profile;
#  2. a backend plugin built against the installed headers and libtier.pc loads from a profile;
#  3. every installed header set (one per pkg-config file) compiles and links in a program;
#  4. a third party's backend plugin (tests/install/example_backend.cpp, written from
#     docs/plugins.md) passes the installed conformance suite, tier-conformance, with a `path`
#     option relative to the profile's directory; the suite refuses a capacity below its minimum
#     and reports (exit 3, not a pass) one too large to exercise eviction;
#  5. the installed tierctl lists plugins and prints a plugin's option schema;
#  6. the offload engine runs out of tree with a custom KvLayout (libtier_engine.pc,
#     dense_engine.cpp) and with the DSV4 layout (libtier_dsv4_layout.pc, dsv4_engine.cpp);
#  7. every pkg-config file carries the project's version, tierctl --version says it, and each
#     installed plugin has its option schema beside it, which tierctl check reads.
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
    libtier_sizing) dir=tier/sizing base=. ;;
    libtier_gpu) dir=tier/gpu base=tier/gpu ;;
    libtier_dsv4) dir=tier/dsv4 base=. ;;
    libtier_dsv4_layout) dir=tier/dsv4 base=. ;;
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

# 7. Versions, and the plugins' schemas beside them.
version=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$source/meson.build")
[ -n "$version" ] || { echo "FAIL: no version in meson.build"; exit 1; }
for pc in "$pcdir"/*.pc; do
  got=$(pkg-config --modversion "$(basename "$pc" .pc)")
  [ "$got" = "$version" ] || { echo "FAIL: $pc says version '$got', the project $version"; exit 1; }
done
[ "$("$tierctl" --version)" = "tierctl $version" ] || { echo "FAIL: tierctl --version"; exit 1; }
for so in "$libdir"/libtier/plugins/libtier_*.so; do
  [ -f "${so%.so}.json" ] || { echo "FAIL: no option schema beside $so"; exit 1; }
done
echo '{"tiers": [{"name": "c", "capacity": "1MiB", "backend": {"type": "cpu", "pinnned": true}}]}' \
  > "$work/typo.json"
out=$(env -u TIER_PLUGIN_DIR "$tierctl" check "$work/typo.json" 2>&1) && {
  echo "FAIL: the installed tierctl check passed a misspelt option: $out"; exit 1; }
grep -qF 'did you mean "pinned"?' <<<"$out" || { echo "FAIL: $out"; exit 1; }
echo "every .pc file says version $version; each installed plugin's schema is beside it and read"

bindir=$(dirname "$tierctl")
conformance=$bindir/tier-conformance
[ -x "$conformance" ] || { echo "FAIL: tier-conformance is not installed beside tierctl"; exit 1; }
here=$(dirname "$(realpath "$0")")

# 4. The example plugin, out of tree, proven by the installed conformance suite.
mkdir -p "$work/plugins" "$work/conf" "$work/elsewhere"
g++ -std=c++20 -O1 -fPIC -shared -DTIER_BUILD_AS_PLUGIN -fvisibility=hidden \
  $(pkg-config --cflags libtier) "$here/example_backend.cpp" $(pkg-config --libs libtier) \
  -o "$work/plugins/libtier_backend_files.so"
conf_profile() {  # CAPACITY: a profile whose tier 0 is the example plugin, its store relative
  cat > "$work/conf/profile.json" <<JSON
{"tiers": [{"name": "files", "capacity": "$1", "backend": {"type": "files", "path": "store"}}]}
JSON
}
conform() {  # runs the installed suite from another directory; prints its exit code last
  (cd "$work/elsewhere" && env -u LD_LIBRARY_PATH TIER_PLUGIN_DIR="$work/plugins" \
    "$conformance" "$work/conf/profile.json" "$@" 2>&1; echo "exit $?")
}
conf_profile 16MiB
out=$(conform)
grep -q '^exit 0$' <<<"$out" || { echo "FAIL: the example plugin did not pass:"; echo "$out"; exit 1; }
[ -d "$work/conf/store" ] && [ ! -e "$work/elsewhere/store" ] || {
  echo "FAIL: the relative path option was not taken relative to the profile's directory"; exit 1; }
echo "example plugin built out of tree passes the installed tier-conformance (16MiB tier)"
conf_profile 1MiB
out=$(conform)
grep -q '^exit 2$' <<<"$out" && grep -q 'needs at least' <<<"$out" || {
  echo "FAIL: a capacity below the minimum was not refused up front:"; echo "$out"; exit 1; }
conf_profile 1GiB
out=$(conform)
grep -q '^exit 3$' <<<"$out" && grep -q 'NOT EXERCISED' <<<"$out" || {
  echo "FAIL: a capacity too large to exercise eviction was not reported:"; echo "$out"; exit 1; }
echo "tier-conformance refuses a 1MiB tier (exit 2) and reports a 1GiB one as not exercised (exit 3)"

# 5. Plugins and their option schemas through the installed tierctl.
out=$(env -u LD_LIBRARY_PATH TIER_PLUGIN_DIR="$work/plugins" "$tierctl" plugins)
grep -q "$libdir/libtier/plugins/libtier_backend_cpu.so" <<<"$out" &&
  grep -q "files .*$work/plugins/libtier_backend_files.so\|$work/plugins/libtier_backend_files.so" <<<"$out" || {
  echo "FAIL: tierctl plugins:"; echo "$out"; exit 1; }
out=$(env -u LD_LIBRARY_PATH TIER_PLUGIN_DIR="$work/plugins" "$tierctl" options files)
grep -q "relative to the profile's directory" <<<"$out" || {
  echo "FAIL: tierctl options files:"; echo "$out"; exit 1; }
echo "installed tierctl lists the installed and the external plugins and prints their options"

# 6. The offload engine out of tree: a custom KvLayout, then the DSV4 layout.
for prog in dense_engine:libtier_engine dsv4_engine:libtier_dsv4_layout; do
  src=${prog%%:*} module=${prog##*:}
  g++ -O1 $(pkg-config --cflags "$module") -I"$here" "$here/$src.cpp" \
    $(pkg-config --libs "$module") -Wl,-rpath,"$libdir" -o "$work/$src"
  env -u LD_LIBRARY_PATH -u TIER_PLUGIN_DIR "$work/$src" || { echo "FAIL: $src"; exit 1; }
done
