"""PyTorch side of bench/conv_layers: the same convolutions, timed the same way.

For each layer: the median over --rounds of one forward (no autograd), and of forward +
backward (grad_input and grad_weight) less the forward, on --threads threads; float32,
random data. Writes "<model>_<layer>_forward_ms" and "..._backward_ms" as JSON. The layer
list mirrors bench/conv_layers.cpp.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

LAYERS = [  # model, name, in, out, size, kernel, stride, padding, bias
    ("convnet", "layer1", 1, 16, 28, 5, 1, 2, True),
    ("convnet", "layer2", 16, 32, 14, 5, 1, 2, True),
    ("resnet", "conv1", 1, 16, 28, 3, 1, 1, False),
    ("resnet", "16->16", 16, 16, 28, 3, 1, 1, False),
    ("resnet", "16->32 s2", 16, 32, 28, 3, 2, 1, False),
    ("resnet", "16->32 1x1 s2", 16, 32, 28, 1, 2, 0, False),
    ("resnet", "32->32", 32, 32, 14, 3, 1, 1, False),
    ("resnet", "32->64 s2", 32, 64, 14, 3, 2, 1, False),
    ("resnet", "32->64 1x1 s2", 32, 64, 14, 1, 2, 0, False),
    ("resnet", "64->64", 64, 64, 7, 3, 1, 1, False),
]


def median_ms(body, rounds):
    body()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        body()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--model", default="all")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    result = {}
    for model, name, cin, cout, size, k, stride, pad, bias in LAYERS:
        if args.model not in ("all", model):
            continue
        x = torch.randn(args.batch, cin, size, size)
        w = torch.randn(cout, cin, k, k) * 0.1
        b = torch.randn(cout) if bias else None
        with torch.no_grad():
            forward = median_ms(lambda: F.conv2d(x, w, b, stride, pad), args.rounds)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        bg = b.clone().requires_grad_() if bias else None
        grad = torch.randn_like(F.conv2d(x, w, b, stride, pad))

        def both():
            xg.grad = wg.grad = None
            if bg is not None:
                bg.grad = None
            F.conv2d(xg, wg, bg, stride, pad).backward(grad)

        result[f"{model}_{name}_forward_ms"] = forward
        result[f"{model}_{name}_backward_ms"] = max(0.0, median_ms(both, args.rounds) - forward)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
