"""PyTorch side of bench/dp_overhead: the same training step with torch.nn.DataParallel.

DataParallel needs CUDA devices; where there are at least two, this times one SGD step of
the same ConvNet and ResNet (BasicBlocks 1, 1, 1, BatchNorm in training mode) at one total
batch on 1 GPU and with DataParallel over 2 (and 4 when there are) GPUs. Without CUDA it
times the 1-device step on the CPU, for scale. Writes a flat JSON of milliseconds:
<model>_<n>dev_step_ms, and "cuda": 1 or 0.

    python3 bench/reference/dp_overhead.py --batch 128 --steps 15 --threads 2 --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_convnet import ConvNet  # noqa: E402  (the same model as weft's nn::ConvNet)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """weft's nn::ResNet(1, 10, {1, 1, 1})."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def time_steps(model, x, y, steps, sync):
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(3 + steps):
        start = time.perf_counter()
        sgd.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        sgd.step()
        if sync:
            torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = {"cuda": 1 if gpus >= 2 else 0}
    for name, make in (("convnet", ConvNet), ("resnet", ResNet)):
        if gpus >= 2:
            for width in (1, 2, 4):
                if width > gpus:
                    continue
                model = make().cuda(0)
                x = torch.randn(a.batch, 1, 28, 28, device="cuda:0")
                y = torch.randint(0, 10, (a.batch,), device="cuda:0")
                runner = model if width == 1 else nn.DataParallel(model, device_ids=list(range(width)))
                out[f"{name}_{width}dev_step_ms"] = time_steps(runner, x, y, a.steps, True)
        else:
            x = torch.randn(a.batch, 1, 28, 28)
            y = torch.randint(0, 10, (a.batch,))
            out[f"{name}_1dev_step_ms"] = time_steps(make(), x, y, a.steps, False)
    text = json.dumps(out, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
