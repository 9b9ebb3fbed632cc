#!/usr/bin/env bash
# Run one stage of a build and report how long it took.
# Usage: scripts/timed.sh NAME COMMAND [ARGS...]
# When FASTSHARD_TIMINGS names a file, a line "NAME<TAB>SECONDS<TAB>STATUS" is
# appended to it (.ci/run prints those lines as a summary at the end).
set -uo pipefail
name="$1"
shift
printf '\n==> %s: %s\n' "$name" "$*"
start=${EPOCHREALTIME/./}
"$@"
rc=$?
elapsed_us=$((${EPOCHREALTIME/./} - start))
secs="$((elapsed_us / 1000000)).$(printf '%01d' $((elapsed_us % 1000000 / 100000)))"
if [[ $rc == 0 ]]; then status=ok; else status="FAILED (exit $rc)"; fi
printf '==> %s: %s in %s s\n' "$name" "$status" "$secs"
if [[ -n "${FASTSHARD_TIMINGS:-}" ]]; then
  printf '%s\t%s\t%s\n' "$name" "$secs" "$status" >>"$FASTSHARD_TIMINGS"
fi
exit $rc
