#!/usr/bin/env python3
"""Writes a model.pt whose last region fails on batches larger than one sample (the exporter's
check uses one), to test that a failing op ends the whole job with a clear message."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import piper_export  # noqa: E402


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(256, 16)

    def forward(self, idx):
        return self.wte(idx)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 256)

    def forward(self, x):
        if x.size(0) > 1:
            raise RuntimeError("boom: this region fails on batches larger than one")
        return self.out(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embed()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = Head()

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


if __name__ == "__main__":
    m = Model()
    piper_export.export(m, torch.zeros(1, 16, dtype=torch.long), sys.argv[1],
                        piper_export.expand(m, "embed", "layers", "head"))
