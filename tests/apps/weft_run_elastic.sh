#!/usr/bin/env bash
# weft-run's elastic mode as users run it: agents (weft-run --nnodes MIN:MAX
# --rdzv-endpoint ...) as local processes on loopback, with shell workers for the
# rendezvous itself and weft-train workers for training across rounds:
#   1. a frozen node (SIGSTOP: its sockets stay open) is found through heartbeats, and the
#      others go on without it; the store served by weft-run --rdzv-server;
#   2. below MIN for longer than join_timeout: a clear failure, nothing left behind;
#   3. a node arriving while shell workers run is admitted at once (they do not checkpoint);
#   4. the node serving the store fails for good: it keeps serving until the job ends;
#   5. a worker killed after epoch 1: its node (no restarts left) leaves, the other goes on
#      alone from the epoch-1 checkpoint and ends within 0.02 of an uninterrupted run;
#   6. a second node joining a running 1-worker weft-train job is admitted at its next
#      checkpoint: world size 2 afterwards;
#   7. SIGKILL of a whole agent: the other goes on alone;
#   8. a pipeline job grows as in 6: one worker with every stage, then a stage each.
# Every wait is bounded; no process of the test may remain (all hold $dir or $tok in
# their command lines).
#   weft_run_elastic.sh PATH/TO/weft-run PATH/TO/weft-train
set -euo pipefail
run=$1 train=$2
dir=$(mktemp -d)
tok="60.$$$RANDOM"  # a sleep duration that is also a unique token
tok_re=${tok//./\\.}
cleanup() {
  local pids
  pids=$(pgrep -f "$tok_re|$dir" || true)
  [ -z "$pids" ] || kill -KILL $pids 2> /dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}
free_port() { python3 "$(dirname "$0")/../support/free_port.py" 2>/dev/null || echo $((20000 + RANDOM % 12000)); }
no_leftovers() {
  for _ in $(seq 100); do pgrep -f "$tok_re|$dir" > /dev/null || return 0; sleep 0.05; done
  echo "processes left behind:"; pgrep -af "$tok_re|$dir" || true
  fail "$1 left processes behind"
}
# wait_for FILE REGEX SECONDS: until FILE has a line matching REGEX.
wait_for() {
  for _ in $(seq $(($3 * 20))); do grep -qE -- "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  fail "no line matching '$2' in $1 after $3 s"
}
# finish PID NAME SECONDS EXPECTED: waits (bounded) for an agent started in the background.
finish() {
  local status=0
  for _ in $(seq $(($3 * 20))); do kill -0 "$1" 2> /dev/null || break; sleep 0.05; done
  kill -0 "$1" 2> /dev/null && fail "$2 still runs after $3 s"
  wait "$1" || status=$?
  [ "$status" = "$4" ] || fail "$2 exited with $status, expected $4"
}
has_text() { grep -qE -- "$2" "$1" || fail "$1 does not match '$2'"; }
value() { sed -n "s/^ *\"$2\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" "$1"; }
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }

fast="join_timeout=60,last_call_timeout=1,keep_alive_interval=0.25,heartbeat_timeout=3"
# agent PORT JOB [weft-run options] PROGRAM...: started with &, the agent's pid is $! (exec);
# `finish` bounds the wait for it.
agent() {
  local port=$1 job=$2; shift 2
  exec "$run" --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "$job" --rdzv-conf "$fast" --grace-period 2 "$@"
}

# 1. A frozen node: its agent and worker stopped, their sockets open. The other agent finds
#    the silent heartbeat within heartbeat_timeout (3 s), ends the round and goes on alone.
port=$(free_port)
timeout -k 5 120 "$run" --rdzv-server --rdzv-endpoint "127.0.0.1:$port" > "$dir/server.log" 2>&1 &
server=$!
sleeper="echo \"round \$WEFT_ROUND world \$WORLD_SIZE\"; if [ \$WEFT_ROUND = 0 ]; then sleep $tok; fi; : $tok"
wait_for "$dir/server.log" "serving the rendezvous store" 10  # else an agent would serve it
agent "$port" frozen --nnodes 1:2 --nproc-per-node 1 --max-restarts 1 sh -c "$sleeper" > "$dir/a.log" 2>&1 &
a=$!
agent "$port" frozen --nnodes 1:2 --nproc-per-node 1 --max-restarts 1 sh -c "$sleeper" > "$dir/b.log" 2>&1 &
b=$!
wait_for "$dir/a.log" "round 0 world 2" 20
wait_for "$dir/b.log" "round 0 world 2" 20
frozen_at=$(date +%s%N)
kill -STOP "$b" -- "-$(pgrep -P "$b")"  # the agent, and its worker's process group
finish "$a" "the agent left alone" 30 0
frozen_ms=$((($(date +%s%N) - frozen_at) / 1000000))
has_text "$dir/a.log" "round 0 ended: node [01] \(.*\) sent no heartbeat for 3 s"
has_text "$dir/a.log" "round 1 world 1"
[ "$frozen_ms" -ge 3000 ] && [ "$frozen_ms" -lt 15000 ] || fail "the frozen node was let go after $frozen_ms ms"
kill -KILL "$b" -- "-$(pgrep -P "$b")" 2> /dev/null || true
wait "$b" 2> /dev/null || true
kill -INT "$server"
finish "$server" "weft-run --rdzv-server" 10 0
no_leftovers "the frozen node"

