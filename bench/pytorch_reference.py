#!/usr/bin/env python3
"""PyTorch's side of bench_compile_modes / bench_lora, for comparing on one machine (issue 31).

Not part of the build, the tests or CI, and nothing in fusetune depends on it: it needs PyTorch,
which fusetune does not use. On Debian 12: `apt-get install python3-torch` (PyTorch 1.13, eager
mode only: torch.compile came with 2.0), then run it with Debian's /usr/bin/python3:

    /usr/bin/python3 bench/pytorch_reference.py --shape mid --steps 6 --threads 2 --dtypes fp32,bf16

The model is the one bench/step_runner.h builds for the shape (a Llama block: RMSNorm, RoPE,
grouped-query causal attention, SwiGLU; untied head), trained on random tokens, batch 4 x 256:
forward, cross-entropy over the whole vocabulary, backward, AdamW (lr 1e-4). bf16 casts the
model to bfloat16 (parameters, activations and AdamW state), PyTorch's pure-bf16 training.
Prints the median step of steps 3..N as tokens/s, as the fusetune benches do.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (vocab, dim, layers, heads, kv_heads, ffn, batch, seq), as bench/step_runner.h has them.
SHAPES = {
    "L3-micro": (128256, 256, 4, 4, 2, 768, 4, 256),
    "mid": (32000, 512, 8, 8, 4, 1408, 4, 256),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, head_dim, theta=500000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), inv)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):  # x [B, H, T, D], rotating interleaved halves
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + self.o(a)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, ffn, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(seq, dim // heads)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        return self.head(self.norm(x))


def run(shape, dtype, steps):
    vocab, dim, layers, heads, kv_heads, ffn, batch, seq = SHAPES[shape]
    torch.manual_seed(0)
    model = Model(vocab, dim, layers, heads, kv_heads, ffn, seq).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for s in range(steps):
        g = torch.Generator().manual_seed(99 + s)
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times[min(2, steps - 1):])
    return batch * seq / median, loss.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="mid", choices=sorted(SHAPES))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", default="fp32,bf16")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"PyTorch {torch.__version__}, eager, {a.threads} threads, shape {a.shape}")
    for name in a.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        tps, loss = run(a.shape, dtype, a.steps)
        print(f"{a.shape:10s} {name:5s} {tps:9.1f} tokens/s   last loss {loss:.4f}")


if __name__ == "__main__":
    main()
