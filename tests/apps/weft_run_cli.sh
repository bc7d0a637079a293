#!/usr/bin/env bash
# weft-run as a user runs it, with small shell programs as workers: the environment each
# rank gets, whole prefixed lines, a failing or killed rank stopping the others, restarts,
# SIGINT / SIGTERM, programs that cannot run, arguments passed through, bad flags. Every
# case is bounded, and after each one no process may be left: every worker's command line
# holds a token ("sleep 60.<token>") that pgrep looks for.
#   weft_run_cli.sh PATH/TO/weft-run
set -euo pipefail
run=$1
dir=$(mktemp -d)
tok="60.$$$RANDOM"  # a sleep duration that is also a unique token
tok_re=${tok//./\\.}
cleanup() {
  local pids
  pids=$(pgrep -f "$tok_re" || true)
  [ -z "$pids" ] || kill -KILL $pids 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
started=$(date +%s%N)

fail() { echo "FAIL: $*"; for f in "$dir"/out "$dir"/err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
# No process with the token may remain (a SIGKILLed process can take a moment to go).
no_leftovers() {
  for _ in $(seq 40); do pgrep -f "$tok_re" > /dev/null || return 0; sleep 0.05; done
  echo "processes left behind:"; pgrep -af "$tok_re" || true
  fail "$1 left processes behind"
}
# wr EXPECTED_STATUS COMMAND...: a weft-run command under a timeout, stdout and stderr to
# $dir/out and $dir/err.
wr() {
  local expected=$1 status=0; shift
  timeout -k 5 40 "$@" > "$dir/out" 2> "$dir/err" || status=$?
  [ "$status" = "$expected" ] || fail "$* exited with $status, expected $expected"
}
has_line() { grep -qxF -- "$2" "$dir/$1" || fail "$1 lacks the line '$2'"; }
has_text() { grep -qE -- "$2" "$dir/$1" || fail "$1 does not match '$2'"; }

# 1. The environment of every rank, every line prefixed, stdout and stderr kept apart, a
#    last line without a newline flushed; OMP_NUM_THREADS shared out unless set.
show='echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR P=$MASTER_PORT C=$WEFT_RESTART_COUNT O=$OMP_NUM_THREADS"'
cores=$(env -u OMP_NUM_THREADS nproc)
omp=$((cores / 3 > 1 ? cores / 3 : 1))
wr 0 env -u OMP_NUM_THREADS "$run" --nproc-per-node 3 --master-port 29555 \
  sh -c "$show; echo \"to stderr \$RANK\" >&2; printf \"no newline \$RANK\"; : $tok"
for r in 0 1 2; do
  has_line out "[rank $r] R=$r W=3 L=$r LW=3 G=0 A=127.0.0.1 P=29555 C=0 O=$omp"
  has_line out "[rank $r] no newline $r"
  has_line err "[rank $r] to stderr $r"
done
[ "$(wc -l < "$dir/out")" = 6 ] || fail "expected 6 lines on stdout"
! grep -qv '^\[rank [0-2]\] ' "$dir/out" || fail "a stdout line without its rank prefix"
[ "$(grep -c 'weft-run: OMP_NUM_THREADS is not set' "$dir/err")" = 1 ] || fail "no (single) OMP_NUM_THREADS line"
wr 0 env OMP_NUM_THREADS=7 "$run" --nproc_per_node 3 --nnodes 2 --node_rank 1 --master_addr 10.1.2.3 \
  --master_port 29600 sh -c "$show; : $tok"
for l in 0 1 2; do has_line out "[rank $((3 + l))] R=$((3 + l)) W=6 L=$l LW=3 G=1 A=10.1.2.3 P=29600 C=0 O=7"; done
! grep -q OMP_NUM_THREADS "$dir/err" || fail "OMP_NUM_THREADS was set by the user, weft-run must not mention it"
wr 0 "$run" --nproc-per-node 2 --no-prefix sh -c "echo \"plain \$RANK\"; : $tok"
[ "$(sort "$dir/out")" = "$(printf 'plain 0\nplain 1')" ] || fail "--no-prefix changed the output"
# Whole lines when ranks write fast through block-buffered stdio (writes split lines).
wr 0 "$run" --nproc-per-node 3 sh -c "awk -v r=\$RANK 'BEGIN { for (i = 0; i < 3000; i++) printf \"line %d of rank %d %080d\\n\", i, r, i }'; : $tok"
! grep -qvE '^\[rank ([0-2])\] line [0-9]+ of rank \1 [0-9]{80}$' "$dir/out" || fail "lines of different ranks were mixed"
[ "$(wc -l < "$dir/out")" = 9000 ] || fail "expected 9000 lines"
no_leftovers "the environment cases"

# 2. A rank exiting 3 stops the others (sleeping 60 s) at once; weft-run exits 3.
t0=$(date +%s%N)
wr 3 "$run" --nproc-per-node 4 sh -c "if [ \$RANK = 2 ]; then echo 'rank 2 gives up'; exit 3; fi; sleep $tok"
failure_ms=$(ms_since "$t0")
[ "$failure_ms" -lt 30000 ] || fail "weft-run took $failure_ms ms to stop after a failure"
has_line out "[rank 2] rank 2 gives up"
has_text err "^weft-run: rank 2 \(pid [0-9]+\) exited with status 3; stopped ranks 0, 1, 3$"
no_leftovers "a failing rank"

# 3. A rank killed by a signal: named with the signal; weft-run exits 1.
wr 1 "$run" --nproc-per-node 3 sh -c "if [ \$RANK = 1 ]; then kill -KILL \$\$; fi; sleep $tok"
has_text err "^weft-run: rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\); stopped ranks 0, 2$"
no_leftovers "a killed rank"

# 4. --max-restarts 1: rank 1 fails in the first round only (it leaves a marker) while
#    the others sleep; they are stopped, the group is started again with
#    WEFT_RESTART_COUNT=1 and succeeds.
marker="$dir/failed-once"
wr 0 "$run" --nproc-per-node 3 --max-restarts 1 sh -c \
  "if [ \$RANK = 1 ] && [ ! -e '$marker' ]; then touch '$marker'; exit 4; fi
   if [ \$RANK != 1 ] && [ \$WEFT_RESTART_COUNT = 0 ]; then sleep $tok; fi; $show"
has_text err "^weft-run: rank 1 \(pid [0-9]+\) exited with status 4; stopped ranks 0, 2; restarting the group \(restart 1 of 1\)$"
for r in 0 1 2; do has_text out "^\[rank $r\] R=$r .* C=1 "; done
! grep -q "^\[rank 1\] .* C=0 " "$dir/out" || fail "rank 1 printed in the round it failed"
wr 4 "$run" --nproc-per-node 2 --max-restarts 1 sh -c "exit 4; : $tok"
[ "$(grep -c 'exited with status 4' "$dir/err")" = 2 ] || fail "expected two failed rounds"
has_text err "no restarts left \(--max-restarts 1\)$"
no_leftovers "the restart cases"

# 5. SIGINT while the ranks sleep: all stopped at once (no grace needed), exit 130. Then
#    SIGTERM with a rank that ignores SIGTERM: SIGKILL after the 1 s grace period, exit 143.
signal_case() {  # signal_case SIGNAL EXPECTED_STATUS MAX_MS GRACE SCRIPT; sets took_ms
  "$run" --nproc-per-node 3 --grace-period "$4" sh -c "$5" > "$dir/out" 2> "$dir/err" &
  local pid=$! status=0
  for _ in $(seq 100); do [ "$(grep -c ready "$dir/out")" = 3 ] && break; sleep 0.05; done
  [ "$(grep -c ready "$dir/out")" = 3 ] || fail "the ranks did not start"
  local t0
  t0=$(date +%s%N)
  kill -"$1" "$pid"
  for _ in $(seq 200); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done
  kill -0 "$pid" 2> /dev/null && { kill -KILL "$pid"; fail "weft-run did not exit within 10 s of SIG$1"; }
  wait "$pid" || status=$?
  took_ms=$(ms_since "$t0")
  [ "$status" = "$2" ] || fail "weft-run exited with $status after SIG$1, expected $2"
  [ "$took_ms" -lt "$3" ] || fail "weft-run took $took_ms ms to stop after SIG$1 (at most $3 expected)"
  no_leftovers "SIG$1"
}
signal_case INT 130 2000 2 "echo ready; sleep $tok"
sigint_ms=$took_ms
has_text err "^weft-run: got SIGINT: stopping ranks 0, 1, 2"
has_text err "^weft-run: exiting with 130; stopped ranks 0, 1, 2$"
signal_case TERM 143 4000 1 "if [ \$RANK = 0 ]; then trap '' TERM; fi; echo ready; sleep $tok"
sigterm_ms=$took_ms
[ "$sigterm_ms" -ge 900 ] || fail "the rank ignoring SIGTERM was killed before the grace period ($sigterm_ms ms)"
has_text err "^weft-run: exiting with 143; stopped ranks 0, 1, 2 \(rank 0 needed SIGKILL\)$"
# SIGINT while the others are stopped after a failure (rank 0 ignores SIGTERM, so that stop
# takes the 3 s grace period): the failure is reported, and no restart follows.
"$run" --nproc-per-node 2 --max-restarts 3 --grace-period 3 \
  sh -c "if [ \$RANK = 0 ]; then trap '' TERM; echo ready; sleep $tok; else sleep 0.5; exit 5; fi" \
  > "$dir/out" 2> "$dir/err" &
pid=$!
for _ in $(seq 100); do grep -q ready "$dir/out" && break; sleep 0.05; done
sleep 1.5  # rank 1 has failed: the stop is under way
kill -INT "$pid"
for _ in $(seq 200); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done
kill -0 "$pid" 2> /dev/null && { kill -KILL "$pid"; fail "weft-run did not exit within 10 s of SIGINT"; }
status=0
wait "$pid" || status=$?
[ "$status" = 130 ] || fail "weft-run exited with $status after SIGINT during a failure's stop, expected 130"
has_text err "^weft-run: rank 1 \(pid [0-9]+\) exited with status 5; stopped rank 0 \(rank 0 needed SIGKILL\); "
has_text err "; got SIGINT: no restart, exiting with 130$"
[ "$(grep -c 'exited with status 5' "$dir/err")" = 1 ] || fail "the group was restarted after SIGINT"
no_leftovers "SIGINT during a failure's stop"

# 6. weft-run itself killed (no chance to clean up): its workers die with it (PR_SET_PDEATHSIG).
"$run" --nproc-per-node 2 sh -c "echo ready; exec sleep $tok" > "$dir/out" 2> "$dir/err" &
pid=$!
for _ in $(seq 100); do [ "$(grep -c ready "$dir/out")" = 2 ] && break; sleep 0.05; done
sleep 0.1  # from echo to exec
{ kill -KILL "$pid" && wait "$pid"; } 2> /dev/null || true  # without bash's "Killed" line
no_leftovers "weft-run killed with SIGKILL"

# 7. A PROGRAM that cannot be executed: named, exit 127, nothing started.
wr 127 "$run" --nproc-per-node 2 "weft-run-no-such-program-$tok"
has_line err "weft-run: cannot execute 'weft-run-no-such-program-$tok': no such program on PATH"
wr 127 "$run" --nproc-per-node 2 "$dir/nowhere/$tok"
has_line err "weft-run: cannot execute '$dir/nowhere/$tok': No such file or directory"
printf 'echo hi\n' > "$dir/not-executable"
wr 127 "$run" --nproc-per-node 2 "$dir/not-executable" "$tok"
has_line err "weft-run: cannot execute '$dir/not-executable': Permission denied"
no_leftovers "a missing program"

# 8. Arguments after PROGRAM reach it unchanged, weft-run's flags and "--" included.
args=(--nproc-per-node 5 --no-prefix --max-restarts=2 "two  words" -- '' "$tok")
print_args='for a in "$@"; do echo "<$a>"; done'
for separator in "" "--"; do
  wr 0 "$run" --nproc-per-node 1 $separator sh -c "$print_args" sh "${args[@]}"
  expected=$(for a in "${args[@]}"; do echo "[rank 0] <$a>"; done)
  [ "$(cat "$dir/out")" = "$expected" ] || fail "the arguments changed on their way to PROGRAM"
done

# 9. Bad flags: CLI11's message or weft-run's, naming the flag; exit 2.
bad_flag() {  # bad_flag "text the error must contain" args...
  local text=$1; shift
  wr 2 "$run" "$@"
  grep -qF -- "$text" "$dir/err" || fail "weft-run $* did not say '$text'"
}
bad_flag "--nproc-per-node: Value 0 not in range" --nproc-per-node 0 true
bad_flag "--nproc-per-node is required" true
bad_flag "--node-rank 2 is out of range for --nnodes 2 (0..1)" --nproc-per-node 1 --nnodes 2 --node-rank 2 true
bad_flag "unknown option --bogus" --bogus 3 --nproc-per-node 1 true
bad_flag "no PROGRAM to run" --nproc-per-node 1
bad_flag "--master-port: Value 70000 not in range" --nproc-per-node 1 --master-port 70000 true
bad_flag "--grace-period: Value -1 not in range" --nproc-per-node 1 --grace-period -1 true
# Elastic mode's flags (weft_run_elastic.sh runs the mode itself).
bad_flag "--nnodes 1:2 is an elastic range: it needs --rdzv-endpoint" --nproc-per-node 1 --nnodes 1:2 true
bad_flag "--nnodes '2:x' is neither a node count N nor a range MIN:MAX" --nproc-per-node 1 --nnodes 2:x true
bad_flag "--nnodes 3:2: MIN is above MAX" --nproc-per-node 1 --nnodes 3:2 --rdzv-endpoint 127.0.0.1:1 true
bad_flag "--rdzv-endpoint 'here' is not HOST:PORT" --nproc-per-node 1 --rdzv-endpoint here true
bad_flag "--rdzv-conf: unknown key 'timeout'" --nproc-per-node 1 --rdzv-endpoint h:1 --rdzv-conf timeout=3 true
bad_flag "--rdzv-conf join_timeout=-1: expected KEY=SECONDS" --nproc-per-node 1 --rdzv-endpoint h:1 \
  --rdzv-conf join_timeout=-1 true
bad_flag "heartbeat_timeout (2 s) must be longer than keep_alive_interval (1 s) plus 1 s" --nproc-per-node 1 \
  --rdzv-endpoint h:1 --rdzv-conf keep_alive_interval=1,heartbeat_timeout=2 true
bad_flag "--node-rank is for a fixed job" --nproc-per-node 1 --rdzv-endpoint h:1 --node-rank 0 true
bad_flag "--rdzv-id 'a/b' must be a non-empty word" --nproc-per-node 1 --rdzv-endpoint h:1 --rdzv-id a/b true
bad_flag "--rdzv-server needs --rdzv-endpoint" --rdzv-server
bad_flag "--rdzv-server runs no PROGRAM ('true' given)" --rdzv-server --rdzv-endpoint h:1 true
no_leftovers "the last cases"

echo "weft-run: environment, whole lines, failure stop in ${failure_ms} ms, restart, SIGINT stop in ${sigint_ms} ms," \
  "SIGKILL after grace, exec errors, arguments, bad flags as expected ($(ms_since "$started") ms in all)"
