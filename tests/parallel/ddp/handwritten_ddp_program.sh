#!/usr/bin/env bash
# Runs handwritten_ddp_program.cpp (beside this script) as users would: three processes
# started by hand with --world-size / --rank (and MASTER_PORT chosen here), then under
# weft-run, then under weft-run with --uneven (unpadded shares of 5, 4 and 4 batches inside a
# join), then with --local-sgd (post-local SGD with a model averager).
#   handwritten_ddp_program.sh PATH/TO/handwritten_ddp_program PATH/TO/weft-run
set -euo pipefail
program=$1
launcher=$2
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
# A free port below the ephemeral range (tests/support/free_port.py). Another test may still
# take it between our probe and rank 0's listen: the runs below start again on a new port when
# rank 0 says the address is in use (at most three tries).
free_port() { python3 "$(dirname "$0")/../../support/free_port.py" 2>/dev/null || echo $((20000 + RANDOM % 12000)); }
port_taken() { grep -q "Address already in use" "$@" 2>/dev/null; }

by_hand() {  # three ranks started by hand on one port; fails when any rank fails
  local port=$1 status=0
  pids=()
  for rank in 0 1 2; do
    MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 60 "$program" --world-size 3 --rank "$rank" > "$dir/rank$rank.log" 2>&1 &
    pids+=($!)
  done
  # Rank 0 serves the rendezvous: when it fails, the others would only wait for it.
  wait "${pids[0]}" || { kill -9 "${pids[1]}" "${pids[2]}" 2>/dev/null; status=1; }
  for i in 1 2; do wait "${pids[$i]}" || status=1; done
  return $status
}
for try in 1 2 3; do
  by_hand "$(free_port)" && break
  if [ "$try" -lt 3 ] && port_taken "$dir/rank0.log"; then continue; fi
  for i in 0 1 2; do echo "FAIL: rank $i started by hand:"; cat "$dir/rank$i.log"; done
  exit 1
done
grep -q "rank 2 of 3: all_reduce gives 6" "$dir/rank2.log" || { echo "FAIL: rank 2 by hand:"; cat "$dir/rank2.log"; exit 1; }
grep -q "rank 2: DDP loss .* replicas equal" "$dir/rank2.log" || { echo "FAIL: rank 2's training:"; cat "$dir/rank2.log"; exit 1; }
for try in 1 2 3; do
  timeout 60 "$launcher" --nproc-per-node 3 --master-port "$(free_port)" "$program" > "$dir/run.log" 2>&1 && break
  if [ "$try" -lt 3 ] && port_taken "$dir/run.log"; then continue; fi
  echo "FAIL: under weft-run:"; cat "$dir/run.log"; exit 1
done
grep -q "\[rank 1\] rank 1 of 3: all_reduce gives 6" "$dir/run.log" || { echo "FAIL: under weft-run:"; cat "$dir/run.log"; exit 1; }
grep -q "\[rank 1\] rank 1: DDP loss .* replicas equal" "$dir/run.log" || { echo "FAIL: training under weft-run:"; cat "$dir/run.log"; exit 1; }
for try in 1 2 3; do
  timeout 60 "$launcher" --nproc-per-node 3 --master-port "$(free_port)" "$program" --uneven > "$dir/uneven.log" 2>&1 && break
  if [ "$try" -lt 3 ] && port_taken "$dir/uneven.log"; then continue; fi
  echo "FAIL: --uneven under weft-run:"; cat "$dir/uneven.log"; exit 1
done
for expected in "\[rank 0\] rank 0: 15 batches" "\[rank 2\] rank 2: 12 batches" \
                "\[rank 1\] rank 1: DDP loss .* replicas equal" "\[rank 2\] rank 2: DDP loss .* replicas equal"; do
  grep -q "$expected" "$dir/uneven.log" || { echo "FAIL: --uneven: no '$expected':"; cat "$dir/uneven.log"; exit 1; }
done
for try in 1 2 3; do
  timeout 60 "$launcher" --nproc-per-node 3 --master-port "$(free_port)" "$program" --local-sgd > "$dir/local.log" 2>&1 && break
  if [ "$try" -lt 3 ] && port_taken "$dir/local.log"; then continue; fi
  echo "FAIL: --local-sgd under weft-run:"; cat "$dir/local.log"; exit 1
done
for expected in "\[rank 1\] rank 1: local SGD: apart from rank 0" "\[rank 1\] rank 1: DDP loss .* replicas equal"; do
  grep -q "$expected" "$dir/local.log" || { echo "FAIL: --local-sgd: no '$expected':"; cat "$dir/local.log"; exit 1; }
done
echo "handwritten_ddp_program: by hand and under weft-run, all_reduce gives 6 and DDP trains equal replicas on every rank;" \
     "with uneven shares (15, 12, 12 batches) inside a join too; with local SGD, apart until averaged"
