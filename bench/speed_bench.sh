#!/usr/bin/env bash
# Pipeline speed, as ratios measured in one invocation (no MCA flags or thread variables: piper-run
# configures its process itself). Model: piper-model gpt 8 layers, d 128, ffn 512, seq 128; global
# batch 16; two ranks on this node.
#  1. tokens/s of every library pipeline at pp=2 mb=8 against one rank running the same 8
#     microbatches (single.piper mb=8), ZB1P, DualPipeV, DualPipe, ZBV, V-Min and V-Half against 1F1B, and interleaved zero
#     bubble against interleaved 1F1B (v=2). The pipelines run
#     scheduled by this machine's measured costs (`piper-run --profile` first, then `--machine`, as
#     docs/scheduler.md says to: unit costs misplace ZB1P's weight passes). Rounds alternate the
#     strategies so that drift of the machine hits all alike; each figure is the median over rounds of
#     each run's median step after warm-up. Also 1F1B with the MPI progress thread kept at normal
#     priority (PIPER_PROGRESS_IDLE=0) against the default (SCHED_IDLE while only receives wait).
#  2. the zero-bubble split: BI + BW against B in one process (one thread, piper-bench-split) on the
#     model's 8 blocks and on ZB1P's last stage (layers 4-7 and the head, from the loss), and per
#     stage from the pipelines' traces (there BW runs later than its BI, beside the other rank's work).
#  3. the compute streams' idle fraction of every pipeline, from its traces (each round's median step;
#     the median over rounds and their spread), beside the simulator's for the same plan and machine
#     file (and 1F1B's formula, (p-1)/(m+p-1)): whether each schedule fills the bubbles it promises.
#     With it each rank's compute time per step over the simulated one: how far the run's costs moved
#     from the profile's. A uniform drift scales a step and leaves its idle fraction; a drift that
#     differs between the ranks, or between op kinds, opens waits the profiled schedule did not have.
#     So each round is also simulated on its own op times (piper-check --op-times over steps 4-12,
#     communication as the machine file prices it), and each step after warm-up on that step's: the
#     gap left there is the schedule model's (handoffs, waits, overlap), not the profile's nor, per
#     step, the step-to-step noise;
#  4. what the machine allows: two independent one-rank jobs (1 thread each) at once against one
#     alone. Two ranks can go no faster than this, times 1 - bubble;
#  5. data parallelism dp=2 with 1 MiB buckets (the model's 6.5 MB of gradients in 7 buckets): the
#     fraction of all-reduce time that overlaps compute on the same rank, from the trace;
#  6. DualPipeV x EP (pp=2 x ep=2, 4 ranks on this node's cores, a MoE of 8 experts top-2): the
#     fraction of all-to-all time that overlaps compute on the same rank; on the small MoE at
#     DualPipeV's fewest microbatches (2*pp: no steady state), and on one with more compute per
#     token (d256, ffn 1024, seq 128) at mb=16 (batch 32), where the schedule's overlapped pairs
#     make up most of the step.
# Usage: bench/speed_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
common=(--data "$root/data/corpus.txt" --steps 12 --batch-size 16)
run() {  # name np strategy sets...
  local name=$1 np=$2 strategy=$3 r=$4
  shift 4
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  if [ "$np" = 1 ]; then
    "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/$strategy" "${sets[@]}" "${common[@]}" \
      --metrics "$tmp/$name.$r.jsonl" --trace "$tmp/$name.$r.trace.json" >/dev/null
  else
    mpirun -np "$np" "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/$strategy" "${sets[@]}" "${common[@]}" \
      --machine "$tmp/machine.json" --metrics "$tmp/$name.$r.jsonl" --trace "$tmp/$name.$r.trace.json" >/dev/null
  fi
}
"$build/tools/piper-model" moe --layers 4 --d-model 128 --ffn 256 --seq 64 -o "$tmp/moe.pt" >/dev/null
"$build/tools/piper-model" moe --layers 4 --d-model 256 --ffn 1024 --seq 128 -o "$tmp/moe_big.pt" >/dev/null
mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine.json" >/dev/null
printf 'mesh dp = 2;\nreplicate * over dp bucket 1MiB on stream comm;\n' >"$tmp/dp_1mib.piper"
pipelines=("1f1b 1f1b.piper" "gpipe gpipe.piper" "interleaved interleaved_1f1b.piper v=2" "zb1p zb1p.piper"
  "dualpipev dualpipev.piper" "dualpipe dualpipe.piper" "zbv zbv.piper" "vmin vmin.piper" "vhalf vhalf.piper"
  "interleaved_zb interleaved_zb.piper v=2")
