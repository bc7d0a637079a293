#!/usr/bin/env bash
# weft's GPT against PyTorch's on the same weights, batches and AdamW steps (Note [GPT against
# PyTorch] in test_gpt.cpp): test_gpt's case writes them into a scratch folder, and
# bench/reference/gpt.py's `equivalence` replays them in PyTorch and compares the losses.
#
#   gpt_pytorch_equivalence.sh PATH/TO/test_gpt PATH/TO/bench/reference/gpt.py
#
# The Python is bench_util.h's reference_python(): $WEFT_PYTHON, else the first of python3 and
# /usr/bin/python3 (Debian's python3-torch) that imports torch. Exits 77 (skipped) when none does.
set -uo pipefail
test_gpt=$1
script=$2
case_name="GPT float64: 20 AdamW steps match PyTorch's losses"

python=""
for candidate in ${WEFT_PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch, numpy' >/dev/null 2>&1; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  echo "skipped: no python3 here imports torch and numpy (Debian's python3-torch: tools/install-deps --bench)"
  exit 77
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
output=$(WEFT_GPT_REFERENCE_DIR="$scratch" "$test_gpt" --no-skip --test-case="$case_name" 2>&1)
rc=$?
echo "$output"
# A filter that matches nothing also exits 0: insist that exactly this case ran.
if [ $rc -ne 0 ] || ! tr -s ' ' <<<"$output" | grep -q "test cases: 1 | 1 passed"; then
  echo "FAILED: test_gpt '$case_name' exited $rc"
  exit 1
fi
"$python" "$script" equivalence "$scratch"
