#!/usr/bin/env bash
# tools/gpu-check.d/hang-stacks, without a GPU: a program copied into a scratch build folder that
# outlives the limit gets its threads' stacks written once; a like program outside the folder,
# and one that ends before the limit, get none; bad arguments are refused.
#
#   hang_stacks.sh SOURCE_DIR
set -uo pipefail
tool="$1/tools/gpu-check.d/hang-stacks"
scratch=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$scratch"' EXIT
failures=0
check() {  # what, test...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
command -v gdb >/dev/null || command -v cuda-gdb >/dev/null || { echo "skipped: no gdb or cuda-gdb"; exit 77; }
sleep_bin=$(command -v sleep)

mkdir -p "$scratch/build/bench" "$scratch/elsewhere"
cp "$sleep_bin" "$scratch/build/bench/stuck"
cp "$sleep_bin" "$scratch/build/bench/quick"
cp "$sleep_bin" "$scratch/elsewhere/stuck"
"$scratch/build/bench/stuck" 60 & stuck=$!
"$scratch/elsewhere/stuck" 60 & outside=$!
"$scratch/build/bench/quick" 0.5 & pids+=($!)
pids+=("$stuck" "$outside")
out="$scratch/stacks.txt"
"$tool" "$scratch/build" 1 "$out" & watcher=$!
pids+=("$watcher")
for _ in $(seq 60); do
  grep -q '^\[Inferior 1 (process '"$stuck"') detached\]' "$out" 2>/dev/null && break
  sleep 0.5
done
if grep -q 'ptrace: Operation not permitted' "$out" 2>/dev/null; then
  echo "skipped: this machine does not let a debugger attach (ptrace)"; exit 77
fi
check "the stuck program's stack is written, named by its pid and command" \
  grep -q "^== pid $stuck, parent $$, running [0-9]* s: $scratch/build/bench/stuck 60" "$out"
check "its stack shows where it waits" grep -q 'nanosleep' "$out"
sleep 6  # more rounds of the watcher
check "once per process" test "$(grep -c "^== pid $stuck," "$out")" -eq 1
check "nothing outside the folder" bash -c "! grep -q '^== pid $outside,' '$out'"
check "nothing that ended before the limit" bash -c "! grep -q 'quick' '$out'"
check "the stuck program goes on after the debugger detaches (not stopped)" \
  bash -c "kill -0 $stuck && ! awk '{exit !(\$3 == \"T\" || \$3 == \"t\")}' /proc/$stuck/stat"
children=$(pgrep -P "$watcher" | paste -sd,)
kill "$watcher"
sleep 1
check "TERM ends the watcher at once, with its children" bash -c "! kill -0 $watcher 2>/dev/null &&
  ! ps -o pid= -p '${children:-0}' >/dev/null"

"$tool" "$scratch/nowhere" 1 "$out" 2>/dev/null
check "a folder that is not there is refused" test $? -eq 2
"$tool" "$scratch/build" soon "$out" 2>/dev/null
check "seconds that are not a number are refused" test $? -eq 2

[ $failures -eq 0 ] && echo "all hang-stacks checks passed"
exit $((failures > 0))
