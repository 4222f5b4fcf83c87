"""Does an auxiliary load-balancing loss keep the zoo MoE's routing balanced between two ranks'
experts in the first steps at the full rate? (docs/models.md, the design card in docs/runtime.md.)
PyTorch trains a piper-model moe file (dense evaluation, as on one device) with AdamW at LR from the
first step, batch 32 of the corpus, with Switch Transformer's loss coeff * E * sum_i f_i * P_i added
(f_i: the fraction of dispatches to expert i, P_i: its mean router probability), and prints per step
the cross-entropy and, per layer, the load of the busier half of the experts (ep=2's ranks) over
the mean (1.00 balanced, 2.00 one rank takes every token), for each coefficient.
Usage: /usr/bin/python3 bench/moe_balance.py MODEL.pt CORPUS [STEPS] [LR] [COEFF...]
(MODEL.pt: piper-model moe --layers 4 --d-model 256 --ffn 1024 --seq 128 -o MODEL.pt, the card's)"""
import sys

import torch
import torch.nn.functional as F


def train(path, raw, coeff, steps, lr, batch=32):
    m = torch.jit.load(path)
    m.train()
    blocks = [getattr(m, n) for n, _ in m.named_children() if n.startswith("layers_")]
    experts = len([n for n, _ in blocks[0].moe.named_children() if n.startswith("experts_")])
    top_k = blocks[0].moe.router.top_k
    seq = m.embed.wpe.size(0)
    params = list(m.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        ix = torch.randint(0, len(raw) - seq - 1, (batch,), generator=g)
        x = torch.stack([raw[i:i + seq] for i in ix])
        y = torch.stack([raw[i + 1:i + seq + 1] for i in ix])
        h, aux, load = m.embed(x), 0.0, []
        for b in blocks:
            a = b.attn(h)
            hn, gates = b.moe.router(a)
            probs = torch.softmax(F.linear(hn, b.moe.router.weight), -1)
            chosen = (gates > 0).float()
            aux = aux + experts * ((chosen.mean((0, 1)) / top_k).detach() * probs.mean((0, 1))).sum()
            per = chosen.sum((0, 1))
            half = experts // 2
            load.append(max(per[:half].sum(), per[half:].sum()).item() / (per.sum().item() / 2))
            y_moe = torch.zeros_like(hn)
            for j in range(experts):
                y_moe = y_moe + gates[:, :, j:j + 1] * getattr(b.moe, f"experts_{j}")(hn)
            h = a + y_moe
        logits = m.head(h)
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        (ce + coeff * aux).backward()
        opt.step()
        print(f"  step {step:2d}  loss {ce.item():.3f}  busier half / mean per layer: " + " ".join(f"{v:.2f}" for v in load))


def main():
    path, corpus = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    lr = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-3
    coeffs = [float(c) for c in sys.argv[5:]] or [0.0, 0.01, 0.1]
    raw = torch.tensor(list(open(corpus, "rb").read()), dtype=torch.long)
    for c in coeffs:
        torch.manual_seed(0)
        print(f"auxiliary loss coefficient {c}, lr {lr}")
        train(path, raw, c, steps, lr)


if __name__ == "__main__":
    main()