# 2. Below MIN: one agent of at least two waits join_timeout (2 s), then fails naming it.
port=$(free_port)
status=0
timeout -k 5 30 "$run" --nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id lonely \
  --rdzv-conf join_timeout=2 sh -c "sleep $tok" > "$dir/lonely.log" 2>&1 || status=$?
[ "$status" = 1 ] || fail "an agent below MIN exited with $status, expected 1"
has_text "$dir/lonely.log" \
  "waited 2 s \(join_timeout\) for at least 2 nodes in round 0, but only 1 joined \(.*\); 1 more must"
no_leftovers "below MIN"

# 3. Workers that do not checkpoint: a node that arrives is admitted at once.
port=$(free_port)
agent "$port" grow --nnodes 1:2 --nproc-per-node 1 sh -c "$sleeper" > "$dir/a.log" 2>&1 &
a=$!
wait_for "$dir/a.log" "round 0 world 1" 20
agent "$port" grow --nnodes 1:2 --nproc-per-node 1 sh -c "$sleeper" > "$dir/b.log" 2>&1 &
b=$!
finish "$a" "the first agent" 30 0
finish "$b" "the joining agent" 30 0
has_text "$dir/a.log" "round 0 ended: 1 node waits to join"
has_text "$dir/a.log" "round 1 world 2"
has_text "$dir/b.log" "round 1 world 2"
no_leftovers "a node joining shell workers"

# 4. The node serving the store fails and has no restarts left: it leaves the job but keeps
#    serving the store until the other node, alone, has finished it.
port=$(free_port)
failer="echo \"round \$WEFT_ROUND world \$WORLD_SIZE\"; if [ \$WEFT_ROUND = 0 ]; then exit 3; fi; : $tok"
agent "$port" host_fails --nnodes 1:2 --nproc-per-node 1 sh -c "$failer" > "$dir/a.log" 2>&1 &
a=$!
wait_for "$dir/a.log" "serving the rendezvous store" 10
agent "$port" host_fails --nnodes 1:2 --nproc-per-node 1 --max-restarts 1 sh -c "$sleeper" > "$dir/b.log" 2>&1 &
b=$!
finish "$b" "the node that goes on" 30 0
finish "$a" "the failed node serving the store" 30 3
has_text "$dir/a.log" "no restarts left \(--max-restarts 0\): this node leaves the job"
has_text "$dir/a.log" "it keeps serving, without workers, until the job ends"
has_text "$dir/b.log" "round 1 world 1"
no_leftovers "the serving node failing"

# Training: ConvNet on synthetic data, 3 epochs, 1 worker per node. Every node runs the same
# command (rank 0, wherever it is, writes the checkpoint and the metrics).
job=(--data synthetic --model convnet --epochs 3 --batch-size 50 --seed 3 --no-progress --mode ddp)
timeout -k 5 120 "$train" "${job[@]}" --nproc 2 --master-port "$(free_port)" --metrics-json "$dir/straight.json" \
  > "$dir/straight.log" 2>&1 || fail "the uninterrupted 2-worker run failed (or ran past 120 s)"
straight=$(value "$dir/straight.json" test_accuracy)

