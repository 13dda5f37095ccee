#!/usr/bin/env bash
# The reference check passes on the tree, and fails on a tree whose comments name a file that
# does not exist and whose docs state another plugin ABI version.
set -euo pipefail
source=$1
check="$source/tests/floors/check_refs.py"
python3 "$check" "$source"
work=$(mktemp -d /tmp/libtier-refs.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/libtier/include/tier" "$work/libtier/src" "$work/docs"
cp "$source/libtier/include/tier/plugin.h" "$work/libtier/include/tier/"
sed 's/ABI version is [0-9]*/ABI version is 99/' "$source/docs/plugins.md" > "$work/docs/plugins.md"
printf '// Moves bytes (see libtier/src/gone.hpp and lost_name.cpp).\nint x;\n' > "$work/libtier/src/x.cpp"
git -C "$work" init -q && git -C "$work" add -A
if out=$(python3 "$check" "$work"); then
  echo "FAIL: the check accepted stale references"; exit 1
fi
for want in 'libtier/src/x.cpp:1: names libtier/src/gone.hpp' 'names lost_name.cpp' \
            'says the ABI version is 99'; do
  grep -q "$want" <<<"$out" || { echo "FAIL: no report of '$want' in: $out"; exit 1; }
done
echo "stale references refused: $(wc -l <<<"$out") lines"
