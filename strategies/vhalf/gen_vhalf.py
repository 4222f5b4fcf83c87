"""Writes V-Half's per-rank orders as torch schedule CSVs: strategies/vhalf/pp{P}_mb{M}.csv.

V-Half (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory") is a building block
repeated every 6 time slots, then squeezed: the published schedule is the output of a greedy
program, not a formula, so the library ships that program's output as data (`order from` names the
file by pp and mb) and this script, which rebuilds it (a test checks the files are current).

Per rank r of pp, in V placement (down stage r, up stage 2pp-1-r), six ops per microbatch:
F down forward, f up forward, b up input gradient, B down input gradient, W up weight gradient,
w down weight gradient. Each op takes one slot.
1. The block: microbatch j's F, f, b, B at slots 6j + (2r, 3pp-r-2, 3pp+I+2r-1, 6pp+I-r-2),
   I = 3 for even pp (their slots stay distinct mod 6), weight gradients in the first free slots
   after input gradients (the up stage's first). A rank holds at most pp+2 chunk activations (1F1B: 2pp).
2. The squeeze, outside the steady state (before rank 0's first B, after its last F): in slot
   order, each op moves to the earliest free slot after its inputs' slots (and after the same op of
   the previous microbatch) that keeps the rank's peak activations (F, f +1; W, w -1) at or under
   the fullest rank's in the block. Once with W and w as placed, once without them (they go back to the first free slots).
The CSV line of rank r is its ops in slot order, as torch actions on Piper's (and torch's) V stage
numbers. Usage: gen_vhalf.py OUT_DIR PP:MB ... (the library's set: tests/vhalf_files_test.sh)
"""
import os
import sys

KINDS = "FfbBWw"  # index = kind
GAIN = {"F": 1, "f": 1, "b": 0, "B": 0, "W": -1, "w": -1}


def block(pp, mb):
    """slots[r][kind] = list over microbatches, kinds F f b B (weight gradients added by place_w)."""
    i = 3 if pp % 2 == 0 else 0
    base = lambda r: {"F": 2 * r, "f": 3 * pp - r - 2, "b": 3 * pp + i + 2 * r - 1, "B": 6 * pp + i - r - 2}
    return [{k: [o + 6 * j for j in range(mb)] for k, o in base(r).items()} for r in range(pp)]


def place_w(rank, split):
    """Weight gradients into the first free slots after input gradients. Split: W (the up stage's,
    after b) goes before w (the down stage's, after B) whenever one of each waits; else all are W."""
    taken = {s: k for k in "fFbB" for s in rank[k]}
    rank["W"], rank["w"] = [], []
    waiting = {"W": 0, "w": 0}
    last = max(taken)
    slot = 0
    while slot <= last or waiting["W"] or waiting["w"]:
        if slot in taken:
            if taken[slot] in "bB":
                waiting["w" if split and taken[slot] == "B" else "W"] += 1
        else:
            kind = "W" if waiting["W"] else "w" if waiting["w"] else None
            if kind:
                waiting[kind] -= 1
                rank[kind].append(slot)
        slot += 1
    return rank


def peak(rank):
    """Most chunk activations the rank holds: +1 per forward, -1 per weight gradient; without
    weight gradients placed, each free slot after an input gradient frees one (as place_w would)."""
    events = sorted((s, k) for k in KINDS for s in rank.get(k, []))
    if rank.get("W") or rank.get("w"):
        held = best = 0
        for _, k in events:
            held += GAIN[k]
            best = max(best, held)
        return best
    taken = dict((s, k) for s, k in events)
    held = best = owed = 0
    for slot in range(max(taken) + 1):
        if slot in taken:
            held += GAIN[taken[slot]]
            owed += taken[slot] in "bB"
        elif owed:
            held, owed = held - 1, owed - 1
        best = max(best, held)
    return best


def inputs(slots, pp, r, kind, j):
    """Slots of what op (r, kind, j) waits for: its chain neighbour, its own earlier op, the same op
    of the previous microbatch; a weight gradient, the j-th input gradient of the rank."""
    deps = []
    if kind in "Fb" and r > 0:
        deps.append(slots[r - 1][kind][j])
    if kind in "fB" and r < pp - 1:
        deps.append(slots[r + 1][kind][j])
    prior = {"f": "F", "b": "f", "B": "b"}.get(kind)
    if prior:
        deps.append(slots[r][prior][j])
    if kind == "W":
        deps.append(sorted(slots[r]["b"] + slots[r]["B"])[j])
    if j > 0:
        deps.append(slots[r][kind][j - 1])
    return deps


def squeeze(slots, pp, mb, kinds):
    """One squeeze pass over the ops of `kinds` (see the module's comment), in slot order."""
    cap = max(peak(rank) for rank in slots)  # the block's peak, the fullest rank's
    taken = [set() for _ in range(pp)]
    ops = sorted((s, r, k, j) for r in range(pp) for k in kinds for j, s in enumerate(slots[r][k]))  # W: 2 per mb
    phase = "fill"
    done = set()
    while len(done) < len(ops):  # always the op with the earliest current slot (slots only move earlier)
        slot, r, k, j = min((slots[r][k][j], r, k, j) for _, r, k, j in ops if (r, k, j) not in done)
        done.add((r, k, j))
        if phase == "fill" and (r, k) == (0, "B"):
            phase = "steady"
        if phase == "steady":
            if (k, j) == ("F", mb - 1):
                phase = "drain"
            taken[r].add(slot)
            continue
        if phase == "fill" and "W" not in kinds:
            taken[r].add(slot)
            continue
        earliest = max(inputs(slots, pp, r, k, j), default=-1) + 1
        for s in range(earliest, slot):
            if s in taken[r]:
                continue
            slots[r][k][j] = s
            if peak(slots[r]) <= cap:
                break
            slots[r][k][j] = slot
        taken[r].add(slots[r][k][j])
    return slots


def vhalf(pp, mb):
    slots = [place_w(rank, split=False) for rank in block(pp, mb)]
    slots = squeeze(slots, pp, mb, "FfbBW")
    for rank in slots:
        del rank["W"], rank["w"]
    slots = squeeze(slots, pp, mb, "FfbB")
    return [place_w(rank, split=True) for rank in slots]


def csv_lines(pp, mb):
    out = []
    for r, rank in enumerate(vhalf(pp, mb)):
        down, up = r, 2 * pp - 1 - r
        name = {"F": (down, "F"), "f": (up, "F"), "b": (up, "I"), "B": (down, "I"), "W": (up, "W"), "w": (down, "W")}
        ops = sorted((s, k, j) for k in KINDS for j, s in enumerate(rank[k]))
        out.append(",".join(f"{name[k][0]}{name[k][1]}{j}" for _, k, j in ops))
    return out


def main():
    out_dir = sys.argv[1]
    for spec in sys.argv[2:]:
        pp, mb = (int(x) for x in spec.split(":"))
        with open(os.path.join(out_dir, f"pp{pp}_mb{mb}.csv"), "w") as f:
            f.write("\n".join(csv_lines(pp, mb)) + "\n")


if __name__ == "__main__":
    main()
