#!/usr/bin/env python3
"""The exporter on PyTorch 2 (the PyPI configuration; skipped under Debian's torch 1.13): models whose
code TorchScript cannot compile, captured by tracing and trained by piper-run to PyTorch's own losses.
  - nanoGPT's flash-attention path (F.scaled_dot_product_attention with `dropout_p=self.dropout if
    self.training else 0`, an if-expression TorchScript rejects): scripting fails with the hint to
    trace; traced, it trains to the eager model's losses.
  - Hugging Face transformers' GPT-2 and Llama from small configs (random weights, nothing
    downloaded; skipped when transformers is not installed): their blocks take **kwargs, which
    TorchScript cannot compile; traced through export_chain (Llama's blocks with the model's shared
    rotary embedding) they train to the transformers model's own losses.
Each: 10 steps, fp32, single.piper and 1F1B pp=2, every loss within 1e-5 relative of PyTorch's.
Usage: test_export_torch2.py PIPER_MODEL STRATEGY_DIR PIPER_RUN"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import piper_export  # noqa: E402
from torch_reference import pytorch_losses  # noqa: E402

SKIP = 77  # ctest's SKIP_RETURN_CODE for this test


class FlashAttention(nn.Module):
    """nanoGPT's CausalSelfAttention as model.py writes it on PyTorch 2 (the flash branch)."""

    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head, self.n_embd, self.dropout = heads, d, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class FlashBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), FlashAttention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class FlashGPT(nn.Module):
    """nanoGPT's layout: transformer.{wte, wpe, drop, h, ln_f}, lm_head tied to wte."""

    def __init__(self, vocab=256, seq=32, d=64, heads=4, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, d), wpe=nn.Embedding(seq, d), drop=nn.Dropout(0.0),
                                              h=nn.ModuleList([FlashBlock(d, heads) for _ in range(layers)]),
                                              ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def train_and_compare(tools, tmp, path, eager, label, logits_of=None, steps=10, batch=8, seq=32):
    """piper-run trains `path` under single.piper and 1F1B pp=2; PyTorch trains `eager` (the same
    weights) on the same batches. Every loss within 1e-5 relative."""
    piper_model, strategies, piper_run, data = tools
    subprocess.run([piper_model, "verify", path], check=True, stdout=subprocess.DEVNULL)
    runs = {}
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for strategy, np, sets in (("single.piper", 1, []), ("1f1b.piper", 2, ["--set", "pp=2", "--set", "mb=4"])):
        metrics = os.path.join(tmp, f"{os.path.basename(path)}.{np}.jsonl")
        subprocess.run(["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", piper_run, path,
                        os.path.join(strategies, strategy), *sets, "--data", data, "--steps", str(steps),
                        "--batch-size", str(batch), "--threads", "1", "--metrics", metrics],
                       check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
        runs[strategy] = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]
    reference = pytorch_losses(eager, data, seq, batch, steps, logits_of=logits_of)
    for strategy, losses in runs.items():
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        assert len(losses) == steps and worst < 1e-5, (label, strategy, losses, reference)
        print(f"{label}, {strategy}: PyTorch {reference[0]:.5f} -> {reference[-1]:.5f}, piper-run within {worst:.1e}")


def flash_nanogpt(tools, tmp):
    torch.manual_seed(0)
    gpt = FlashGPT()
    example = torch.zeros(1, 32, dtype=torch.long)
    path = os.path.join(tmp, "flash.pt")
    args = dict(embed="transformer.wte", positions="transformer.wpe", embed_after=["transformer.drop"],
                blocks="transformer.h", head=["transformer.ln_f", "lm_head"], regions_in_block=["attn"])
    try:
        piper_export.export_chain(gpt, example, path, **args)
        raise AssertionError("TorchScript scripted nanoGPT's flash attention: this test's premise is gone")
    except piper_export.ExportError as e:
        assert "if-expression's true branch has type float but false branch has type int" in str(e), e
        assert 'capture="trace"' in str(e), e
    m = piper_export.export_chain(gpt, example, path, capture="trace", **args)
    assert m["ties"], "the traced chain lost nanoGPT's tie"
    train_and_compare(tools, tmp, path, gpt, "nanoGPT flash attention (traced)")
    # Tracing freezes training-mode branches: with attention dropout it would drop in validation too.
    gpt.transformer.h[0].attn.dropout = 0.1
    try:
        piper_export.export_chain(gpt, example, path, capture="trace", **args)
        raise AssertionError("a trace with dropout frozen on was accepted")
    except piper_export.ExportError as e:
        assert "differs from the model in eval mode" in str(e), e


def hugging_face(tools, tmp):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models from configs: nothing is fetched
    try:
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    except ImportError:
        print("transformers is not installed: its models skipped")
        return
    example = torch.zeros(1, 32, dtype=torch.long)
    logits = lambda model, tokens: model(tokens).logits  # noqa: E731
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    path = os.path.join(tmp, "gpt2.pt")
    gpt2_args = dict(embed="transformer.wte", positions="transformer.wpe", embed_after=["transformer.drop"],
                     blocks="transformer.h", head=["transformer.ln_f", "lm_head"])
    try:
        piper_export.export_chain(gpt2, example, path, **gpt2_args)
        raise AssertionError("TorchScript scripted transformers' GPT-2: this test's premise is gone")
    except piper_export.ExportError as e:
        assert "variable number of arguments" in str(e), e
    piper_export.export_chain(gpt2, example, path, capture="trace", **gpt2_args)
    train_and_compare(tools, tmp, path, gpt2, "transformers GPT-2 (traced)", logits)

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         bos_token_id=0, eos_token_id=0))
    path = os.path.join(tmp, "llama.pt")
    m = piper_export.export_chain(llama, example, path, embed="model.embed_tokens", blocks="model.layers",
                                  head=["model.norm", "lm_head"], rotary="model.rotary_emb", capture="trace",
                                  regions_in_block=["mlp"])
    assert "layers.1.block.mlp" in [r["name"] for r in m["regions"]], m["regions"]
    try:  # transformers calls its attention by keyword (hidden_states=...): not a region
        piper_export.export_chain(llama, example, path, embed="model.embed_tokens", blocks="model.layers",
                                  head=["model.norm", "lm_head"], rotary="model.rotary_emb", capture="trace",
                                  regions_in_block=["self_attn"])
        raise AssertionError("a region called by keyword only was accepted")
    except piper_export.ExportError as e:
        assert "'layers.0.block.self_attn' (module layers.0.block.self_attn) is called with keyword arguments only" in str(e), e
    with torch.no_grad():
        tokens = torch.randint(0, 256, (2, 32))
        assert torch.allclose(torch.jit.load(path)(tokens), llama(tokens).logits, atol=1e-5)
    train_and_compare(tools, tmp, path, llama, "transformers Llama (GQA, RoPE, SwiGLU; traced)", logits)


def main():
    if int(torch.__version__.split(".")[0]) < 2:
        print(f"PyTorch {torch.__version__}: these models need PyTorch 2 (scaled_dot_product_attention)")
        sys.exit(SKIP)
    piper_model, strategies, piper_run = sys.argv[1:4]
    data = os.path.join(os.path.dirname(strategies), "data", "corpus.txt")
    tools = (piper_model, strategies, piper_run, data)
    with tempfile.TemporaryDirectory() as tmp:
        flash_nanogpt(tools, tmp)
        hugging_face(tools, tmp)
    print("test_export_torch2: all passed")


if __name__ == "__main__":
    main()
