"""PyTorch side of bench/op_overhead: time per call of add on two one-element tensors.

Same protocol as the C++ benchmark: one thread, warm-up, median over 31 rounds of
20000 calls, with and without autograd recording. Writes nanoseconds per op as JSON.
"""
import argparse
import json
import statistics
import time

import torch


def median_ns_per_call(body, rounds=31, calls=20000):
    for _ in range(calls):
        body()
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            body()
        per_call.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(per_call)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    a, b = torch.ones(1), torch.ones(1)
    ga, gb = torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)
    # The loop itself costs Python time; it is measured and subtracted so that the
    # figure is the op, as the C++ loop's cost is negligible.
    loop_ns = median_ns_per_call(lambda: None)
    result = {
        "add_ns": median_ns_per_call(lambda: torch.add(a, b)) - loop_ns,
        "add_autograd_ns": median_ns_per_call(lambda: torch.add(ga, gb)) - loop_ns,
        "loop_ns": loop_ns,
    }
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    print(f"torch {torch.__version__}: add {result['add_ns']:.0f} ns, with autograd {result['add_autograd_ns']:.0f} ns")


if __name__ == "__main__":
    main()
