"""PyTorch's own training of a Piper model.pt, for bench/vs_pytorch.sh: the same TorchScript model,
the same byte-token data and batch, AdamW, cross-entropy.
  torch_baseline.py loop MODEL DATA SEQ BATCH STEPS THREADS OUT.json   a plain loop on one process
  torch_baseline.py ddp  MODEL DATA SEQ BATCH STEPS THREADS OUT.json   DistributedDataParallel, gloo, 2 processes
OUT gets the per-step tokens/s of rank 0."""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def batches(data_path, batch, seq, steps, rank, world):
    raw = torch.tensor(list(open(data_path, "rb").read()), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, raw.numel() - seq - 1, (batch,), generator=g)
        rows = torch.stack([raw[s:s + seq + 1] for s in starts.tolist()])
        yield rows.chunk(world)[rank]


def train(rank, world, model_path, data_path, seq, batch, steps, threads, out, store):
    torch.set_num_threads(threads)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    m = torch.jit.load(model_path)
    for p in m.parameters():
        p.requires_grad_(True)
    net = torch.nn.parallel.DistributedDataParallel(m) if world > 1 else m
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    rates = []
    for rows in batches(data_path, batch, seq, steps, rank, world):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = net(rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        rates.append(batch * seq / (time.perf_counter() - t0))
    if rank == 0:
        json.dump(rates, open(out, "w"))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    mode, model, data, seq, batch, steps, threads, out = sys.argv[1:9]
    args = (model, data, int(seq), int(batch), int(steps), int(threads), out)
    if mode == "loop":
        train(0, 1, *args, None)
    else:
        store = tempfile.mktemp()
        mp.spawn(train, args=(2, *args, store), nprocs=2)
        if os.path.exists(store):
            os.remove(store)
