#!/usr/bin/env bash
# Installs libtier into a scratch prefix, builds a backend plugin against the installed headers
# and pkg-config file only (as a third party would), and loads it from a profile with tierctl.
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d /tmp/libtier-install.XXXXXX)
trap 'rm -rf "$work"' EXIT

meson install -C "$build" --destdir "$work/root" --quiet >/dev/null
prefix=$(find "$work/root" -name libtier.pc -printf '%h\n' | head -1)
export PKG_CONFIG_PATH=$prefix
sysroot_prefix=$(pkg-config --variable=prefix libtier)
cflags=$(pkg-config --cflags libtier | sed "s|-I$sysroot_prefix|-I$work/root$sysroot_prefix|g")
libdir=$work/root$(pkg-config --variable=libdir libtier)

g++ -std=c++20 -O1 -fPIC -shared -DTIER_BUILD_AS_PLUGIN -fvisibility=hidden $cflags \
  "$source/tests/plugins/mock_backend_plugin.cpp" -L"$libdir" -ltier \
  -o "$work/libtier_backend_mock.so"

cat > "$work/profile.json" <<JSON
{"plugins": ["$work/libtier_backend_mock.so"],
 "tiers": [{"name": "ext", "capacity": "1MiB", "backend": {"type": "mock"}}]}
JSON
out=$(LD_LIBRARY_PATH=$libdir "$build/apps/tierctl/tierctl" explain "$work/profile.json")
echo "$out"
grep -q "backend mock ($work/libtier_backend_mock.so)" <<<"$out"
echo "external plugin built against the installed headers loads from a profile"
