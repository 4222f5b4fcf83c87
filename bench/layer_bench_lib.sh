# Sourced by the benches that split a layer (tp_bench.sh, cp_bench.sh) after speed_setup.sh: a run
# of $tmp/m.pt under mpirun, one thread a rank, and the memory and cost model's prediction for it.
run() {  # NP OUT STRATEGY BATCH STEPS [piper-run args...]
  local np=$1 out=$2 strategy=$3 batch=$4 steps=$5
  shift 5
  mpirun -np "$np" --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/$strategy" \
    --data "$root/data/corpus.txt" --steps "$steps" --batch-size "$batch" --threads 1 --metrics "$out" "$@" >/dev/null
}
sim() {  # OUT STRATEGY BATCH [piper-check args...]
  local out=$1 strategy=$2 batch=$3
  shift 3
  "$build/tools/piper-check" "$tmp/m.pt" "$root/strategies/$strategy" --batch-size "$batch" "$@" --emit sim-json -o "$out" >/dev/null
}
