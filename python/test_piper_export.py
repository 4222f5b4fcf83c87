#!/usr/bin/env python3
"""The exporter round trip: a nanoGPT-like model defined here is exported, then the C++ side loads
it (piper-model verify: regions chained == whole model, forward and gradients) and checks a
strategy against it (piper-check). Dropout trains in piper-run; a tied nanoGPT trains under 1F1B
on two ranks to PyTorch's own losses. Usage: test_piper_export.py PIPER_MODEL PIPER_CHECK STRATEGY_DIR PIPER_RUN"""
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


class Embed(nn.Module):
    def __init__(self, vocab, seq, d):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(self.ln(x)).split(C, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (C // self.heads) ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T, device=x.device)) == 0, float("-inf")).softmax(-1)
        return x + self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, d, dropout=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))


class Block(nn.Module):
    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.attn = Attention(d, heads)
        self.mlp = Mlp(d, dropout)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Head(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab=256, seq=32, d=32, heads=4, layers=4, dropout=0.0):
        super().__init__()
        self.embed = Embed(vocab, seq, d)
        self.layers = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.head = Head(d, vocab)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.layers:
            x = block(x)
        return self.head(x)


class EmbedOf(nn.Module):
    """An embedding region around modules the model also keeps elsewhere."""

    def __init__(self, wte, wpe):
        super().__init__()
        self.wte, self.wpe = wte, wpe

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))


