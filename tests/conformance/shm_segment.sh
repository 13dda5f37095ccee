#!/bin/sh
# Runs a command with TIER_SHM_SEGMENT naming a shared-memory segment unique to this run, then
# removes the segment (and leftovers of interrupted creations), whatever the command's outcome.
#   shm_segment.sh TIERCTL COMMAND [ARGS...]
tierctl=$1
shift
TIER_SHM_SEGMENT="libtier-test-$$-$(date +%s%N)"
export TIER_SHM_SEGMENT
"$@"
rc=$?
"$tierctl" shm remove "$TIER_SHM_SEGMENT" >/dev/null 2>&1
exit $rc
