"""PyTorch reference for weft-train: the same models, data, optimizer and metrics.

Reads Fashion-MNIST from the same IDX files weft reads (numpy + gzip, no torchvision),
normalises with the same mean and std, trains with the same optimizer settings, and
writes the same metrics JSON as `weft-train --metrics-json`:
test_accuracy, final_loss, images_per_second, epochs, world_size, mode, device.

    python3 bench/reference/train_convnet.py --model convnet --optimizer sgd --lr 0.01 \
        --momentum 0.9 --batch-size 100 --epochs 3 --device cpu --seed 0 --json out.json
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


class ConvNet(nn.Module):
    """The ConvNet of nn/models/convnet.h, ReLUs included."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).flatten(1))


class MLP(nn.Module):
    def __init__(self, hidden=(256, 128), num_classes=10):
        super().__init__()
        sizes = [784, *hidden]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.out = nn.Linear(sizes[-1], num_classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.out(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="convnet", choices=["convnet", "mlp"])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--steps-per-epoch", type=int, default=0, help="stop each epoch after N steps (0: all)")
    p.add_argument("--json", default="")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    train_x, train_y = load(args.data_dir, "train")
    test_x, test_y = load(args.data_dir, "t10k")
    model = (ConvNet() if args.model == "convnet" else MLP()).to(device)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    elif args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    n = train_x.shape[0]
    steps = n // args.batch_size
    if args.steps_per_epoch:
        steps = min(steps, args.steps_per_epoch)
    images, seconds, loss = 0, 0.0, float("nan")
    accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(n)
        start = time.perf_counter()
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            x, y = train_x[idx].to(device), train_y[idx].to(device)
            opt.zero_grad(set_to_none=True)
            out = F.cross_entropy(model(x), y)
            out.backward()
            opt.step()
        loss = out.item()
        if device.type == "cuda":
            torch.cuda.synchronize()
        epoch_seconds = time.perf_counter() - start
        seconds += epoch_seconds
        images += steps * args.batch_size
        model.eval()
        with torch.no_grad():
            correct = 0
            for i in range(0, test_x.shape[0], 1000):
                pred = model(test_x[i:i + 1000].to(device)).argmax(1)
                correct += (pred.cpu() == test_y[i:i + 1000]).sum().item()
        accuracy = correct / test_x.shape[0]
        print(f"epoch {epoch + 1}: loss {loss:.4f}, test accuracy {accuracy:.4f}, "
              f"{steps * args.batch_size / epoch_seconds:.0f} images/s (training)", flush=True)

    metrics = {"test_accuracy": accuracy, "final_loss": loss, "images_per_second": images / seconds,
               "epochs": args.epochs, "world_size": 1, "mode": "single", "device": args.device,
               "framework": f"pytorch {torch.__version__}", "threads": torch.get_num_threads()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=2)


if __name__ == "__main__":
    main()
