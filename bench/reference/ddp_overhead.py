"""PyTorch side of bench/ddp_overhead: DistributedDataParallel (Gloo, CPU) on the same models.

For each world size, spawns that many processes (torch.multiprocessing, Gloo over
loopback); each trains the model with DDP on its own batch and reports the median step; at
world size 1 the plain model is timed too. Writes a flat JSON: <model>_<n>ranks_ddp_step_ms
and <model>_1ranks_plain_step_ms (milliseconds), <model>_<n>ranks_optimizer_state_bytes (the
optimizer state of the rank that keeps the most). --comm-hook fp16 registers PyTorch's
fp16_compress_hook (its Gloo has no bfloat16); --comm-hook powersgd its powerSGD_hook at rank
1, compressing from the third step. --optimizer sgd (with momentum) or adam;
--zero wraps it in torch.distributed.optim.ZeroRedundancyOptimizer. --join times the DDP
steps inside `with Join([ddp, ...])` (even inputs: what the join's announcements cost).
--local-sgd PERIOD trains with post_localSGD_hook (local from the third step, no gradient
all-reduce after it) and a PostLocalSGDOptimizer averaging every PERIOD steps; the steps
then differ, so it reports their mean instead of the median. --device-type cuda puts rank r on
GPU r mod the GPU count with NCCL (ranks sharing a GPU get their own NCCL_HOSTID and NCCL's
socket transport, as weft's benchmark sets) and ends each timed step with
torch.cuda.synchronize(); without CUDA it exits with an error.

    python3 bench/reference/ddp_overhead.py --model all --batch 64 --steps 15 --ranks 1,2,4 --json out.json
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
from torch.distributed.algorithms.join import Join
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.optim import PostLocalSGDOptimizer, ZeroRedundancyOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_overhead import ResNet  # noqa: E402  (weft's nn::ResNet(1, 10, {1, 1, 1}))
from train_convnet import ConvNet  # noqa: E402


def make_optimizer(params, args, shard):
    kind, options = (torch.optim.Adam, {"lr": 0.001}) if args.optimizer == "adam" else (
        torch.optim.SGD, {"lr": 0.01, "momentum": 0.9})
    if shard:
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, **options)
    return kind(params, **options)


def state_bytes(optimizer):
    """The bytes of state tensors this rank keeps (a sharded optimizer: its shard's)."""
    own = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(t.numel() * t.element_size() for state in own.state.values() for t in state.values()
               if torch.is_tensor(t) and t.dim() > 0)


def timed_step(model, optimizer, x, y, steps, use_mean=False):
    """The median of `steps` steps after 3 warm-up ones (their mean with use_mean), in ms."""
    times = []
    for i in range(3 + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        if i >= 3:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.mean(times) if use_mean else statistics.median(times)


def rank_main(rank, world, port, args, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, args.threads // world))
    cuda = args.device_type == "cuda"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        if world > torch.cuda.device_count():
            os.environ.update({"NCCL_HOSTID": f"reference-rank{rank}", "NCCL_SOCKET_IFNAME": "lo",
                               "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    results = {}
    names = ["convnet", "resnet"] if args.model == "all" else [args.model]
    for name in names:
        make = ConvNet if name == "convnet" else ResNet
        torch.manual_seed(100 + rank)
        x = torch.randn(args.batch, 1, 28, 28).to(device)
        y = torch.randint(0, 10, (args.batch,)).to(device)
        if world == 1:
            plain = make().to(device)
            results[f"{name}_1ranks_plain_step_ms"] = timed_step(
                plain, make_optimizer(plain.parameters(), args, False), x, y, args.steps)
        # PyTorch's first bucket takes its cap from this module constant (1 MiB), not from
        # bucket_cap_mb (its own tests set it the same way); weft's benchmark caps every
        # bucket, the first included, at --bucket-mb, so both split the gradients alike.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * 2**20)
        ddp = torch.nn.parallel.DistributedDataParallel(make().to(device), bucket_cap_mb=args.bucket_mb)
        if args.comm_hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        if args.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                start_powerSGD_iter=2)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        optimizer = make_optimizer(ddp.parameters(), args, args.zero)
        if args.local_sgd:
            state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=2,
                                                         post_local_gradient_allreduce=False)
            ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
            optimizer = PostLocalSGDOptimizer(optimizer, averagers.PeriodicModelAverager(args.local_sgd, 2))
        joinables = [ddp] + ([optimizer] if args.zero else [])
        with Join(joinables, enable=args.join):
            step_ms = timed_step(ddp, optimizer, x, y, args.steps, args.local_sgd > 0)
        stats = torch.tensor([step_ms, state_bytes(optimizer)], dtype=torch.float64).to(device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        stats = stats.cpu()
        results[f"{name}_{world}ranks_ddp_step_ms"] = stats[0].item()
        results[f"{name}_{world}ranks_optimizer_state_bytes"] = stats[1].item()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="all")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--comm-hook", default="allreduce", choices=["allreduce", "fp16", "powersgd"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--zero", action="store_true")
    p.add_argument("--join", action="store_true")
    p.add_argument("--local-sgd", type=int, default=0)
    p.add_argument("--device-type", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.device_type == "cuda" and not torch.cuda.is_available():
        sys.exit("ddp_overhead.py: --device-type cuda: this PyTorch has no CUDA device")
    out = {}
    for world in [int(w) for w in args.ranks.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        mp.spawn(rank_main, args=(world, free_port(), args, path), nprocs=world, join=True)
        with open(path) as f:
            out.update(json.load(f))
        os.remove(path)
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
