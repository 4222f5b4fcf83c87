#!/usr/bin/env python3
"""Writes torch's own schedule CSVs for the round-trip tests (tests/torch_csv_test.sh): each
schedule class of torch.distributed.pipelining computes its compute-only pipeline_order, and
PipelineScheduleMulti._dump_csv writes it as torch does (csv.writer: \\r\\n, empty cells for idle
steps). Stages are stand-ins carrying only what the constructors read; nothing runs.

    PYTHON gen_torch_csv.py OUT_DIR     (PYTHON: the PyTorch 2 venv's, scripts/setup.sh --torch pypi)
"""
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S


class Stage:
    """What a schedule's constructor reads of a _PipelineStageBase."""

    def __init__(self, index, num_stages, pp):
        self.stage_index, self.num_stages, self.group_rank, self.group_size = index, num_stages, 0, pp
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = None


def dump(cls, pp, mb, v_shape, path, v=2):
    # Rank 0's stages (the order is computed for every rank): a V's 0 and 2pp-1, else 0, pp, 2pp, ...
    ids = [0, 2 * pp - 1] if v_shape else [k * pp for k in range(v)]
    schedule = cls([Stage(i, v * pp, pp) for i in ids], mb, loss_fn=lambda out, target: out)
    # The compute-only order, as PipelineScheduleMulti._dump_csv writes it (the runtime schedules'
    # own _dump_csv writes the order after torch added its communication actions).
    S.PipelineScheduleMulti._dump_csv(schedule, path)


if __name__ == "__main__":
    out = sys.argv[1]
    for name, cls, v_shape in [("interleaved_1f1b", S.ScheduleInterleaved1F1B, False),
                               ("interleaved_zb", S.ScheduleInterleavedZeroBubble, False),
                               ("zbv", S.ScheduleZBVZeroBubble, True),
                               ("dualpipev", S.ScheduleDualPipeV, True)]:
        # interleaved_zb's is also one of the library file's configurations below (pp, v, mb).
        file = f"{name}_pp2_v2_mb4.csv" if name == "interleaved_zb" else f"{name}_pp2_mb4.csv"
        dump(cls, 2, 4, v_shape, os.path.join(out, file))
    # The library's interleaved_zb.piper against torch's own order, over pp, v and mb.
    for pp, v, mb in [(2, 2, 8), (4, 2, 8), (4, 2, 16), (2, 3, 4), (4, 3, 8), (2, 4, 8)]:
        dump(S.ScheduleInterleavedZeroBubble, pp, mb, False, os.path.join(out, f"interleaved_zb_pp{pp}_v{v}_mb{mb}.csv"), v)
    print(f"torch {torch.__version__}: wrote 10 schedules to {out}")  # 4 above, 6 here
