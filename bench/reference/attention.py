"""PyTorch side of bench/attention: the same attention shapes, timed the same way.

float32 q, k, v of shape [B, H, T, E], scale 1 / sqrt(E), no dropout, causal and not. For each
device: "math" is matmul / softmax / matmul (what torch 1.13 has, and the form of weft's
scaled_dot_product_attention_math); "sdpa" is F.scaled_dot_product_attention where torch >= 2
has it. "forward" runs under no_grad; "fwdbwd" is forward + backward into q, k and v. Each
figure is the median over --reps calls after warm-up (wall clock on the CPU, CUDA events on a
GPU). Writes "<device>_<full|causal>_<math|sdpa>_<forward|fwdbwd>_ms" and "..._tokens_per_s"
as JSON, the keys bench/attention writes for weft's rows.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


def attention_math(q, k, v, causal):
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        L, S = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def attention_sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def median_ms(body, reps, device):
    for _ in range(2):
        body()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            body()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    else:
        for _ in range(reps):
            begin = time.perf_counter()
            body()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def bench_device(device, shape, causal_list, reps, result):
    batch, heads, seq, head_dim = shape
    gen = torch.Generator().manual_seed(7)
    q, k, v, grad = (torch.randn(batch, heads, seq, head_dim, generator=gen).to(device) for _ in range(4))
    impls = [("math", attention_math)]
    if hasattr(F, "scaled_dot_product_attention"):
        impls.append(("sdpa", attention_sdpa))
    for causal in causal_list:
        mask = "causal" if causal else "full"
        for name, fn in impls:
            def forward():
                with torch.no_grad():
                    fn(q, k, v, causal)

            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

            def fwdbwd():
                qg.grad = kg.grad = vg.grad = None
                fn(qg, kg, vg, causal).backward(grad)

            for passname, body in (("forward", forward), ("fwdbwd", fwdbwd)):
                ms = median_ms(body, reps, device)
                key = f"{device}_{mask}_{name}_{passname}"
                result[key + "_ms"] = ms
                result[key + "_tokens_per_s"] = batch * seq / (ms * 1e-3)
                print(f"{key}: {ms:.3f} ms, {batch * seq / (ms * 1e-3):.0f} tokens/s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    parser.add_argument("--cpu-shape", type=int, nargs=4, default=(4, 4, 256, 64), metavar=("B", "H", "T", "E"))
    parser.add_argument("--cuda-shape", type=int, nargs=4, default=(8, 12, 1024, 64), metavar=("B", "H", "T", "E"))
    parser.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--reps", type=int, default=None, help="default: 10 on the CPU, 20 on CUDA")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # float32 products as weft's (its CUDA matmul runs without TF32 unless asked).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    causal_list = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    result = {"torch_major": major, "torch_minor": minor, "cpu_threads": torch.get_num_threads()}
    if args.device in ("cpu", "all"):
        bench_device("cpu", args.cpu_shape, causal_list, args.reps or 10, result)
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        bench_device("cuda", args.cuda_shape, causal_list, args.reps or 20, result)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
