#!/usr/bin/env bash
# The design card's line measured (issue 29): `order fwd(i) || bwd(i-1) on stream comm;` on a MoE
# with experts over ep = 2, two ranks on this machine's two cores (a core each: what the trace shows
# as overlap is real, not oversubscription). MoE 4 layers d256 ffn1024 seq128, 4 experts top-2...
# as piper-model moe makes it (8 experts), batch 32 in 8 microbatches, 8 steps. Three plans:
#   card     the line as written;
#   streams  the forward's and the backward's exchanges on streams of their own (a2a_f, a2a_b);
#   no-||    the same without the overlap (a forward, then a backward, as plain EP runs them);
#   card and no-|| again with nanoGPT's small recipe's warm-up (--warmup-steps 100 at lr 1e-3): the
#            router, trained at the full rate from step 1, routes most tokens of a layer to one rank's
#            experts within a few steps (this MoE has no load balancing), and the other rank's
#            exchanges then wait for it; under warm-up the measured steps route as at initialisation.
#   card and no-|| again, at lr 1e-3 from step 1, on the same MoE with token dropping
#            (piper-model --capacity-factor 1.25, Switch's training factor: each expert takes at most
#            40 tokens of a sequence), which bounds how much more one rank's experts can get (1.25x).
# Prints per plan the fraction of all-to-all time that overlaps compute on the same rank (from the
# trace, as speed_bench.sh measures it) and tokens/s, medians over ROUNDS with the spread, and each
# plan's throughput against no-|| as the median of per-round ratios; then, for the card, where the
# exposed time is: the share of the unpartnered exchanges (the first forward's, the last backward's),
# the fraction hidden inside the windows, and each rank's expert compute per layer (the routing's load).
# Each plan's load imbalance is the expert compute of the busier rank over the two ranks' mean, per
# expert piece, summed (1.00: balanced; 2.00: one rank does all of it).
# Usage: bench/card_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
"$build/tools/piper-model" moe --layers 4 --d-model 256 --ffn 1024 --seq 128 -o "$tmp/moe.pt" >/dev/null
"$build/tools/piper-model" moe --layers 4 --d-model 256 --ffn 1024 --seq 128 --capacity-factor 1.25 -o "$tmp/moe_cap.pt" >/dev/null
head='param mb = 8;\nmesh ep = 2;\nsplit batch into mb;\nreplicate * over ep;\nshard layers[*].moe.experts over ep;\n'
printf "${head}order fwd(i) || bwd(i-1) on stream comm;\n" >"$tmp/card.piper"
printf "${head}stream a2a_f, a2a_b;\norder fwd(i) || bwd(i-1);\norder fwd(i) on stream a2a_f;\norder bwd(i) on stream a2a_b;\n" \
  >"$tmp/streams.piper"
printf "${head}order fwd(i) -> bwd(i);\n" >"$tmp/plain.piper"
for ((r = 1; r <= rounds; ++r)); do
  for run in card streams plain card:warm plain:warm card:cap plain:cap; do
    plan=${run%%:*} name=${run/:/_} recipe=() model=moe
    [ "${run#*:}" = warm ] && recipe=(--warmup-steps 100)
    [ "${run#*:}" = cap ] && model=moe_cap
    mpirun -np 2 "$build/tools/piper-run" "$tmp/$model.pt" "$tmp/$plan.piper" --data "$root/data/corpus.txt" --steps 8 \
      --batch-size 32 "${recipe[@]}" --metrics "$tmp/$name.$r.jsonl" --trace "$tmp/$name.$r.trace.json" >/dev/null
  done
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import collections, json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
WARMUP = 3
MB = 8
def tokens(plan, r):
    rows = [json.loads(l) for l in open(f"{tmp}/{plan}.{r}.jsonl")]
    return statistics.median([x["tokens_per_s"] for x in rows if "tokens_per_s" in x][WARMUP:])
def events(plan, r):
    return [e for e in json.load(open(f"{tmp}/{plan}.{r}.trace.json"))["traceEvents"]
            if e.get("ph") == "X" and e["args"]["step"] > WARMUP]
