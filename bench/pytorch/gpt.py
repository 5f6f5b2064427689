#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""An independent PyTorch implementation of ndmini's model and training loop,
for side-by-side speed and convergence comparisons (bench/README.md).

It reads the same deck TOML as ndmini and trains the same model (docs/model.md):
GPT-2 blocks, pre-LayerNorm (eps 1e-5), tanh GELU, tied wte, learned positions,
or the architecture the deck's model keys give (model.family = "llama":
RMSNorm, RoPE as Hugging Face's Llama rotates, SwiGLU, grouped-query
attention, no biases, an untied lm_head), AdamW (0.9, 0.95, eps 1e-8, decay
on 2-D tensors) with ndmini's warm-up + cosine schedule and global-norm
clipping, on ndmini's synthetic token stream. By default the parameters start
from ndmini's own initial values (its counter-based RNG, reproduced here in
numpy); --init-from reads them from an ndmini checkpoint instead (h5py). In
fp32 the losses follow ndmini's to rounding (tests/cli/pytorch_reference.sh).

    python3 bench/pytorch/gpt.py inputs/small.toml --precision bf16 --threads 1 --steps 8
    python3 bench/pytorch/gpt.py inputs/llama-tiny.toml --init-from ck/step_00000000 --steps 3

The last line of stdout is one JSON object with "summary": true (the keys of
ndmini's metrics summary that apply: tokens_per_s, median_step_ms, final_loss,
final_val_loss, ...); --metrics FILE writes one JSON object per step before it,
as ndmini's --metrics does.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Debian 12 has 3.11
    sys.exit("gpt.py: error: needs Python 3.11+ (tomllib) to read the deck")

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the deck ---------------------------------------------------------------

DEFAULTS = {"train": {"eval_every": 0, "eval_batches": 1, "micro_batch": 0, "grad_clip": 1.0,
                      "weight_decay": 0.1, "warmup_steps": 0, "min_lr": 0.0, "seed": 1234}}


def parse_value(text):
    """A --set value as ndmini reads it: a number where it is one, else a string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text.strip('"'))


def read_deck(path, overrides):
    try:
        with open(path, "rb") as f:
            deck = tomllib.load(f)
    except OSError as e:
        sys.exit(f"gpt.py: error: cannot read the deck '{path}': {e.strerror}")
    for section, keys in DEFAULTS.items():
        for key, value in keys.items():
            deck.setdefault(section, {}).setdefault(key, value)
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            sys.exit(f"gpt.py: error: --set '{item}': expected SECTION.KEY=VALUE, e.g. train.steps=8")
        deck.setdefault(section, {})[name] = parse_value(value)
    m, t = deck["model"], deck["train"]
    if deck.get("data", {}).get("source", "synthetic") != "synthetic":
        sys.exit("gpt.py: error: data.source: only \"synthetic\" is reproduced here; "
                 "use --set data.source=synthetic")
    if not t["micro_batch"]:
        t["micro_batch"] = t["global_batch"]
    if t["global_batch"] % t["micro_batch"]:
        sys.exit(f"gpt.py: error: train.global_batch = {t['global_batch']} is not a multiple of "
                 f"train.micro_batch = {t['micro_batch']}; change one of them")
    if m["channels"] % m["heads"]:
        sys.exit(f"gpt.py: error: model.channels = {m['channels']} is not a multiple of "
                 f"model.heads = {m['heads']}")
    resolve_architecture(m)
    return deck


def resolve_architecture(m):
    """The architecture keys as ndmini resolves them (src/config/config.cpp): GPT-2's
    defaults, model.family = "llama" setting Llama's where the deck gives none."""
    llama = m.get("family", "gpt2") == "llama"
    defaults = {"norm": "rmsnorm" if llama else "layernorm", "norm_eps": 1e-5,
                "position": "rope" if llama else "learned", "rope_theta": 10000.0,
                "mlp": "swiglu" if llama else "gelu", "ffn_hidden": 0, "kv_heads": 0,
                "tie_embeddings": not llama, "bias": not llama}
    for key, value in defaults.items():
        m.setdefault(key, value)
    if m["mlp"] == "swiglu" and not m["ffn_hidden"]:
        sys.exit("gpt.py: error: model.mlp = \"swiglu\" needs model.ffn_hidden")
    m["ffn"] = m["ffn_hidden"] or 4 * m["channels"]
    m["kv"] = m["kv_heads"] or m["heads"]
    if m["heads"] % m["kv"]:
        sys.exit(f"gpt.py: error: model.kv_heads = {m['kv']} does not divide model.heads = {m['heads']}")


