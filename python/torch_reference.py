"""PyTorch's own training of a Piper model.pt on exactly the batches piper-run and piper-train-ref
read: the oracle for the reference trainer itself (tests/tied_test.sh, python/test_piper_export.py)."""
import math

import torch
import torch.nn.functional as F


def nanogpt_lr(step, lr, warmup, decay_steps, min_lr):
    """nanoGPT's get_lr: linear warmup, then cosine decay to min_lr at decay_steps."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup) / (decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def pytorch_losses(model_path, data_path, seq, batch, steps, seed=0, recipe=None, logits_of=None):
    """PyTorch itself trains a model.pt on the windows piper-run reads (runtime/model/data.cpp's sampler):
    AdamW over model.parameters() (a tied tensor once), cross-entropy on the next tokens. `model_path`
    may also be the eager module itself, with `logits_of(module, tokens)` where its forward returns
    more than the logits (Hugging Face's: `.logits`). With
    `recipe` (dict: lr, warmup, min_lr, betas, weight_decay, clip), nanoGPT's: two groups (decay on
    parameters of two or more dimensions), its cosine schedule over `steps`, clip_grad_norm_; then
    returns (losses, global norms) instead of the losses."""
    mask = (1 << 64) - 1
    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)
    raw = open(data_path, "rb").read()
    m = torch.jit.load(model_path) if isinstance(model_path, str) else model_path
    m.train()
    logits_of = logits_of or (lambda module, tokens: module(tokens))
    params = list(m.parameters())
    for p in params:
        p.requires_grad_(True)
    r = recipe or {}
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": r.get("weight_decay", 0.0)},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=r.get("lr", 1e-3), betas=r.get("betas", (0.9, 0.999)))
    losses, norms = [], []
    for step in range(steps):
        if recipe:
            for g in opt.param_groups:
                g["lr"] = nanogpt_lr(step, r["lr"], r["warmup"], steps, r["min_lr"])
        starts = [mix(mix(seed) ^ (step * batch + k)) % (len(raw) - seq) for k in range(batch)]
        t = torch.tensor([list(raw[s:s + seq + 1]) for s in starts], dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        logits = logits_of(m, t[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), t[:, 1:].reshape(-1))
        loss.backward()
        if recipe:
            norms.append(torch.nn.utils.clip_grad_norm_(params, r["clip"]).item())
        opt.step()
        losses.append(loss.item())
    return (losses, norms) if recipe else losses
