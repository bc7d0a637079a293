#!/usr/bin/env python3
"""nn/models/gpt.h in PyTorch: the same GPT, parameter names, arithmetic and data, for two jobs.

    gpt.py equivalence DIR     weft's 20 AdamW steps (tests/nn/test_gpt.cpp) replayed in PyTorch
    gpt.py train [flags]       training throughput on the text weft-train --model gpt reads

The model (every name as weft's state_dict, so weft's safetensors load without renaming):
    embed.wte.weight [V, C], embed.wpe.weight [block_size, C]
    h<i>.ln_1, h<i>.attn.c_attn [3C, C], h<i>.attn.c_proj, h<i>.ln_2, h<i>.mlp.c_fc [4C, C], h<i>.mlp.c_proj
    head.ln_f, and head.weight [V, C] only when untied (tied, the head multiplies by embed.wte.weight)
with exact (erf) GELU, LayerNorm eps 1e-5, and causal attention softmax(q k^T / sqrt(D) + mask) v:
F.scaled_dot_product_attention from torch 2 on, the same formula op by op before (torch 1.13 has no
fused attention). The loss is the mean cross-entropy of the next-token logits (nn::next_token_loss).

equivalence DIR: DIR (or each sub-folder of it that has a config.json) holds what the test case
"GPT float64: 20 AdamW steps match PyTorch's losses" writes when WEFT_GPT_REFERENCE_DIR names it:
    config.json            the GPTConfig, the AdamW hyperparameters and the number of steps
    weights.safetensors    the initial state_dict (float64)
    batches.safetensors    x and y, int64 [steps, B, T]
    losses_float64.txt     weft's losses (optional; losses_float32.txt the same from float32)
It trains a copy in float64 and one in float32 (the float64 weights rounded) with torch.optim.AdamW
over nanoGPT's two groups (dim >= 2 with the weight decay, the rest without: optim::weight_decay_groups),
prints each run's losses as a C++ initializer list (17 significant digits, what the test keeps), and
compares weft's: float64 to within 1e-10 and float32 to within 1e-5, each relative to 1 + |loss|.
Exits 1 when a comparison fails, 77 (CTest's skip) when torch cannot be imported.

train: bench/train_gpt's reference. The corpus is read as data/text_dataset.cpp reads it (a file, or
a folder's text files in byte-wise name order; the first 90% trains), cut into non-overlapping
windows of block_size + 1 bytes, and drawn in a shuffled order per epoch. AdamW (nanoGPT's groups,
weight decay 0.1, betas (0.9, 0.95)) at a constant lr. tokens/s counts the steps after --warmup.
"""
import argparse
import json
import math
import os
import stat
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as error:
    print(f"skipped: {error} (Debian's python3-torch: tools/install-deps --bench)")
    sys.exit(77)

DEFAULT_CORPUS = "/usr/share/games/fortunes"
VOCAB_SIZE = 256  # bytes
FLOAT64_TOLERANCE = 1e-10
# Measured on the test's two cases: float64 within 2.5e-16, float32 within 1.3e-7 (as far as
# PyTorch's own float32 run is from its float64 one); the bounds leave room for other CPUs.
FLOAT32_TOLERANCE = 1e-5
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# --- the model ------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.dropout = c["dropout"]
        self.resid_dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        p = self.dropout if self.training else 0.0
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = F.dropout(F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1), p, self.training)
            y = att @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()  # exact: approximate='none'
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


