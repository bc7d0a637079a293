#!/usr/bin/env bash
# tools/gpu-check's results file, without a GPU: a run compared with a baseline (the regressions
# and fixes it prints), the summary's line per failing case, a step resumed after a call ran out
# of budget, and ctest's output read back test by test (a test cut off by --stop-time is left for
# the next call, not recorded as a timeout).
#
#   gpu_check_results.sh tools/gpu-check.d/results.py
set -uo pipefail
results_py=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0
expect() {  # what, expected text, actual text
  if [ "$2" != "$3" ]; then
    echo "FAIL: $1"; echo "--- expected"; echo "$2"; echo "--- got"; echo "$3"; failures=$((failures + 1))
  else
    echo "ok: $1"
  fi
}
r() { python3 "$results_py" "$@"; }

cat >"$scratch/baseline.json" <<'EOF'
{"format": "weft-gpu-check-results/1",
 "versions": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04"},
 "steps": {
  "test": {"finished": true, "seconds": 200, "cases": {
    "test_tensor": {"status": "ok"},
    "test_cuda_runtime/out of memory says what was asked for, what is used and what is cached": {"status": "FAIL"},
    "test_cuda_reduce/sum of rows": {"status": "ok"},
    "test_cuda_reduce/more than 2^31 elements: 64-bit indices in a long row": {"status": "TIMEOUT"}}},
  "memcheck": {"finished": true, "seconds": 300, "cases": {
    "test_cuda_elementwise/add": {"status": "ok"},
    "test_cuda_elementwise/where": {"status": "FAIL"}}}}}
EOF
cat >"$scratch/current.json" <<'EOF'
{"format": "weft-gpu-check-results/1",
 "versions": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda_runtime": "13.0", "cudnn": "9.19.0",
              "nccl": "2.28.9"},
 "steps": {
  "test": {"finished": true, "seconds": 210, "cases": {
    "test_tensor": {"status": "ok"},
    "test_cuda_runtime/out of memory says what was asked for, what is used and what is cached": {"status": "ok"},
    "test_cuda_reduce/sum of rows": {"status": "FAIL", "log": "logs/ctest-1.txt"},
    "test_cuda_reduce/more than 2^31 elements: 64-bit indices in a long row": {"status": "TIMEOUT"},
    "test_cuda_nn_ops/conv2d": {"status": "FAIL"},
    "test_cuda_nn_ops/pooling": {"status": "SKIP"}}},
  "memcheck": {"finished": false, "seconds": 100, "cases": {
    "test_cuda_elementwise/add": {"status": "FAIL", "detail": "3 sanitizer errors, exit 99"}}}}}
EOF

# Regressions: newly failing (ok or not run before); fixes: passing now, failing before; a case
# that fails in both, is skipped now, or was not run now is neither.
out=$(r compare "$scratch/current.json" "$scratch/baseline.json")
rc=$?
expect "compare lists regressions and fixes" "compared with $scratch/baseline.json: 3 regressions, 1 fix
  regression test               test_cuda_nn_ops/conv2d: FAIL (baseline: not run)
  regression test               test_cuda_reduce/sum of rows: FAIL (baseline: ok)
  regression memcheck           test_cuda_elementwise/add: FAIL (baseline: ok)
  fix        test               test_cuda_runtime/out of memory says what was asked for, what is used and what \
is cached: ok (baseline: FAIL)" "$out"
expect "compare exits 1 when there are regressions" 1 "$rc"
out=$(r compare "$scratch/baseline.json" "$scratch/baseline.json")
expect "a run compared with itself" "compared with $scratch/baseline.json: 0 regressions, 0 fixes" "$out"

# The summary: versions, a line per step, a line per failing case; exit 1 when a step failed.
out=$(r summary "$scratch/current.json" --baseline "$scratch/baseline.json")
rc=$?
expect "summary exits 1 when a step failed" 1 "$rc"
expect "summary versions" "GPU NVIDIA H100 80GB HBM3; driver 580.159.04; driver's CUDA unknown; CUDA runtime 13.0; \
nvcc unknown; cuDNN 9.19.0; NCCL 2.28.9" "$(sed -n 2p <<<"$out")"
expect "summary steps" "test               FAIL          210s  2 FAIL, 1 SKIP, 1 TIMEOUT, 2 ok
memcheck           UNFINISHED    100s  1 FAIL; out of budget: run --steps memcheck again to go on" \
  "$(grep -E '^(test|memcheck) ' <<<"$out")"
expect "summary: one line per failing case" "failing cases (4):
  test               FAIL    test_cuda_reduce/sum of rows  (logs/ctest-1.txt)
  test               TIMEOUT test_cuda_reduce/more than 2^31 elements: 64-bit indices in a long row
  test               FAIL    test_cuda_nn_ops/conv2d
  memcheck           FAIL    test_cuda_elementwise/add  (3 sanitizer errors, exit 99)" \
  "$(sed -n '/^failing cases/,/^compared/p' <<<"$out" | grep -v '^compared')"

