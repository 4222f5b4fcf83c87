"""PyTorch's own training of a Piper model.pt on exactly the batches piper-run and piper-train-ref
read: the oracle for the reference trainer itself (tests/tied_test.sh, python/test_piper_export.py)."""
import torch
import torch.nn.functional as F


def pytorch_losses(model_path, data_path, seq, batch, steps, seed=0):
    """PyTorch itself trains a model.pt on the windows piper-run reads (runtime/model/data.cpp's sampler):
    AdamW over model.parameters() (a tied tensor once), cross-entropy on the next tokens."""
    mask = (1 << 64) - 1
    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)
    raw = open(data_path, "rb").read()
    m = torch.jit.load(model_path)
    params = list(m.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    losses = []
    for step in range(steps):
        starts = [mix(mix(seed) ^ (step * batch + k)) % (len(raw) - seq) for k in range(batch)]
        t = torch.tensor([list(raw[s:s + seq + 1]) for s in starts], dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        logits = m(t[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), t[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