def layer_norm(c):
    ln = nn.LayerNorm(c["n_embd"], eps=1e-5)
    if not c["bias"]:
        ln.register_parameter("bias", None)
    return ln


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = layer_norm(c)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = layer_norm(c)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.drop = nn.Dropout(c["dropout"])

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class Head(nn.Module):
    """ln_f, then logits = x @ weight^T; tied, the weight is the caller's (embed.wte.weight), so
    the head registers none and the state_dict lists the tie once, as weft's does."""

    def __init__(self, c):
        super().__init__()
        self.ln_f = layer_norm(c)
        if not c["tie_embeddings"]:
            self.weight = nn.Parameter(torch.empty(c["vocab_size"], c["n_embd"]))

    def forward(self, x, tied_weight):
        return F.linear(self.ln_f(x), tied_weight if tied_weight is not None else self.weight)


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.embed = Embedding(c)
        self.blocks = []
        for i in range(c["n_layer"]):
            self.add_module(f"h{i}", Block(c))
            self.blocks.append(getattr(self, f"h{i}"))
        self.head = Head(c)
        self.init_weights()

    def init_weights(self):
        """GPT-2's, as nn/models/gpt.h: N(0, 0.02), biases 0, the residual projections
        N(0, 0.02 / sqrt(2 n_layer)); LayerNorms keep 1 and 0. (Drawn from torch's generator:
        the equivalence loads weft's values instead.)"""
        for name, p in self.named_parameters():
            if ".ln_" in name or name.startswith("head.ln_f"):
                continue
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * self.config["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, self.embed.wte.weight if self.config["tie_embeddings"] else None)


def next_token_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def weight_decay_groups(model, weight_decay):
    """nanoGPT's configure_optimizers split, in named_parameters order (optim::weight_decay_groups)."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def config_of(args_or_dict):
    d = args_or_dict if isinstance(args_or_dict, dict) else vars(args_or_dict)
    return {"vocab_size": d.get("vocab_size", VOCAB_SIZE), "block_size": d["block_size"], "n_layer": d["n_layer"],
            "n_head": d["n_head"], "n_embd": d["n_embd"], "dropout": d.get("dropout", 0.0),
            "bias": d.get("bias", True), "tie_embeddings": d.get("tie_embeddings", True)}


# --- equivalence ----------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "I64": "<i8", "I32": "<i4", "U8": "u1"}


def load_safetensors(path):
    """name -> numpy array: an 8-byte little-endian header length N, N bytes of JSON (dtype, shape,
    data_offsets relative to the data that follows), then the data."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[info["dtype"]])
        out[name] = np.frombuffer(blob, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                  offset=8 + n + begin).reshape(info["shape"])
    return out


def read_losses(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [float(line) for line in f if line.strip()]


def replay(case_dir, config, dtype):
    """The 20 steps of the weft test in PyTorch: weft's initial weights, batches and AdamW."""
    model = GPT(config_of(config)).to(dtype)
    weights = load_safetensors(os.path.join(case_dir, "weights.safetensors"))
    state = model.state_dict()
    if sorted(weights) != sorted(state):
        sys.exit(f"{case_dir}: weft's names {sorted(weights)} differ from PyTorch's {sorted(state)}")
    # Rounded to `dtype` from float64, as weft's Module::to(Float32) does it.
    model.load_state_dict({k: torch.from_numpy(v.copy()).to(dtype) for k, v in weights.items()})
    batches = load_safetensors(os.path.join(case_dir, "batches.safetensors"))
    xs, ys = torch.from_numpy(batches["x"].copy()), torch.from_numpy(batches["y"].copy())
    opt = torch.optim.AdamW(weight_decay_groups(model, config["weight_decay"]), lr=config["lr"],
                            betas=tuple(config["betas"]), eps=config["eps"])
    losses = []
    for step in range(config["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model(xs[step]), ys[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_relative_difference(a, b):
    """max |a - b| / (1 + |b|); NaN compares as infinitely far."""
    worst = 0.0
    for x, y in zip(a, b):
        d = abs(x - y) / (1 + abs(y))
        worst = math.inf if math.isnan(d) else max(worst, d)
    return worst


def initializer_list(values):
    return "{" + ", ".join(f"{v:.17g}" for v in values) + "}"


def equivalence(directory):
    cases = [directory] if os.path.exists(os.path.join(directory, "config.json")) else sorted(
        os.path.join(directory, d) for d in os.listdir(directory)
        if os.path.exists(os.path.join(directory, d, "config.json")))
    if not cases:
        sys.exit(f"{directory}: no config.json in it or in a sub-folder (see `gpt.py --help`)")
    failures = []
    for case_dir in cases:
        with open(os.path.join(case_dir, "config.json")) as f:
            config = json.load(f)
        name = os.path.basename(os.path.normpath(case_dir))
        print(f"# {name}: {json.dumps(config)}")
        runs = {}
        for label, dtype in (("float64", torch.float64), ("float32", torch.float32)):
            runs[label] = replay(case_dir, config, dtype)
            print(f"PyTorch {torch.__version__} {label} losses:\n{initializer_list(runs[label])}")
        own = max_relative_difference(runs["float32"], runs["float64"])
        print(f"PyTorch float32 against float64: max |difference| / (1 + |loss|) = {own:.3g}")
        for label, tolerance in (("float64", FLOAT64_TOLERANCE), ("float32", FLOAT32_TOLERANCE)):
            weft = read_losses(os.path.join(case_dir, f"losses_{label}.txt"))
            if weft is None:
                print(f"weft {label}: no losses_{label}.txt, nothing to compare")
                continue
            if len(weft) != len(runs[label]):
                failures.append(f"{name} {label}: weft has {len(weft)} losses, PyTorch {len(runs[label])}")
                continue
            diff = max_relative_difference(weft, runs[label])
            ok = diff <= tolerance
            print(f"weft {label} against PyTorch {label}: max |weft - torch| / (1 + |torch|) = {diff:.3g} "
                  f"(tolerance {tolerance:g}): {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(f"{name} {label}: {diff:.3g} > {tolerance:g}\n  weft    {initializer_list(weft)}\n"
                                f"  PyTorch {initializer_list(runs[label])}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


# --- train ----------------------------------------------------------------------------

def read_corpus(path):
    """Note [What a text corpus reads] of data/text_dataset.h: a file's bytes, or a folder's regular,
    non-hidden, non-*.dat, non-empty files without NUL bytes (symlinks and sub-folders skipped),
    concatenated in byte-wise name order."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            data = f.read()
        if not data or b"\0" in data:
            sys.exit(f"{path}: empty or binary (a NUL byte), not text")
        return data
    parts = []
    for name in sorted(os.listdir(os.fsencode(path))):
        full = os.path.join(os.fsencode(path), name)
        mode = os.lstat(full).st_mode
        if not stat.S_ISREG(mode) or name.startswith(b".") or name.endswith(b".dat"):
            continue
        with open(full, "rb") as f:
            data = f.read()
        if data and b"\0" not in data:
            parts.append(data)
    if not parts:
        sys.exit(f"{path}: no text files")
    return b"".join(parts)


def blas_library():
    """The BLAS this process loaded (Linux: from /proc/self/maps), or "". Debian's python3-torch
    calls whichever libblas.so.3 the alternatives system points to, which is the unoptimised
    reference one (libblas3) unless an optimised one such as libopenblas0-openmp is installed;
    PyTorch's CPU matrix products then run some 5-20 times slower."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libblas" in line or "libopenblas" in line}
    except OSError:
        return ""
    return ", ".join(sorted(paths))


def train(args):
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    corpus = read_corpus(args.data)
    train_bytes = corpus[:int(math.floor(len(corpus) * 0.9))]
    T, B = args.block_size, args.batch_size
    windows = (len(train_bytes) - 1) // T  # Note [Text windows]
    if windows < B:
        sys.exit(f"{args.data}: {windows} training windows of {T + 1} bytes, fewer than a batch of {B}")
    data = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
    # Window i is data[i T, i T + T + 1): an index [windows, T + 1] gathers a batch in one op.
    offsets = torch.arange(T + 1)
    model = GPT(config_of(args)).to(device)
    opt = torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95))
    order, cursor = torch.randperm(windows), 0
    step_seconds, losses = [], []
    for step in range(args.steps):
        if cursor + B > windows:
            order, cursor = torch.randperm(windows), 0
        idx = order[cursor:cursor + B]
        cursor += B
        batch = data[idx[:, None] * T + offsets].long()
        start = time.perf_counter()
        x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the device: the step's time is its own
        step_seconds.append(time.perf_counter() - start)
        if args.print_every and (step + 1) % args.print_every == 0:
            print(f"step {step + 1}: loss {losses[-1]:.4f}, {step_seconds[-1] * 1e3:.1f} ms", flush=True)
    timed = step_seconds[args.warmup:] or step_seconds
    blas = blas_library() if device.type == "cpu" else ""
    tokens_per_second = len(timed) * B * T / sum(timed)
    metrics = {"benchmark": "train_gpt", "framework": "pytorch", "torch_version": torch.__version__,
               "device": args.device, "threads": torch.get_num_threads(),
               "attention": "scaled_dot_product_attention" if HAS_SDPA else "math",
               "blas": blas, "reference_blas": int("/blas/libblas.so" in blas),
               "n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd, "block_size": T,
               "batch_size": B, "steps": args.steps, "warmup": args.warmup,
               "parameters": sum(p.numel() for p in model.parameters()),
               "tokens_per_second": tokens_per_second, "median_step_ms": float(np.median(timed)) * 1e3,
               "first_loss": losses[0], "final_loss": losses[-1]}
    print(f"pytorch {torch.__version__}: {metrics['parameters']} parameters, {tokens_per_second:.0f} tokens/s "
          f"(median step {metrics['median_step_ms']:.1f} ms, {torch.get_num_threads()} threads), "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" + (f"; BLAS {blas}" if blas else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=2)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["equivalence", "train"])
    p.add_argument("dir", nargs="?", help="equivalence: the folder weft's test wrote")
    p.add_argument("--data", default=DEFAULT_CORPUS, help="train: a text file or a folder of text files")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of tokens/s")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--print-every", type=int, default=0)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.command == "equivalence":
        if not args.dir:
            p.error("equivalence needs DIR")
        return equivalence(args.dir)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