class Aliased(nn.Module):
    """nanoGPT's layout (transformer.wte, transformer.h) with a wrapper around wte/wpe as the
    embedding region, the model still keeping them under transformer: one tensor, two paths."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte, self.transformer.wpe = nn.Embedding(256, 32), nn.Embedding(32, 32)
        self.transformer.h = nn.ModuleList([Block(32, 4) for _ in range(2)])
        self.embed = EmbedOf(self.transformer.wte, self.transformer.wpe)
        self.lm = Head(32, 256)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm(x)


class NanoGPTLayout(nn.Module):
    """nanoGPT's model.py as it is laid out: transformer.{wte, wpe, drop, h, ln_f} and lm_head tied
    to wte; its forward embeds inline and, without targets, returns the last position's logits."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(256, 32), wpe=nn.Embedding(32, 32), drop=nn.Dropout(0.0),
                                              h=nn.ModuleList([Block(32, 4) for _ in range(2)]), ln_f=nn.LayerNorm(32)))
        self.lm_head = nn.Linear(32, 256, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets=None):
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1))))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class OwnNames(nn.Module):
    """The same model under its author's names: blocks at transformer.h, the head at lm."""

    def __init__(self):
        super().__init__()
        self.wrap = Embed(256, 32, 32)
        self.transformer = nn.Module()
        self.transformer.h = nn.ModuleList([Block(32, 4) for _ in range(2)])
        self.lm = Head(32, 256)

    def forward(self, idx):
        x = self.wrap(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm(x)


def main():
    piper_model, piper_check, strategies, piper_run = sys.argv[1:5]
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "corpus.txt")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = NanoGPT()
    example = torch.zeros(1, 32, dtype=torch.long)
    seq = piper_export.expand(model, "embed", "layers", "head")
    assert seq == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"], seq
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        m = piper_export.export(model, example, path, seq, regions=[f"layers.{i}.attn" for i in range(4)],
                                kinds={"layers": "block"}, name="nanogpt-test")
        by_name = {r["name"]: r for r in m["regions"]}
        assert by_name["layers.1"]["output"] == {"shape": [32, 32], "dtype": "float32"}, by_name["layers.1"]
        assert by_name["embed"]["input"] == {"shape": [32], "dtype": "int64"}
        # Parameters belong to the deepest region: the attention's are not counted twice.
        assert {p["name"] for p in by_name["layers.1.attn"]["params"]} >= {"qkv.weight", "proj.weight"}
        assert all(not p["name"].startswith("attn.") for p in by_name["layers.1"]["params"])
        total = sum(p["bytes"] for r in m["regions"] for p in r["params"])
        assert total == sum(p.numel() * 4 for p in model.parameters()), total

        subprocess.run([piper_model, "verify", path], check=True)
        subprocess.run([piper_check, path, os.path.join(strategies, "1f1b.piper"), "--set", "pp=2", "--set", "mb=4"],
                       check=True, stdout=subprocess.DEVNULL)

        # Errors in the user's terms: the region, what it was fed, what the forward returned.
        class TupleOut(NanoGPT):
            def forward(self, idx):
                return super().forward(idx)[:, [-1]], None
        for bad, seq_bad, want in [
            (model, ["layers.0", "embed", "head"], "region 'layers.0' (module layers.0) fails on its input Tensor[1, 32] (int64)"),
            (TupleOut(), seq, "the model's forward returned tuple (Tensor[1, 1, 256] (float32), None); expected one"),
        ]:
            try:
                piper_export.export(bad, example, path, seq_bad)
                raise AssertionError("expected an ExportError")
            except piper_export.ExportError as e:
                assert want in str(e), e

        # A sequence that leaves out a region does not reproduce the forward: a clear error.
        try:
            piper_export.export(model, example, path, ["embed", "layers.0", "head"])
            raise AssertionError("expected an ExportError")
        except piper_export.ExportError as e:
            assert "do not reproduce the model's forward" in str(e), e

        # Training mode: the caller's mode is restored, the file is saved in training mode, and
        # piper-run trains with dropout as the model says — reproducibly.
        def first_loss(p):
            out = subprocess.run([piper_run, p, os.path.join(strategies, "single.piper"), "--steps", "1",
                                  "--batch-size", "4", "--threads", "1"], check=True, capture_output=True, text=True)
            return [line.split()[3] for line in out.stdout.splitlines() if line.startswith("step")][0]
        losses = {}
        for p in (0.0, 0.5):
            torch.manual_seed(0)
            m_p = NanoGPT(dropout=p)
            m_p.eval()
            path_p = os.path.join(tmp, f"drop{p}.pt")
            piper_export.export(m_p, example, path_p, seq, kinds={"layers": "block"})
            assert not m_p.training, "the exporter must leave the caller's module in its mode"
            assert torch.jit.load(path_p).training, "the model must be saved in training mode"
            losses[p] = first_loss(path_p)
        subprocess.run([piper_model, "verify", os.path.join(tmp, "drop0.5.pt")], check=True)  # dropout off for the check
        assert losses[0.5] != losses[0.0], f"dropout 0.5 trains like dropout 0: {losses}"
        assert first_loss(os.path.join(tmp, "drop0.5.pt")) == losses[0.5], "dropout is not reproducible run to run"

        # The author's module names stay; the manifest names regions as the library selects them.
        own = OwnNames()
        own_path = os.path.join(tmp, "own.pt")
        m = piper_export.export(own, example, own_path, piper_export.expand(own, "wrap", "transformer.h", "lm"),
                                regions=["transformer.h.0.attn"], kinds={"layers": "block"},
                                names={"wrap": "embed", "transformer.h": "layers", "lm": "head"})
        assert m["sequence"] == ["embed", "layers.0", "layers.1", "head"], m["sequence"]
        by_name = {r["name"]: r for r in m["regions"]}
        assert by_name["layers.0.attn"]["module"] == "transformer.h.0.attn" and by_name["layers.1"]["kind"] == "block"
        subprocess.run([piper_model, "verify", own_path], check=True)
        subprocess.run([piper_run, own_path, os.path.join(strategies, "single.piper"), "--steps", "1"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([piper_check, own_path, os.path.join(strategies, "1f1b.piper"), "--set", "pp=2", "--set", "mb=4"],
                       check=True, stdout=subprocess.DEVNULL)

        # One tensor under two module paths, one outside every region: refused at export, with the fix.
        aliased = Aliased()
        try:
            piper_export.export(aliased, example, os.path.join(tmp, "aliased.pt"),
                                piper_export.expand(aliased, "embed", "transformer.h", "lm"))
            raise AssertionError("expected an ExportError")
        except piper_export.ExportError as e:
            assert "parameter 'transformer.wte.weight' is the tensor region 'embed' holds as 'wte.weight'" in str(e), e
            assert "`del model.transformer.wte`" in str(e), e
        del aliased.transformer.wte, aliased.transformer.wpe  # the fix the message names
        piper_export.export(aliased, example, os.path.join(tmp, "aliased.pt"),
                            piper_export.expand(aliased, "embed", "transformer.h", "lm"))
        subprocess.run([piper_model, "verify", os.path.join(tmp, "aliased.pt")], check=True, stdout=subprocess.DEVNULL)

        # nanoGPT as it is, no user-written modules: export_chain builds the chain from module paths.
        torch.manual_seed(0)
        gpt = NanoGPTLayout()
        chain_path = os.path.join(tmp, "nanogpt.pt")
        m = piper_export.export_chain(gpt, example, chain_path, embed="transformer.wte", positions="transformer.wpe",
                                      embed_after=["transformer.drop"], blocks="transformer.h",
                                      head=["transformer.ln_f", "lm_head"], regions_in_block=["attn"])
        assert m["sequence"] == ["embed", "layers.0", "layers.1", "head"], m["sequence"]
        assert m["ties"] == [[{"region": "embed", "param": "tokens.weight"}, {"region": "head", "param": "steps.1.weight"}]], m.get("ties")
        targets = torch.zeros(1, 32, dtype=torch.long)
        with torch.no_grad():  # the chain computes what nanoGPT's forward does, every position
            assert torch.allclose(torch.jit.load(chain_path)(example), gpt(example, targets)[0], atol=1e-6)
        subprocess.run([piper_model, "verify", chain_path], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([piper_run, chain_path, os.path.join(strategies, "single.piper"), "--steps", "1"], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            piper_export.export_chain(gpt, example, chain_path, embed="transformer.wte", blocks="transformer.h",
                                      head=["transformer.ln_f", "lm_head"])
            raise AssertionError("expected an ExportError")
        except piper_export.ExportError as e:
            assert "leaves out parameters ['transformer.wpe.weight']" in str(e), e

        # Tied weights as nanoGPT writes them (the head's matrix is the embedding's, dropout modules
        # in the blocks): the exporter declares the tie; 1F1B over two ranks, embedding and head on
        # different stages, trains to PyTorch's own losses on the same batches.
        torch.manual_seed(0)
        tied = NanoGPT(dropout=0.0)
        tied.head.out.weight = tied.embed.wte.weight
        tied_path = os.path.join(tmp, "tied.pt")
        m = piper_export.export(tied, example, tied_path, seq, kinds={"layers": "block"})
        assert m["ties"] == [[{"region": "embed", "param": "wte.weight"}, {"region": "head", "param": "out.weight"}]], m.get("ties")
        total = sum(p["bytes"] for r in m["regions"] for p in r["params"])
        assert total == sum(p.numel() * 4 for p in tied.parameters()) + tied.embed.wte.weight.numel() * 4  # listed by both
        subprocess.run([piper_model, "verify", tied_path], check=True, stdout=subprocess.DEVNULL)
        steps, batch = 8, 8
        torch_losses = pytorch_losses(tied_path, data, 32, batch, steps)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        metrics = os.path.join(tmp, "tied.jsonl")
        subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", piper_run, tied_path,
                        os.path.join(strategies, "1f1b.piper"), "--set", "pp=2", "--set", "mb=4", "--data", data,
                        "--steps", str(steps), "--batch-size", str(batch), "--threads", "1", "--metrics", metrics],
                       check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
        piper_losses = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]
        worst = max(abs(a - b) / abs(b) for a, b in zip(piper_losses, torch_losses))
        assert len(piper_losses) == steps and worst < 1e-5, (piper_losses, torch_losses)
        print(f"tied nanoGPT, 1f1b pp=2: PyTorch {torch_losses[0]:.5f} -> {torch_losses[-1]:.5f}, "
              f"piper-run max relative difference {worst:.1e}")

        # nanoGPT's whole recipe against PyTorch's own AdamW (two groups), clip_grad_norm_ and its
        # cosine schedule with warmup, on the tied model: ZeRO-3 over dp=2 with embedding and head
        # on one stage (its per-layer units once failed at the first forward), and 1F1B pp=2 with
        # them on two; losses and every step's global norm (above the threshold: clipping acts).
        steps = 30
        recipe = {"lr": 1e-3, "warmup": 4, "min_lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "clip": 1.0}
        torch_losses, torch_norms = pytorch_losses(tied_path, data, 32, batch, steps, recipe=recipe)
        flags = ["--lr", "1e-3", "--lr-schedule", "cosine", "--warmup-steps", "4", "--min-lr", "1e-4",
                 "--betas", "0.9,0.95", "--weight-decay", "0.1", "--clip-grad-norm", "1.0"]
        for strategy, sets in (("zero3.piper", ["--set", "dp=2"]), ("1f1b.piper", ["--set", "pp=2", "--set", "mb=4"])):
            subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", piper_run, tied_path,
                            os.path.join(strategies, strategy), *sets, "--data", data, "--steps", str(steps),
                            "--batch-size", str(batch), "--threads", "1", "--metrics", metrics, *flags],
                           check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
            rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
            worst = max(abs(a["loss"] - b) / abs(b) for a, b in zip(rows, torch_losses))
            worst_norm = max(abs(a["grad_norm"] - b) / b for a, b in zip(rows, torch_norms))
            clipped = sum(n > 1.0 for n in torch_norms)
            assert len(rows) == steps and worst < 1e-5 and worst_norm < 1e-5, (strategy, rows, torch_losses, torch_norms)
            assert clipped > steps // 2, f"clipping acted on {clipped} of {steps} steps only"
            print(f"tied nanoGPT, {strategy} {' '.join(sets)} with nanoGPT's recipe: losses within {worst:.1e}, "
                  f"global norms within {worst_norm:.1e} of PyTorch's (clipped on {clipped} of {steps} steps)")
    print("test_piper_export: all passed")


if __name__ == "__main__":
    main()