simulate() {  # pipeline output [piper-check options...]: the simulated step as JSON
  local name file extra
  read -r name file extra <<<"$1"
  "$build/tools/piper-check" "$tmp/m.pt" "$root/strategies/$file" --set pp=2 --set mb=8 ${extra:+--set $extra} \
    --batch-size 16 --machine "$tmp/machine.json" --emit sim-json "${@:3}" >"$2"
}
for p in "${pipelines[@]}"; do simulate "$p" "$tmp/${p%% *}.sim.json"; done
for r in $(seq 1 "$rounds"); do
  run single 1 single.piper "$r" mb=8
  run 1f1b 2 1f1b.piper "$r" pp=2 mb=8
  run gpipe 2 gpipe.piper "$r" pp=2 mb=8
  run interleaved 2 interleaved_1f1b.piper "$r" pp=2 v=2 mb=8
  run zb1p 2 zb1p.piper "$r" pp=2 mb=8
  run dualpipev 2 dualpipev.piper "$r" pp=2 mb=8
  run dualpipe 2 dualpipe.piper "$r" pp=2 mb=8
  run zbv 2 zbv.piper "$r" pp=2 mb=8
  run vmin 2 vmin.piper "$r" pp=2 mb=8
  run vhalf 2 vhalf.piper "$r" pp=2 mb=8
  run interleaved_zb 2 interleaved_zb.piper "$r" pp=2 v=2 mb=8
  PIPER_PROGRESS_IDLE=0 mpirun -x PIPER_PROGRESS_IDLE -np 2 "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/1f1b.piper" \
    --set pp=2 --set mb=8 "${common[@]}" --machine "$tmp/machine.json" --metrics "$tmp/1f1b_busy.$r.jsonl" >/dev/null
  one=(--set mb=8 "${common[@]}" --threads 1)
  "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/single.piper" "${one[@]}" --metrics "$tmp/alone.$r.jsonl" >/dev/null
  "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/single.piper" "${one[@]}" --metrics "$tmp/pair_a.$r.jsonl" >/dev/null &
  "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/single.piper" "${one[@]}" --metrics "$tmp/pair_b.$r.jsonl" >/dev/null
  wait
  mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" "$tmp/dp_1mib.piper" "${common[@]}" --metrics "$tmp/dp.$r.jsonl" \
    --trace "$tmp/dp.$r.trace.json" >/dev/null
done
mpirun -np 4 --oversubscribe "$build/tools/piper-run" "$tmp/moe.pt" "$root/strategies/dualpipev_ep.piper" --set pp=2 \
  --set ep=2 --set mb=4 --data "$root/data/corpus.txt" --steps 8 --batch-size 16 --metrics "$tmp/ep.1.jsonl" \
  --trace "$tmp/ep.1.trace.json" >/dev/null
mpirun -np 4 --oversubscribe "$build/tools/piper-run" "$tmp/moe_big.pt" "$root/strategies/dualpipev_ep.piper" --set pp=2 \
  --set ep=2 --set mb=16 --data "$root/data/corpus.txt" --steps 8 --batch-size 32 --metrics "$tmp/ep_big.1.jsonl" \
  --trace "$tmp/ep_big.1.trace.json" >/dev/null
# Each step after warm-up simulated again on its own compute (the trace's op times of that step, the
# machine's communication): what remains between that and the step as it ran is the schedule model's.
# Each round also on its op times over all those steps (each op's median): the costs the round had,
# drift between ranks and op kinds included, without the step-to-step noise.
for p in "${pipelines[@]}"; do
  for r in $(seq 1 "$rounds"); do
    simulate "$p" "$tmp/${p%% *}.$r.run.json" --op-times "$tmp/${p%% *}.$r.trace.json" --op-times-from 4 --op-times-to 12
    for step in $(seq 4 12); do
      simulate "$p" "$tmp/${p%% *}.$r.s$step.replay.json" --op-times "$tmp/${p%% *}.$r.trace.json" \
        --op-times-from "$step" --op-times-to "$step"
    done
  done
done
{
  "$build/bench/piper-bench-split" "$tmp/m.pt" 1 8 2 15
  "$build/bench/piper-bench-split" "$tmp/m.pt" 5 9 2 15
} >"$tmp/split.txt"
/usr/bin/python3 "$root/bench/speed_report.py" "$tmp" "$rounds"
