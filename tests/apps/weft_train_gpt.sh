#!/usr/bin/env bash
# weft-train --model gpt as a user runs it, on a small text file and a small GPT: every mode
# (single, dp, ddp, the pipeline in one process and across processes) trains, reports its
# validation loss against the unigram baseline and prints a sample; one process and dp end with
# the same weights, as do the two pipelines; a run resumed from its first epoch's checkpoint ends
# byte-identical to an uninterrupted one, and so does an elastic worker; bad input is refused
# with a message that names it.
#   weft_train_gpt.sh PATH/TO/weft-train
set -euo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 48 KB of English: the fortunes package's, else (a machine without it) a generated text.
corpus="$dir/corpus.txt"
if [ -r /usr/share/games/fortunes/literature ]; then
  head -c 48000 /usr/share/games/fortunes/literature > "$corpus"
else
  for i in $(seq 1 1500); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done \
    > "$corpus"
fi
common=(--model gpt --data "text:$corpus" --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 16
        --lr 0.01 --warmup-steps 10 --lr-decay-steps 600 --seed 5 --no-progress --sample-tokens 40)

value() {  # value FILE KEY: a number or a string's text, from the flat metrics JSON
  sed -n -e "s/.*\"$2\": \"\([^\"]*\)\".*/\1/p" -e "t" -e "s/.*\"$2\": \([^,]*\),\{0,1\}$/\1/p" "$1"
}
check_run() {  # check_run NAME: the log and metrics of a finished run
  local log="$dir/$1.log" metrics="$dir/$1.json"
  grep -q "validation loss .* nats per byte (the unigram baseline" "$log" \
    || { echo "FAIL: $1: no validation line"; cat "$log"; exit 1; }
  grep -q "a sample of 40 bytes" "$log" || { echo "FAIL: $1: no sample"; cat "$log"; exit 1; }
  for key in val_loss val_accuracy unigram_loss tokens_per_second parameters final_loss; do
    [ -n "$(value "$metrics" $key)" ] && [ "$(value "$metrics" $key)" != null ] \
      || { echo "FAIL: $1: metrics lack $key"; cat "$metrics"; exit 1; }
  done
}

# Two epochs: the second must lower the validation loss below the unigram baseline.
"$train" "${common[@]}" --epochs 2 --checkpoint "$dir/single.st" --metrics-json "$dir/single.json" \
  > "$dir/single.log" 2>&1 || { cat "$dir/single.log"; exit 1; }
check_run single
awk -v v="$(value "$dir/single.json" val_loss)" -v u="$(value "$dir/single.json" unigram_loss)" \
  'BEGIN { exit !(v < u - 0.2) }' \
  || { echo "FAIL: validation loss not below the unigram baseline"; cat "$dir/single.json"; exit 1; }

# Resumed after epoch 1: the same bytes as the uninterrupted run.
"$train" "${common[@]}" --epochs 1 --checkpoint "$dir/resumed.st" > /dev/null 2>&1
"$train" "${common[@]}" --epochs 2 --resume "$dir/resumed.st" --checkpoint "$dir/resumed.st" > "$dir/resume.log" 2>&1
grep -q "resumed from .* after epoch 1" "$dir/resume.log" \
  || { echo "FAIL: no resume line"; cat "$dir/resume.log"; exit 1; }
cmp "$dir/single.st" "$dir/resumed.st" || { echo "FAIL: a resumed GPT run differs from an uninterrupted one"; exit 1; }
# An elastic worker resumes from its own checkpoint by itself.
WEFT_ELASTIC=1 "$train" "${common[@]}" --epochs 1 --checkpoint "$dir/elastic.st" > /dev/null 2>&1
WEFT_ELASTIC=1 "$train" "${common[@]}" --epochs 2 --checkpoint "$dir/elastic.st" > "$dir/elastic.log" 2>&1
grep -q "elastic run: resuming from" "$dir/elastic.log" \
  || { echo "FAIL: no elastic resume"; cat "$dir/elastic.log"; exit 1; }
cmp "$dir/single.st" "$dir/elastic.st" || { echo "FAIL: an elastic GPT run differs from an uninterrupted one"; exit 1; }

