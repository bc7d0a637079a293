#!/usr/bin/env bash
# weft-train as a user runs it (synthetic data, so it needs no files and is quick):
# 2 epochs straight and 1 epoch + --resume must write byte-identical checkpoints (weights,
# optimizer state, epoch, generator state), the metrics file must hold every field, and
# bad arguments must fail with a message.
#   weft_train_cli.sh PATH/TO/weft-train
set -euo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--data synthetic --model mlp --optimizer adam --lr 0.002 --batch-size 64 --seed 3 --no-progress)

"$train" "${common[@]}" --epochs 2 --checkpoint "$dir/straight.st" --metrics-json "$dir/metrics.json" > /dev/null
"$train" "${common[@]}" --epochs 1 --checkpoint "$dir/resumed.st" > /dev/null
"$train" "${common[@]}" --epochs 2 --resume "$dir/resumed.st" --checkpoint "$dir/resumed.st" > "$dir/resume.log"
grep -q "resumed from .* after epoch 1" "$dir/resume.log" || { echo "no resume line"; cat "$dir/resume.log"; exit 1; }
cmp "$dir/straight.st" "$dir/resumed.st" || { echo "FAIL: a resumed run differs from an uninterrupted one"; exit 1; }

for key in test_accuracy final_loss images_per_second epochs world_size mode device; do
  grep -q "\"$key\"" "$dir/metrics.json" || { echo "FAIL: metrics.json lacks $key"; cat "$dir/metrics.json"; exit 1; }
done

expect_failure() {  # expect_failure "text the error must contain" args...
  local text=$1; shift
  if "$train" "$@" > "$dir/out.log" 2>&1; then echo "FAIL: weft-train $* succeeded"; exit 1; fi
  grep -qF -- "$text" "$dir/out.log" || { echo "FAIL: weft-train $* did not say '$text':"; cat "$dir/out.log"; exit 1; }
}
expect_failure "--model: " --model transformer
expect_failure "dataset-fashion-mnist" --data-dir "$dir/nowhere" --epochs 1
expect_failure "invalid device 'gpu'" --data synthetic --device gpu
expect_failure "not a safetensors file" --data synthetic --model mlp --resume "$dir/metrics.json"
expect_failure "'ddp' is not implemented yet" --data synthetic --mode ddp
echo "weft-train: resume is byte-identical; metrics and errors as expected"
