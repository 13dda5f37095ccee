#!/bin/sh
# Runs a command with TIER_SHM_SEGMENT naming a shared-memory segment unique to this run; then
# checks the segment the command left with `tierctl shm inspect` and `tierctl shm verify` (every
# object intact, nothing left reserved), and removes it whatever the outcome.
#   shm_segment.sh TIERCTL COMMAND [ARGS...]
tierctl=$1
shift
TIER_SHM_SEGMENT="libtier-test-$$-$(date +%s%N)"
export TIER_SHM_SEGMENT
"$@"
rc=$?
if [ $rc -eq 0 ]; then
  "$tierctl" shm inspect "$TIER_SHM_SEGMENT" || rc=1
  "$tierctl" shm verify "$TIER_SHM_SEGMENT" || rc=1
fi
"$tierctl" shm remove "$TIER_SHM_SEGMENT" >/dev/null 2>&1
exit $rc
