#!/usr/bin/env bash
# The design card's line measured (issue 29): `order fwd(i) || bwd(i-1) on stream comm;` on a MoE
# with experts over ep = 2, two ranks on this machine's two cores (a core each: what the trace shows
# as overlap is real, not oversubscription). MoE 4 layers d256 ffn1024 seq128, 4 experts top-2...
# as piper-model moe makes it (8 experts), batch 32 in 8 microbatches, 8 steps. Three plans:
#   card     the line as written;
#   streams  the forward's and the backward's exchanges on streams of their own (a2a_f, a2a_b);
#   no-||    the same without the overlap (a forward, then a backward, as plain EP runs them).
# Prints per plan the fraction of all-to-all time that overlaps compute on the same rank (from the
# trace, as speed_bench.sh measures it) and tokens/s, medians over ROUNDS with the spread, and each
# plan's throughput against no-|| as the median of per-round ratios.
# Usage: bench/card_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
"$build/tools/piper-model" moe --layers 4 --d-model 256 --ffn 1024 --seq 128 -o "$tmp/moe.pt" >/dev/null
head='param mb = 8;\nmesh ep = 2;\nsplit batch into mb;\nreplicate * over ep;\nshard layers[*].moe.experts over ep;\n'
printf "${head}order fwd(i) || bwd(i-1) on stream comm;\n" >"$tmp/card.piper"
printf "${head}stream a2a_f, a2a_b;\norder fwd(i) || bwd(i-1);\norder fwd(i) on stream a2a_f;\norder bwd(i) on stream a2a_b;\n" \
  >"$tmp/streams.piper"
printf "${head}order fwd(i) -> bwd(i);\n" >"$tmp/plain.piper"
for ((r = 1; r <= rounds; ++r)); do
  for plan in card streams plain; do
    mpirun -np 2 "$build/tools/piper-run" "$tmp/moe.pt" "$tmp/$plan.piper" --data "$root/data/corpus.txt" --steps 8 \
      --batch-size 32 --metrics "$tmp/$plan.$r.jsonl" --trace "$tmp/$plan.$r.trace.json" >/dev/null
  done
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
WARMUP = 3
def tokens(plan, r):
    rows = [json.loads(l) for l in open(f"{tmp}/{plan}.{r}.jsonl")]
    return statistics.median([x["tokens_per_s"] for x in rows if "tokens_per_s" in x][WARMUP:])
def hidden(plan, r):  # fraction of all-to-all time during which the same rank computes
    ev = [e for e in json.load(open(f"{tmp}/{plan}.{r}.trace.json"))["traceEvents"]
          if e.get("ph") == "X" and e["args"]["step"] > WARMUP]
    total = covered = 0.0
    for rank in {e["pid"] for e in ev}:
        mine = [e for e in ev if e["pid"] == rank]
        a2a = [(e["ts"], e["ts"] + e["dur"]) for e in mine if "A2A" in e["name"]]
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == "compute"]
        total += sum(b - a for a, b in a2a)
        covered += sum(max(0.0, min(b, d) - max(a, c)) for a, b in a2a for c, d in comp)
    return covered / max(total, 1e-9)
def show(xs, fmt):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
print(f"design card, MoE d256 ffn1024 seq128, ep=2 on 2 ranks, mb=8, batch 32; medians of {rounds} rounds (min-max)")
print(f"  {'plan':8s} {'all-to-all hidden':>22s} {'tokens/s':>20s} {'vs no-||':>20s}")
for plan, label in (("card", "card"), ("streams", "streams"), ("plain", "no-||")):
    h = [hidden(plan, r) for r in range(1, rounds + 1)]
    t = [tokens(plan, r) for r in range(1, rounds + 1)]
    ratio = [tokens(plan, r) / tokens("plain", r) for r in range(1, rounds + 1)]
    print(f"  {label:8s} {show(h, '{:.3f}'):>22s} {show(t, '{:.0f}'):>20s} {show(ratio, '{:.2f}'):>20s}")
PY
