#!/usr/bin/env bash
# The core library exports the tier namespace and the C plugin ABI only: no backend, codec,
# engine or GPU symbol, nothing of fmt, nlohmann or libstdc++ instantiations, and it links no GPU
# runtime or backend dependency.
set -euo pipefail
lib=$1
syms=$(nm -D --defined-only -C "$lib" | awk '$2 ~ /^[TWDRBVu]$/ { $1 = ""; $2 = ""; print substr($0, 3) }')
count=$(wc -l <<<"$syms")
bad=$(grep -E 'tier::(cpu|disk|redis|gpu|dsv4|zstd|engine)::|^(fmt|nlohmann|std)::|cuda|hip[A-Z]|io_uring|boost::' <<<"$syms" || true)
if [ -n "$bad" ]; then
  echo "FAIL: $lib exports symbols above the core:"; head -20 <<<"$bad"; exit 1
fi
other=$(grep -vE '^(tier::|tier_|typeinfo for tier::|typeinfo name for tier::|vtable for tier::|VTT for tier::|guard variable for tier::|(non-)?virtual thunk to tier::|_init$|_fini$|_edata$|_end$|__bss_start$|TIER_)' <<<"$syms" || true)
if [ -n "$other" ]; then
  echo "FAIL: $lib exports symbols outside the tier namespace:"; head -20 <<<"$other"; exit 1
fi
needed=$(readelf -d "$lib" | awk '/NEEDED/ { print $5 }' | tr -d '[]')
if grep -E 'cuda|amdhip|uring|zstd|boost' <<<"$needed"; then
  echo "FAIL: $lib links a dependency above the core"; exit 1
fi
echo "$lib: $count exported symbols, all tier:: or tier_*; needs: $(tr '\n' ' ' <<<"$needed")"
