#!/usr/bin/env bash
# Runs tests/seed004_style.cpp as users would: three processes started by hand with
# --world-size / --rank (and MASTER_PORT chosen here), then under weft-run.
#   seed004_style.sh PATH/TO/seed004_style PATH/TO/weft-run
set -euo pipefail
program=$1
launcher=$2
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
# Two free ports at once (both held while chosen): one for the ranks started by hand, one for
# weft-run; port + 1 could be an ephemeral port another test's connection holds.
read -r port launcher_port < <(python3 -c 'import socket
s, t = socket.socket(), socket.socket()
s.bind(("127.0.0.1", 0)); t.bind(("127.0.0.1", 0))
print(s.getsockname()[1], t.getsockname()[1])' 2>/dev/null || echo $((20000 + $$ % 20000)) $((20001 + $$ % 20000)))
for rank in 0 1 2; do
  MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 60 "$program" --world-size 3 --rank "$rank" > "$dir/rank$rank.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do
  wait "${pids[$i]}" || { echo "FAIL: rank $i started by hand:"; cat "$dir/rank$i.log"; exit 1; }
done
grep -q "rank 2 of 3: all_reduce gives 6" "$dir/rank2.log" || { echo "FAIL: rank 2 by hand:"; cat "$dir/rank2.log"; exit 1; }
grep -q "rank 2: DDP loss .* replicas equal" "$dir/rank2.log" || { echo "FAIL: rank 2's training:"; cat "$dir/rank2.log"; exit 1; }
timeout 60 "$launcher" --nproc-per-node 3 --master-port "$launcher_port" "$program" > "$dir/run.log" 2>&1 ||
  { echo "FAIL: under weft-run:"; cat "$dir/run.log"; exit 1; }
grep -q "\[rank 1\] rank 1 of 3: all_reduce gives 6" "$dir/run.log" || { echo "FAIL: under weft-run:"; cat "$dir/run.log"; exit 1; }
grep -q "\[rank 1\] rank 1: DDP loss .* replicas equal" "$dir/run.log" || { echo "FAIL: training under weft-run:"; cat "$dir/run.log"; exit 1; }
echo "seed004_style: by hand and under weft-run, all_reduce gives 6 and DDP trains equal replicas on every rank"
