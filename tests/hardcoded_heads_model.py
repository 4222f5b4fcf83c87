#!/usr/bin/env python3
"""Writes a model.pt whose attention region follows the tensor-parallel contract's shape (tp_enter,
tp_partial, tp_exit) and declares a tp layout, but hard-codes its head count, so it cannot run on
a slice: `piper-model verify --tp 2` must refuse it, naming the region and the line.
Usage: hardcoded_heads_model.py OUT.pt"""
import json
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import piper_export  # noqa: E402

D, HEADS, SEQ = 32, 4, 16


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(256, D)

    def forward(self, idx):
        return self.wte(idx)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn_weight = nn.Parameter(torch.randn(3 * D, D) * 0.02)
        self.c_proj_weight = nn.Parameter(torch.randn(D, D) * 0.02)

    @torch.jit.export
    def tp_enter(self, x):
        return x

    @torch.jit.export
    def tp_partial(self, h):
        B, T = h.size(0), h.size(1)
        q, k, v = nn.functional.linear(h, self.c_attn_weight).split(self.c_attn_weight.size(0) // 3, 2)
        q = q.reshape(B, T, 4, 8).transpose(1, 2)  # the head count written in: breaks on a slice
        k = k.reshape(B, T, 4, 8).transpose(1, 2)
        v = v.reshape(B, T, 4, 8).transpose(1, 2)
        y = torch.softmax(q @ k.transpose(-2, -1), -1) @ v
        return nn.functional.linear(y.transpose(1, 2).reshape(B, T, -1), self.c_proj_weight)

    @torch.jit.export
    def tp_exit(self, x, s):
        return x + s

    def forward(self, x):
        return self.tp_exit(x, self.tp_partial(self.tp_enter(x)))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(D, 256)

    def forward(self, x):
        return self.out(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embed()
        self.attn = Attention()
        self.head = Head()

    def forward(self, idx):
        return self.head(self.attn(self.embed(idx)))


if __name__ == "__main__":
    m = Model()
    out = sys.argv[1]
    piper_export.export(m, torch.zeros(1, SEQ, dtype=torch.long), out, ["embed", "attn", "head"],
                        kinds={"attn": "attention"})
    # The exporter writes no tp layout yet: declare the one the region claims.
    extra = {"piper/manifest.json": ""}
    scripted = torch.jit.load(out, _extra_files=extra)
    manifest = json.loads(extra["piper/manifest.json"])
    for r in manifest["regions"]:
        if r["name"] == "attn":
            r["tp"] = {"dim": "heads", "count": HEADS}
            for p in r["params"]:
                p["shard"] = {"dim": 0, "blocks": 3} if p["name"] == "c_attn_weight" else {"dim": 1}
    torch.jit.save(scripted, out, _extra_files={"piper/manifest.json": json.dumps(manifest)})