# ---- ndmini's counter-based RNG (src/core/rng.hpp), vectorised in numpy ------

MASK = (1 << 64) - 1


def mix64(z):
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def mix64_int(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def stream_key(seed, name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK
    return mix64_int(h ^ mix64_int(seed & MASK))


def rng_bits(key, counters):
    with np.errstate(over="ignore"):
        return mix64(np.uint64(key) ^ mix64(counters.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))


def rng_normal(key, first, count, stddev):
    """stddev * N(0, 1) for elements [first, first + count) of stream `key`, as float32
    (Box-Muller on the two 32-bit halves, in double, as ndmini draws them)."""
    out = np.empty(count, dtype=np.float32)
    piece = 1 << 22  # bounded temporaries for the 124M-parameter deck
    for begin in range(0, count, piece):
        n = min(piece, count - begin)
        r = rng_bits(key, np.arange(first + begin, first + begin + n, dtype=np.uint64))
        u1 = ((r >> np.uint64(40)).astype(np.float64) + 1.0) / 16777216.0
        u2 = (((r & np.uint64(0xFFFFFFFF)) >> np.uint64(8)).astype(np.float64) + 1.0) / 16777216.0
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
        out[begin:begin + n] = (np.float64(np.float32(stddev)) * z).astype(np.float32)
    return out


# ---- ndmini's synthetic data (src/train/data.cpp) ---------------------------

class SyntheticData:
    """A random walk on a fixed graph over min(V, 64) tokens, two successors each."""

    def __init__(self, deck, held_out):
        m, t = deck["model"], deck["train"]
        self.T, self.B = m["seq_len"], t["global_batch"]
        self.alphabet = min(m["vocab"], 64)
        seed = t["seed"]
        graph_key = stream_key(seed, "data/synthetic/graph")
        self.walk_key = stream_key(seed, "data/synthetic/validation" if held_out else "data/synthetic/walk")
        # successor[x, coin] = bits(graph_key, 2 x + coin) mod A
        self.successor = (rng_bits(graph_key, np.arange(2 * self.alphabet, dtype=np.uint64))
                          % np.uint64(self.alphabet)).astype(np.int64).reshape(self.alphabet, 2)

    def batch(self, step):
        """(inputs, targets), each int64 [B, T]: the global batch of `step`."""
        T = self.T
        seq = np.uint64(step) * np.uint64(self.B) + np.arange(self.B, dtype=np.uint64)
        base = seq * np.uint64(T + 1)
        counters = base[:, None] + np.arange(T + 1, dtype=np.uint64)[None, :]
        r = rng_bits(self.walk_key, counters)
        x = (r[:, 0] % np.uint64(self.alphabet)).astype(np.int64)
        coins = (r[:, 1:] & np.uint64(1)).astype(np.int64)
        walk = np.empty((self.B, T + 1), dtype=np.int64)
        walk[:, 0] = x
        for t in range(T):
            x = self.successor[x, coins[:, t]]
            walk[:, t + 1] = x
        return torch.from_numpy(walk[:, :-1].copy()), torch.from_numpy(walk[:, 1:].copy())


# ---- the model (docs/model.md) ----------------------------------------------

def norm_layer(m):
    if m["norm"] == "rmsnorm":
        return RMSNorm(m["channels"], m["norm_eps"])
    return LayerNorm(m["channels"], m["norm_eps"], m["bias"])


class LayerNorm(nn.Module):
    """nn.LayerNorm with its bias optional (PyTorch 1.13's has no bias=)."""

    def __init__(self, C, eps, bias):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(T, hs, theta):
    """cos and sin [T, hs] as Hugging Face's Llama computes them (fp32 angles)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, H, KV = m["channels"], m["heads"], m["kv"]
        self.m, self.C, self.H, self.KV, self.hs = m, C, H, KV, C // H
        if KV == H:
            self.c_attn = nn.Linear(C, 3 * C, bias=m["bias"])  # rows: all q, then all k, then all v
        else:  # grouped-query attention: k and v of KV heads, each shared by H / KV query heads
            self.c_q = nn.Linear(C, C, bias=m["bias"])
            self.c_k = nn.Linear(C, KV * self.hs, bias=m["bias"])
            self.c_v = nn.Linear(C, KV * self.hs, bias=m["bias"])
        self.c_proj = nn.Linear(C, C, bias=m["bias"])

    def forward(self, x):
        B, T, C = x.shape
        hs = self.hs
        if self.KV == self.H:
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:
            q, k, v = self.c_q(x), self.c_k(x), self.c_v(x)
        q = q.view(B, T, self.H, hs).transpose(1, 2)
        k, v = (z.view(B, T, self.KV, hs).transpose(1, 2) for z in (k, v))
        if self.m["position"] == "rope":
            cos, sin = rope_tables(T, hs, self.m["rope_theta"])
            q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
            k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
        if self.KV != self.H:  # query head h reads key/value head h // (H / KV)
            k, v = (z.repeat_interleave(self.H // self.KV, dim=1) for z in (k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        probs = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, hidden, bias = m["channels"], m["ffn"], m["bias"]
        self.swiglu = m["mlp"] == "swiglu"
        if self.swiglu:  # down(silu(gate(x)) * up(x))
            self.c_gate = nn.Linear(C, hidden, bias=bias)
            self.c_up = nn.Linear(C, hidden, bias=bias)
        else:
            self.c_fc = nn.Linear(C, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, C, bias=bias)

    def forward(self, x):
        if self.swiglu:
            return self.c_proj(F.silu(self.c_gate(x)) * self.c_up(x))
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.ln_1 = norm_layer(m)
        self.attn = Attention(m)
        self.ln_2 = norm_layer(m)
        self.mlp = MLP(m)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["channels"]
        self.m = m
        self.wte = nn.Embedding(m["vocab"], C)
        if m["position"] == "learned":
            self.wpe = nn.Embedding(m["seq_len"], C)
        self.h = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.ln_f = norm_layer(m)
        if not m["tie_embeddings"]:
            self.lm_head = nn.Linear(C, m["vocab"], bias=False)

    def forward(self, tokens, targets):
        """The mean cross-entropy over the tokens (computed in fp32)."""
        T = tokens.shape[1]
        x = self.wte(tokens)
        if self.m["position"] == "learned":
            x = x + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.h:
            x = block(x)
        head = self.wte.weight if self.m["tie_embeddings"] else self.lm_head.weight
        logits = F.linear(self.ln_f(x), head)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def ndmini_name(torch_name):
    """'h.0.attn.c_attn.weight' -> 'h/0/attn/c_attn/weight'; 'wte.weight' -> 'wte'."""
    if torch_name in ("wte.weight", "wpe.weight"):
        return torch_name.split(".")[0]
    return torch_name.replace(".", "/")


def load_parameters(model, folder):
    """Every parameter from an ndmini checkpoint folder (step_NNNNNNNN/checkpoint.h5:
    /model/<name>, docs/checkpoint-format.md); the names and shapes must match."""
    try:
        import h5py
    except ModuleNotFoundError:
        sys.exit("gpt.py: error: --init-from needs h5py (Debian: python3-h5py)")
    path = os.path.join(folder, "checkpoint.h5")
    if not os.path.isfile(path):
        sys.exit(f"gpt.py: error: --init-from {folder}: no checkpoint.h5 there (give a step_NNNNNNNN folder)")
    with h5py.File(path, "r") as f, torch.no_grad():
        names = set()
        f["model"].visit(lambda n: names.add(n) if isinstance(f["model"][n], h5py.Dataset) else None)
        for name, p in model.named_parameters():
            full = ndmini_name(name)
            if full not in names:
                sys.exit(f"gpt.py: error: {path} has no tensor model/{full}: the deck's architecture differs")
            values = f["model"][full][()]
            if tuple(values.shape) != tuple(p.shape):
                sys.exit(f"gpt.py: error: model/{full} is {list(values.shape)} in {path}, {list(p.shape)} here")
            p.copy_(torch.from_numpy(values))
            names.discard(full)
        if names:
            sys.exit(f"gpt.py: error: {path} holds tensors this model lacks: {', '.join(sorted(names)[:4])}")


def init_parameters(model, m, seed, how):
    """docs/model.md's initialisation: from ndmini's RNG ('ndmini') or torch's ('torch')."""
    std_proj = 0.02 / math.sqrt(2.0 * m["layers"])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = ndmini_name(name)
            is_bias = full.endswith("bias")
            if "ln_" in full:
                p.fill_(0.0 if is_bias else 1.0)
            elif is_bias:
                p.zero_()
            else:
                std = std_proj if "c_proj/weight" in full else 0.02
                if how == "ndmini":
                    values = rng_normal(stream_key(seed, full), 0, p.numel(), std)
                    p.copy_(torch.from_numpy(values).view_as(p))
                else:
                    p.normal_(0.0, std, generator=generator)


# ---- the schedule and the step (src/train/optimizer.cpp, trainer.cpp) --------

def learning_rate(t, step):
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    span = max(1, t["steps"] - 1 - t["warmup_steps"])
    progress = min(1.0, (step - t["warmup_steps"]) / span)
    return t["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (t["lr"] - t["min_lr"])


class Trainer:
    def __init__(self, deck, precision):
        self.m, self.t = deck["model"], deck["train"]
        self.autocast = precision == "bf16"
        self.model = GPT(self.m)
        self.data = SyntheticData(deck, held_out=False)
        self.val_data = SyntheticData(deck, held_out=True) if self.t["eval_every"] > 0 else None
        params = list(self.model.named_parameters())
        groups = [{"params": [p for _, p in params if p.dim() == 2], "weight_decay": self.t["weight_decay"]},
                  {"params": [p for _, p in params if p.dim() != 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=self.t["lr"], betas=(0.9, 0.95), eps=1e-8)
        # ndmini stores the key bias's gradient as an exact zero (it cannot change any output:
        # without RoPE it adds q . b_k to every score of a softmax row).
        C = self.m["channels"]
        self.key_bias_grads = []
        if self.m["bias"] and self.m["position"] == "learned":
            for b in self.model.h:
                if self.m["kv"] == self.m["heads"]:
                    self.key_bias_grads.append((b.attn.c_attn.bias, slice(C, 2 * C)))
                else:
                    self.key_bias_grads.append((b.attn.c_k.bias, slice(None)))

    def loss(self, inputs, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            return self.model(inputs, targets)

    def validation_loss(self):
        with torch.no_grad():
            losses = [self.loss(*self.val_data.batch(j)).item() for j in range(self.t["eval_batches"])]
        return sum(losses) / len(losses)

    def step(self, step):
        """One optimizer step over the global batch of `step`: (loss, grad norm, lr)."""
        inputs, targets = self.data.batch(step)
        mb = self.t["micro_batch"]
        micro = inputs.shape[0] // mb
        total = 0.0
        for i in range(micro):
            loss = self.loss(inputs[i * mb:(i + 1) * mb], targets[i * mb:(i + 1) * mb]) / micro
            loss.backward()
            total += loss.item()
        for bias, keys in self.key_bias_grads:
            bias.grad[keys] = 0
        clip = self.t["grad_clip"]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        lr = learning_rate(self.t, step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return total, float(grad_norm), lr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deck", help="an ndmini deck (TOML), e.g. inputs/small.toml")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward and loss")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--steps", type=int, help="train.steps (default: the deck's)")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="leading steps left out of the timing medians (default 1, as ndmini)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a deck key, as ndmini's --set (repeatable)")
    ap.add_argument("--init", choices=("ndmini", "torch"), default="ndmini",
                    help="initial parameters: ndmini's RNG (default; same values as ndmini) or torch's")
    ap.add_argument("--init-from", metavar="FOLDER",
                    help="initial parameters from an ndmini checkpoint step folder (needs h5py), e.g. "
                         "ck/step_00000000 of a run with checkpoint.at_start = true")
    ap.add_argument("--metrics", help="write one JSON object per step, then the summary, to this file")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    args = ap.parse_args()

    deck = read_deck(args.deck, args.set)
    t = deck["train"]
    if args.steps is not None:
        t["steps"] = args.steps
    if args.threads < 1 or args.warmup_steps < 0 or t["steps"] < 1:
        sys.exit("gpt.py: error: --threads and --steps must be at least 1, --warmup-steps at least 0")
    if args.warmup_steps >= t["steps"]:
        sys.exit(f"gpt.py: error: --warmup-steps {args.warmup_steps} leaves no timed step of "
                 f"{t['steps']}; train more steps or warm up fewer")
    torch.set_num_threads(args.threads)
    torch.manual_seed(t["seed"])
    trainer = Trainer(deck, args.precision)
    if args.init_from:
        load_parameters(trainer.model, args.init_from)
    else:
        init_parameters(trainer.model, deck["model"], t["seed"], args.init)
    tokens_per_step = t["global_batch"] * deck["model"]["seq_len"]
    if not args.quiet:
        print(f"pytorch {torch.__version__} | {args.precision} | {torch.get_num_threads()} thread(s) | "
              f"params {sum(p.numel() for p in trainer.model.parameters())} | steps {t['steps']} | "
              f"global batch {t['global_batch']} x {deck['model']['seq_len']} tokens, micro-batch "
              f"{t['micro_batch']} | init {args.init_from or args.init}", flush=True)

    metrics = open(args.metrics, "w") if args.metrics else None
    step_ms, last_val = [], (None, None)
    loss = None
    for step in range(t["steps"]):
        record = {"step": step}
        if trainer.val_data is not None and (step % t["eval_every"] == 0 or step + 1 == t["steps"]):
            record["val_loss"] = trainer.validation_loss()
            last_val = (record["val_loss"], step)
        start = time.perf_counter()
        loss, grad_norm, lr = trainer.step(step)
        ms = 1e3 * (time.perf_counter() - start)
        step_ms.append(ms)
        record.update(loss=loss, lr=lr, grad_norm=grad_norm, step_ms=ms, tokens_per_s=tokens_per_step / ms * 1e3)
        if not math.isfinite(loss):
            sys.exit(f"gpt.py: error: the loss of step {step} is {loss}; lower train.lr")
        if metrics:
            metrics.write(json.dumps(record) + "\n")
        if not args.quiet and (step % t.get("log_every", 1) == 0 or step + 1 == t["steps"] or "val_loss" in record):
            val = f" | val_loss {record['val_loss']:.6f}" if "val_loss" in record else ""
            print(f"step {step:6d} | loss {loss:.6f} | lr {lr:.3e} | grad norm {grad_norm:.4f} | "
                  f"{ms:9.1f} ms | {record['tokens_per_s']:9.0f} tok/s{val}", flush=True)

    timed = step_ms[args.warmup_steps:]
    median = statistics.median(timed)
    summary = {"summary": True, "implementation": "pytorch", "torch": torch.__version__,
               "precision": args.precision, "threads": torch.get_num_threads(), "steps": t["steps"],
               "steps_timed": len(timed), "global_batch": t["global_batch"], "micro_batch": t["micro_batch"],
               "seq_len": deck["model"]["seq_len"], "median_step_ms": median,
               "tokens_per_s": tokens_per_step / median * 1e3,
               "min_step_ms": min(timed), "max_step_ms": max(timed), "final_loss": loss,
               "final_val_loss": last_val[0], "final_val_step": last_val[1]}
    if metrics:
        metrics.write(json.dumps(summary) + "\n")
        metrics.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
