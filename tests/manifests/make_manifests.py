#!/usr/bin/env python3
"""Writes the example region manifests used by tests (gpt8.json, moe8.json); stdlib only.

Same layout piper-model will write (docs/manifest.md). Re-run after changing the format:
    python3 tests/manifests/make_manifests.py tests/manifests
"""
import json
import math
import sys


def param(name, shape, dtype="float32"):
    return {"name": name, "shape": shape, "dtype": dtype, "bytes": math.prod(shape) * 4}


def act(shape, dtype="float32"):
    return {"shape": shape, "dtype": dtype}


def linear_flops(t, fan_in, fan_out):
    return 2 * t * fan_in * fan_out


def model(arch, layers=8, d=64, heads=4, ffn=256, vocab=256, seq=64, experts=8, top_k=2):
    t = seq
    regions = [{
        "name": "embed", "kind": "embedding",
        "params": [param("wte.weight", [vocab, d]), param("wpe.weight", [seq, d])],
        "input": act([seq], "int64"), "output": act([seq, d]), "flops": 0,
    }]
    for i in range(layers):
        p = f"layers.{i}"
        regions.append({"name": p, "kind": "block", "input": act([seq, d]), "output": act([seq, d])})
        attn_flops = linear_flops(t, d, 3 * d) + linear_flops(t, d, d) + 4 * t * t * d
        regions.append({
            "name": f"{p}.attn", "kind": "attention",
            "params": [param("ln_1.weight", [d]), param("ln_1.bias", [d]),
                       param("attn.c_attn.weight", [3 * d, d]), param("attn.c_attn.bias", [3 * d]),
                       param("attn.c_proj.weight", [d, d]), param("attn.c_proj.bias", [d])],
            "input": act([seq, d]), "output": act([seq, d]), "flops": attn_flops,
        })
        if arch == "gpt":
            regions.append({
                "name": f"{p}.mlp", "kind": "mlp",
                "params": [param("ln_2.weight", [d]), param("ln_2.bias", [d]),
                           param("mlp.c_fc.weight", [ffn, d]), param("mlp.c_fc.bias", [ffn]),
                           param("mlp.c_proj.weight", [d, ffn]), param("mlp.c_proj.bias", [d])],
                "input": act([seq, d]), "output": act([seq, d]),
                "flops": linear_flops(t, d, ffn) + linear_flops(t, ffn, d),
            })
        else:
            regions.append({
                "name": f"{p}.moe.router", "kind": "router",
                "params": [param("ln_2.weight", [d]), param("ln_2.bias", [d]),
                           param("moe.router.weight", [experts, d])],
                "input": act([seq, d]), "output": act([seq, experts]),
                "flops": linear_flops(t, d, experts),
            })
            for j in range(experts):
                regions.append({
                    "name": f"{p}.moe.experts.{j}", "kind": "expert",
                    "params": [param(f"moe.experts.{j}.c_fc.weight", [ffn, d]),
                               param(f"moe.experts.{j}.c_fc.bias", [ffn]),
                               param(f"moe.experts.{j}.c_proj.weight", [d, ffn]),
                               param(f"moe.experts.{j}.c_proj.bias", [d])],
                    # Per sample, an expert sees on average top_k/experts of the tokens.
                    "input": act([seq, d]), "output": act([seq, d]),
                    "flops": (linear_flops(t, d, ffn) + linear_flops(t, ffn, d)) * top_k // experts,
                })
    regions.append({
        "name": "head", "kind": "lm_head",
        "params": [param("ln_f.weight", [d]), param("ln_f.bias", [d]), param("lm_head.weight", [vocab, d])],
        "input": act([seq, d]), "output": act([seq, vocab]), "flops": linear_flops(t, d, vocab),
    })
    config = {"layers": layers, "d_model": d, "heads": heads, "ffn": ffn, "vocab": vocab, "seq": seq}
    if arch == "moe":
        config.update(experts=experts, top_k=top_k)
    return {
        "format": "piper-manifest", "version": 1,
        "model": {"name": f"{arch}-{layers}L", "arch": arch, "config": config},
        "input": act([seq], "int64"),
        "loss": "cross_entropy(head output, next tokens)",
        "sequence": ["embed"] + [f"layers.{i}" for i in range(layers)] + ["head"],
        "regions": regions,
    }


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    # gpt32: deep and narrow, for pipeline studies up to 16 stages (32 for V-shapes).
    # gpt1b / moe7b: realistic sizes for `piper-check --simulate --machine machines/h100.json`.
    cases = (
        ("gpt8", dict(arch="gpt")),
        ("moe8", dict(arch="moe")),
        ("gpt32", dict(arch="gpt", layers=32)),
        ("gpt1b", dict(arch="gpt", layers=24, d=2048, heads=16, ffn=8192, vocab=50304, seq=2048)),
        ("moe7b", dict(arch="moe", layers=24, d=2048, heads=16, ffn=4096, vocab=50304, seq=2048, experts=16, top_k=2)),
    )
    for name, kw in cases:
        m = model(**kw)
        if name in ("gpt1b", "moe7b"):
            m["model"]["name"] = name
        with open(f"{out}/{name}.json", "w") as f:
            json.dump(m, f, indent=None if name in ("gpt1b", "moe7b") else 1, separators=None)
            f.write("\n")