# trainer NAME JOB RESTARTS [weft-train options]: an agent training job JOB (checkpoint
# $dir/JOB.st, metrics $dir/JOB.json), its log in $dir/NAME.log; its pid in $!.
trainer() {
  local name=$1 job_id=$2 restarts=$3; shift 3
  agent "$port" "$job_id" --nnodes 1:2 --nproc-per-node 1 --max-restarts "$restarts" "$train" "${job[@]}" \
    --checkpoint "$dir/$job_id.st" --metrics-json "$dir/$job_id.json" "$@" > "$dir/$name.log" 2>&1
}
# pair JOB A_RESTARTS B_RESTARTS: agents a (serving the store) and b train JOB together;
# returns once epoch 1's checkpoint is there.
pair() {
  port=$(free_port)
  trainer a "$1" "$2" &
  a=$!
  wait_for "$dir/a.log" "serving the rendezvous store" 10
  trainer b "$1" "$3" &
  b=$!
  for _ in $(seq 2400); do [ -f "$dir/$1.st" ] && break; sleep 0.05; done
  [ -f "$dir/$1.st" ] || fail "no checkpoint after epoch 1 within 120 s"
}

# 5. A worker killed after epoch 1: its node has no restarts left and leaves; the other
#    node's round ends (a failure: one of its restarts) and it goes on alone, resuming
#    from the epoch-1 checkpoint.
pair killed 2 0
kill -KILL "$(pgrep -P "$b")"
finish "$b" "the node whose worker was killed" 30 1
finish "$a" "the surviving node" 120 0
has_text "$dir/b.log" "no restarts left \(--max-restarts 0\): this node leaves the job"
has_text "$dir/a.log" "round 1: node 0 \(.*\) of 1 "
has_text "$dir/a.log" "elastic run: resuming from .* after epoch [12]"
[ "$(value "$dir/killed.json" world_size)" = 1 ] || fail "the run did not end with world size 1"
within "$(value "$dir/killed.json" test_accuracy)" "$straight" 0.02 ||
  fail "accuracy $(value "$dir/killed.json" test_accuracy) after losing a node is not within 0.02 of $straight"
no_leftovers "a killed worker"

# 6. A node joining a running 1-worker job waits for the next checkpoint (every 20 steps),
#    where the workers end the round to admit it; the rest of the job runs on 2 workers.
# grow JOB: agent a trains JOB alone; agent b starts once its first checkpoint is there, and is
# admitted at the next one; both must end well, the job on 2 workers.
grow() {
  port=$(free_port)
  trainer a "$1" 0 --checkpoint-every 20 &
  a=$!
  wait_for "$dir/a.log" "round 0: .* world size 1" 20
  for _ in $(seq 600); do [ -f "$dir/$1.st" ] && break; sleep 0.05; done
  [ -f "$dir/$1.st" ] || fail "no checkpoint of $1 after 20 steps within 30 s"
  trainer b "$1" 0 --checkpoint-every 20 &
  b=$!
  finish "$a" "the first node of $1" 120 0
  finish "$b" "the joining node of $1" 60 0
  has_text "$dir/a.log" "round 1: .* world size 2"
  [ "$(value "$dir/$1.json" world_size)" = 2 ] || fail "the $1 job did not end with world size 2"
}
grow grown
has_text "$dir/a.log" "round 0 ended: admitting 1 waiting node at the checkpoint after epoch"
no_leftovers "a joining node"

# 7. SIGKILL of a whole agent (its workers die with it): the other goes on alone.
pair lost 1 1
kill -KILL "$b"
finish "$a" "the surviving node" 120 0
wait "$b" 2> /dev/null || true
has_text "$dir/a.log" "round 1: node 0 \(.*\) of 1 "
[ "$(value "$dir/lost.json" world_size)" = 1 ] || fail "the run did not end with world size 1"
no_leftovers "a killed agent"

# 8. The same growth for a pipeline job: in round 0 the one worker holds every stage; at the
#    checkpoint where the second node is admitted, the two workers of round 1 split the model
#    into a stage each, from the whole model and optimizer state that rank 0's checkpoint holds.
job=(--data synthetic --model convnet --epochs 2 --batch-size 50 --seed 3 --no-progress --mode pipeline)
grow piped
cat "$dir/a.log" "$dir/b.log" | grep -q "pipeline over 2 ranks" || fail "round 1 did not train a pipeline over 2 ranks"
within "$(value "$dir/piped.json" test_accuracy)" "$straight" 0.02 ||
  fail "the grown pipeline's accuracy $(value "$dir/piped.json" test_accuracy) is not within 0.02 of $straight"
no_leftovers "a pipeline growing"
echo "weft-run elastic: a frozen node let go after ${frozen_ms} ms (heartbeat_timeout 3 s); accuracy after losing" \
  "a node $(value "$dir/killed.json" test_accuracy), uninterrupted $straight; grown to world size 2 (ddp, and a" \
  "pipeline at $(value "$dir/piped.json" test_accuracy)); PASS"
