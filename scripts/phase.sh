#!/usr/bin/env bash
# Times the phases of `make demo`, `make build` and `make test`, and says what to do when one
# fails.
#
#   scripts/phase.sh --begin            a new table ($CORDON_PHASE_LOG)
#   scripts/phase.sh NAME -- CMD...     runs CMD as the phase NAME and records its time
#   scripts/phase.sh --report           prints the table
#
# A row whose fourth field is `part` is a piece of a phase (each Go build in setup, go_build in
# scripts/lib.sh): printed, not added to the total.
#
# When CMD fails, it prints the phase, the command, what setup should have provided and is
# missing on this machine (scripts/check-setup.py), and the command that fixes it; then the
# table so far, and exits with CMD's status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log_file=${CORDON_PHASE_LOG:-/tmp/cordon-phases.tsv}

report() {
  [ -s "$log_file" ] || return 0
  awk -F'\t' '
    { name[NR] = $1; secs[NR] = $2; st[NR] = $3; if ($4 != "part") total += $2 }
    END {
      printf "[cordon] phases:\n"
      for (i = 1; i <= NR; i++) printf "[cordon]   %-12s %6ds  %s\n", name[i], secs[i], st[i]
      printf "[cordon]   %-12s %6ds\n", "total", total
    }' "$log_file" >&2
}

case "${1:-}" in
  --begin) mkdir -p "$(dirname "$log_file")" && : > "$log_file"; exit 0 ;;
  --report) report; exit 0 ;;
  ""|--*) echo "usage: phase.sh --begin | --report | NAME -- CMD..." >&2; exit 2 ;;
esac
name=$1
shift
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "phase.sh: $name: no command" >&2; exit 2; }
mkdir -p "$(dirname "$log_file")"
start=$(date +%s)
printf '[cordon] phase %s: %s\n' "$name" "$*" >&2
"$@"
rc=$?
secs=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ]; then
  printf '%s\t%s\tok\n' "$name" "$secs" >> "$log_file"
  printf '[cordon] phase %s: done in %ss\n' "$name" "$secs" >&2
  exit 0
fi
printf '%s\t%s\tFAILED (exit %s)\n' "$name" "$secs" "$rc" >> "$log_file"
{
  printf '\n[cordon] phase %s FAILED (exit %s) after %ss: %s\n' "$name" "$rc" "$secs" "$*"
  missing=$(python3 "$here/check-setup.py" 2>&1)
  if [ $? -ne 0 ]; then
    printf '[cordon] what this machine is missing:\n%s\n' "$missing"
    printf '[cordon] fix: `make setup` (installs every missing piece above), then run the same make target again\n'
  else
    printf '[cordon] nothing setup installs is missing; the error is in the output above this phase line.\n'
    printf '[cordon] to run this phase alone: %s\n' "$*"
  fi
} >&2
report
exit "$rc"
