#!/usr/bin/env bash
# One source for option docs: every backend and codec README's option table is the output of
# `tierctl options NAME --markdown` (the plugin's schema), kept between the lines
#   <!-- tierctl options NAME --markdown -->
#   <!-- end options -->
# This test fails when a table differs from the schema, or when a backend README has no
# generated table. To regenerate: run the command and paste its output between the markers.
#   option_tables_test.sh TIERCTL SOURCE [--absent NAME]...
# --absent NAME: this build has no plugin NAME (the gpu backend without a GPU compiler): its
# table is not checked here (and is, in every build that has it).
set -euo pipefail
tierctl=$1 source=$2
shift 2
absent=" "
while [ $# -gt 0 ]; do
  [ "$1" = --absent ] && [ $# -ge 2 ] || { echo "usage: $0 TIERCTL SOURCE [--absent NAME]..."; exit 2; }
  absent+="$2 "
  shift 2
done
failed=0 checked=0 skipped=0
for readme in "$source"/backends/*/README.md "$source"/codecs/*/README.md; do
  rel=${readme#"$source"/}
  names=$(sed -n 's/^<!-- tierctl options \([A-Za-z0-9_-]*\) --markdown -->$/\1/p' "$readme")
  if [ -z "$names" ]; then
    case $rel in
      backends/*) echo "FAIL: $rel has no generated option table"; failed=1 ;;
    esac
    continue
  fi
  for name in $names; do
    if [[ "$absent" == *" $name "* ]]; then
      skipped=$((skipped + 1))
      continue
    fi
    expected=$("$tierctl" options "$name" --markdown) || {
      echo "FAIL: $rel: tierctl options $name failed"; failed=1; continue; }
    actual=$(awk -v start="<!-- tierctl options $name --markdown -->" \
      '$0 == start {on = 1; next} on && $0 == "<!-- end options -->" {exit} on {print}' "$readme")
    if [ "$expected" != "$actual" ]; then
      echo "FAIL: $rel: the option table of $name differs from its schema:"
      diff <(echo "$actual") <(echo "$expected") || true
      failed=1
    else
      checked=$((checked + 1))
    fi
  done
done
[ "$failed" -eq 0 ] || exit 1
echo "$checked README option tables match their plugins' schemas ($skipped of plugins this build lacks not checked)"