# One epoch in each mode.
run_mode() {  # run_mode NAME args...
  local name=$1; shift
  "$train" "${common[@]}" --epochs 1 --checkpoint "$dir/$name.st" --metrics-json "$dir/$name.json" "$@" \
    > "$dir/$name.log" 2>&1 || { echo "FAIL: --model gpt $*"; cat "$dir/$name.log"; exit 1; }
  check_run "$name"
}
# Jobs of ranks rendezvous on a port no other test takes (tests/support/free_port.py).
free_port() { python3 "$(dirname "$0")/../support/free_port.py" 2>/dev/null || echo $((20000 + RANDOM % 12000)); }
run_mode one
run_mode dp --mode dp --devices cpu:0,cpu:1
run_mode ddp --mode ddp --nproc 2 --master-port "$(free_port)"
run_mode pipeline --mode pipeline --devices cpu:0,cpu:1 --microbatches 2
run_mode pipeline_ranks --mode pipeline --nproc 2 --microbatches 2 --master-port "$(free_port)"
[ "$(value "$dir/ddp.json" world_size)" = 2 ] || { echo "FAIL: ddp ran on one rank"; exit 1; }
grep -q "untied" "$dir/pipeline.log" \
  || { echo "FAIL: the pipeline did not say its head is untied"; cat "$dir/pipeline.log"; exit 1; }
# dp and one process see the same batches, so do the two pipelines: their losses agree to what
# float32 sums taken in another order leave after an epoch (the parallel suites test equivalence
# in float64 to 1e-9).
close() {  # close A B KEY
  awk -v a="$(value "$dir/$1.json" $3)" -v b="$(value "$dir/$2.json" $3)" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.01) }' \
    || { echo "FAIL: $1 and $2 differ in $3"; cat "$dir/$1.json" "$dir/$2.json"; exit 1; }
}
close one dp final_loss
close one dp val_loss
close pipeline pipeline_ranks final_loss
close pipeline pipeline_ranks val_loss

expect_failure() {  # expect_failure "text the error must contain" args...
  local text=$1; shift
  if "$train" "$@" > "$dir/out.log" 2>&1; then echo "FAIL: weft-train $* succeeded"; exit 1; fi
  grep -qF -- "$text" "$dir/out.log" || { echo "FAIL: weft-train $* did not say '$text':"; cat "$dir/out.log"; exit 1; }
}
expect_failure "$dir/missing.txt" --model gpt --data "text:$dir/missing.txt" --epochs 1
printf 'a\0b' > "$dir/binary.bin"
expect_failure "$dir/binary.bin" --model gpt --data "text:$dir/binary.bin" --epochs 1
expect_failure "n_head 3 does not divide n_embd 16" --model gpt --data "text:$corpus" --n-head 3 --n-embd 16 --epochs 1
expect_failure "--data text:$corpus is for --model gpt" --model mlp --data "text:$corpus" --epochs 1
expect_failure "--model gpt trains on text" --model gpt --data synthetic --epochs 1
expect_failure "--n-embd 32 differs from the run being resumed" --model gpt --data "text:$corpus" --n-embd 32 \
  --epochs 3 --resume "$dir/single.st"
expect_failure "--block-size: " --model gpt --block-size 0
expect_failure "--n-layer is for --model gpt (this run trains a mlp)" --model mlp --data synthetic --n-layer 2
expect_failure "--warmup-steps is for --lr-schedule warmup-cosine (this run's is constant)" "${common[@]}" \
  --lr-schedule constant --epochs 1
# A tied GPT's checkpoint resumes in the modes that keep the tie, not in a pipeline.
expect_failure "is a GPT whose head is tied to its token embedding, which --mode pipeline cannot split" \
  --resume "$dir/single.st" --epochs 3 --mode pipeline --devices cpu:0,cpu:1
expect_failure "--tie-embeddings true: --mode pipeline cannot split" "${common[@]}" --tie-embeddings true \
  --mode pipeline --devices cpu:0,cpu:1 --epochs 1
echo "weft_train_gpt: all passed"
