#!/usr/bin/env bash
# The core library links no GPU runtime and no backend's dependency (io_uring, zstd, Boost): those
# belong to the floors above it. What it exports is the exports_libtier test's (libtier.map).
set -euo pipefail
lib=$1
needed=$(readelf -d "$lib" | awk '/NEEDED/ { print $5 }' | tr -d '[]')
if grep -E 'cuda|amdhip|uring|zstd|boost' <<<"$needed"; then
  echo "FAIL: $lib links a dependency above the core"; exit 1
fi
echo "$lib needs: $(tr '\n' ' ' <<<"$needed")"