# A step cut off by the budget resumes with what it recorded; a finished one starts afresh.
results="$scratch/results.json"
r begin "$results" memcheck >/dev/null
r case "$results" memcheck "test_cuda_reduce/sum of rows" ok
r end "$results" memcheck 40 unfinished
r finished "$results" memcheck
expect "an unfinished step is not finished (--continue runs it)" 1 "$?"
expect "an unfinished step resumes" resume "$(r begin "$results" memcheck)"
r has "$results" memcheck "test_cuda_reduce/sum of rows"
expect "a resumed step keeps its cases" 0 "$?"
r end "$results" memcheck 30 finished
r finished "$results" memcheck
expect "a finished step is finished (--continue skips it)" 0 "$?"
expect "a finished step starts afresh" fresh "$(r begin "$results" memcheck)"
r has "$results" memcheck "test_cuda_reduce/sum of rows"
expect "a fresh step has no cases" 1 "$?"

# ctest's output read back by test number; the test that --stop-time cut off is left pending.
cat >"$scratch/listing.json" <<'EOF'
{"kind": "ctestInfo", "tests": [{"name": "test_tensor"}, {"name": "test_cuda_runtime/copies, across devices"},
 {"name": "test_cuda_reduce/sum of rows"}, {"name": "test_cuda_reduce/hangs"}, {"name": "bench_cli_kernels"},
 {"name": "test_cuda_parallel/cut off by the budget"}, {"name": "test_cuda_parallel/not started"}]}
EOF
cat >"$scratch/ctest.txt" <<'EOF'
Test project /build
    Start 1: test_tensor
1/6 Test #1: test_tensor ..............................................   Passed    1.20 sec
2/6 Test #2: test_cuda_runtime/copies, across devices .................***Failed    0.50 sec
some output of the failing test
3/6 Test #3: test_cuda_reduce/sum of rows ...........................***Exception: SegFault  0.30 sec
4/6 Test #4: test_cuda_reduce/hangs ...................................***Timeout 300.01 sec
5/6 Test #5: bench_cli_kernels ........................................***Skipped   0.01 sec
6/6 Test #6: test_cuda_parallel/cut off by the budget .................***Timeout  12.00 sec
EOF
results="$scratch/ingest.json"
r begin "$results" test >/dev/null
expect "every test pending at first" "1,2,3,4,5,6,7" "$(r ctest-pending "$results" test "$scratch/listing.json")"
r ctest-ingest "$results" test "$scratch/listing.json" "$scratch/ctest.txt" 300 "$(date +%s)"
expect "ctest-ingest says that tests are left" 3 "$?"
expect "the tests left: cut off and not started" "6,7" "$(r ctest-pending "$results" test "$scratch/listing.json")"
expect "statuses read from ctest's output" "test_tensor ok
test_cuda_runtime/copies, across devices FAIL
test_cuda_reduce/sum of rows FAIL
test_cuda_reduce/hangs TIMEOUT
bench_cli_kernels SKIP" "$(python3 -c 'import json, sys
for name, c in json.load(open(sys.argv[1]))["steps"]["test"]["cases"].items(): print(name, c["status"])' "$results")"

# --tests (a kit's list): only the tests the regex matches are pending, and the step is done
# when those are, whatever the others.
results="$scratch/selected.json"
r begin "$results" test >/dev/null
expect "pending, of the selected tests only" "2,3,4,6,7" "$(r ctest-pending "$results" test "$scratch/listing.json" '^test_cuda_')"
grep -E 'Test +#[234]:' "$scratch/ctest.txt" >"$scratch/ctest-cuda.txt"
echo '6/6 Test #6: test_cuda_parallel/cut off by the budget .................   Passed    2.00 sec' >>"$scratch/ctest-cuda.txt"
r ctest-ingest "$results" test "$scratch/listing.json" "$scratch/ctest-cuda.txt" 300 "$(date +%s)" '^test_cuda_'
expect "a selected test not run yet leaves the step unfinished" 3 "$?"
echo '7/7 Test #7: test_cuda_parallel/not started .................   Passed    1.00 sec' >>"$scratch/ctest-cuda.txt"
r ctest-ingest "$results" test "$scratch/listing.json" "$scratch/ctest-cuda.txt" 300 "$(date +%s)" '^test_cuda_'
expect "every selected test recorded: the step is done" 0 "$?"
expect "nothing selected is pending" "" "$(r ctest-pending "$results" test "$scratch/listing.json" '^test_cuda_')"
expect "the others still are" "1,5" "$(r ctest-pending "$results" test "$scratch/listing.json")"
r ctest-pending "$results" test "$scratch/listing.json" '^no_such_test' 2>/dev/null
expect "a selection of nothing is an error, not a finished step" 4 "$?"

# A kit's build (tools/gpu-kit) reports the compiler and headers it was built with, not those
# this machine has at the same paths.
mkdir -p "$scratch/kit-build"
printf '%s\n' KIT_COMMIT=abc1234 KIT_NVCC=13.0.48 KIT_CUDNN=9.13.0 KIT_NCCL=2.28.3 "KIT_TESTS='^(a|b)'" \
  >"$scratch/kit-build/kit.env"
r versions "$scratch/kit.json" "$scratch/kit-build"
expect "versions of a kit" "nvcc 13.0.48 (the kit's); cuDNN 9.13.0 (the kit's); NCCL 2.28.3 (the kit's)" \
  "$(r summary "$scratch/kit.json" | sed -n 2p | grep -o 'nvcc.*')"

[ $failures -eq 0 ] && echo "all gpu-check results checks passed"
exit $((failures > 0))