def covered(a, b, comp):  # how much of [a, b) the rank's compute intervals cover
    return sum(max(0.0, min(b, d) - max(a, c)) for c, d in comp)
def hidden(plan, r, part=None):  # fraction of all-to-all time during which the same rank computes
    ev = events(plan, r)
    total = cov = 0.0
    for rank in {e["pid"] for e in ev}:
        mine = [e for e in ev if e["pid"] == rank]
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == "compute"]
        for e in mine:
            if "A2A" in e["name"] and (part is None or unpartnered(e["name"]) == (part == "unpartnered")):
                total += e["dur"]
                cov += covered(e["ts"], e["ts"] + e["dur"], comp)
    return cov / max(total, 1e-9), total
def unpartnered(name):  # the first forward's and the last backward's exchanges: no window holds them
    m = re.match(r"\d+A2A_[DC](F|B)(\d+)", name)
    return (m.group(1), int(m.group(2))) in (("F", 0), ("B", MB - 1))
def expert_ms(plan, r):  # per rank and expert piece (the pieces a combine follows): ms per step, F + B
    ev = events(plan, r)
    pieces = {int(re.search(r"\.s(\d+)", e["name"]).group(1)) for e in ev if "A2A_C" in e["name"]}
    steps = len({e["args"]["step"] for e in ev})
    t = collections.defaultdict(float)
    for e in ev:
        m = re.match(r"\d+[FB]\d+\.s(\d+)$", e["name"])
        if e["tid"] == "compute" and m and int(m.group(1)) in pieces:
            t[(e["pid"], int(m.group(1)))] += e["dur"] / 1e3 / steps
    return t
def imbalance(plan, r):  # the busier rank's expert compute over the ranks' mean, summed over pieces
    t = expert_ms(plan, r)
    pieces = {p for _, p in t}
    return sum(max(t[(0, p)], t[(1, p)]) for p in pieces) / sum((t[(0, p)] + t[(1, p)]) / 2 for p in pieces)
def show(xs, fmt):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
print(f"design card, MoE d256 ffn1024 seq128, ep=2 on 2 ranks, mb=8, batch 32; medians of {rounds} rounds (min-max)")
print(f"  {'plan':15s} {'all-to-all hidden':>20s} {'tokens/s':>18s} {'vs no-||':>18s} {'load imbalance':>18s}")
for plan, label, base in (("card", "card", "plain"), ("streams", "streams", "plain"), ("plain", "no-||", "plain"),
                          ("card_warm", "card, warm-up", "plain_warm"), ("plain_warm", "no-||, warm-up", "plain_warm"),
                          ("card_cap", "card, capacity", "plain_cap"), ("plain_cap", "no-||, capacity", "plain_cap")):
    h = [hidden(plan, r)[0] for r in range(1, rounds + 1)]
    t = [tokens(plan, r) for r in range(1, rounds + 1)]
    ratio = [tokens(plan, r) / tokens(base, r) for r in range(1, rounds + 1)]
    load = [imbalance(plan, r) for r in range(1, rounds + 1)]
    print(f"  {label:15s} {show(h, '{:.3f}'):>20s} {show(t, '{:.0f}'):>18s} {show(ratio, '{:.2f}'):>18s} "
          f"{show(load, '{:.2f}'):>18s}")
# Where the card's exposed exchange time is: the unpartnered exchanges, and inside the windows the
# lighter rank's wait at a layer whose routing loads one rank's experts more (random init).
share = [hidden("card", r, "unpartnered")[1] / hidden("card", r)[1] for r in range(1, rounds + 1)]
inside = [hidden("card", r, "window")[0] for r in range(1, rounds + 1)]
print(f"  card: unpartnered exchanges {show(share, '{:.3f}')} of the all-to-all time; inside the windows "
      f"{show(inside, '{:.3f}')} hidden")
t = expert_ms("card", rounds)
print(f"  card, round {rounds}: expert compute per step (F + B, ms) by piece, rank 0 / rank 1: " +
      ", ".join(f"s{p} {t[(0, p)]:.0f}/{t[(1, p)]:.0f}" for p in sorted({k[1] for k in t})))
PY
