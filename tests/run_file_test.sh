#!/usr/bin/env bash
# The run file and resuming with the recipe: `--config run.toml` reproduces a run's losses bit for
# bit (written by --write-config from the resolved options), a malformed or unknown key is an
# error at FILE:LINE:COL, and --resume refuses a silently changed recipe (or says what it accepts).
# Usage: run_file_test.sh PIPER_RUN PIPER_MODEL
# shellcheck source=tests/mpi_test_lib.sh
source "$(dirname "$0")/mpi_test_lib.sh"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
losses() { grep -o '"loss":[^,]*' "$1"; }
s=$root/strategies
schedule=(--lr-schedule cosine --warmup-steps 2 --min-lr 6e-5 --betas 0.9,0.95 --weight-decay 0.1 --clip-grad-norm 1.0
          --batch-size 8 --threads 1)
recipe=(--lr 6e-4 --seed 3 "${schedule[@]}")

# Bit for bit: the flags' run, then the run file it wrote, under mpirun on two ranks.
mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" "$s/1f1b.piper" --set pp=2 --set mb=2 --steps 6 \
  "${recipe[@]}" --metrics "$tmp/flags.jsonl" --write-config "$tmp/run.toml" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
grep -q "^lr-schedule = 'cosine'" "$tmp/run.toml" || { echo "FAIL: run.toml lacks the schedule:"; cat "$tmp/run.toml"; fails=$((fails + 1)); }
mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" "$s/1f1b.piper" --config "$tmp/run.toml" \
  --metrics "$tmp/file.jsonl" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
if ! cmp -s <(losses "$tmp/flags.jsonl") <(losses "$tmp/file.jsonl") || [ "$(losses "$tmp/file.jsonl" | wc -l)" != 6 ]; then
  echo "FAIL: --config did not reproduce the losses bit for bit"; paste <(losses "$tmp/flags.jsonl") <(losses "$tmp/file.jsonl")
  fails=$((fails + 1))
fi
# The command line wins over the file.
expect 0 "step    2/2" "a flag beats the run file" -- mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" \
  "$s/1f1b.piper" --config "$tmp/run.toml" --steps 2 --metrics "$tmp/short.jsonl"

# Malformed or unknown keys: located, nothing run.
printf 'lr = 1e-3\nlr_shedule = "cosine"\n' >"$tmp/typo.toml"
expect 2 "typo.toml:2:1: error: unknown setting 'lr_shedule'; did you mean 'lr-schedule'?" "an unknown key" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --config "$tmp/typo.toml"
printf 'steps = 3\nlr-schedule = "cos"\n' >"$tmp/value.toml"
expect 2 "value.toml:2:15: error: --lr-schedule: cos not in {constant,cosine,linear}" "a value its option refuses" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --config "$tmp/value.toml"
printf 'steps = "many"\n' >"$tmp/type.toml"
expect 2 "type.toml:1:9: error: Could not convert: --steps = many" "a value of the wrong type" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --config "$tmp/type.toml"
printf 'lr = \nsteps = 3\n' >"$tmp/syntax.toml"
expect 2 "syntax.toml:1:6: error:" "TOML that does not parse" -- "$run" "$tmp/m.pt" "$s/single.piper" --config "$tmp/syntax.toml"
printf '[optimizer]\nlr = 1\n' >"$tmp/table.toml"
expect 2 "table.toml:1:1: error: 'optimizer': expected a string, number, boolean or a list of them" "a table" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --config "$tmp/table.toml"

# Resume: the recipe is recorded with the checkpoint; a changed one is refused by name.
expect 0 "step    4/4" "a checkpointed run" -- "$run" "$tmp/m.pt" "$s/single.piper" --steps 4 "${recipe[@]}" \
  --checkpoint "$tmp/ck"
expect 1 "--lr 0.0006 -> 0.001" "a changed learning rate" -- "$run" "$tmp/m.pt" "$s/single.piper" --steps 6 \
  --lr 1e-3 --seed 3 "${schedule[@]}" --decay-steps 4 --resume "$tmp/ck"
expect 1 "--decay-steps 4 -> 6" "more steps would stretch the cosine silently" -- "$run" "$tmp/m.pt" "$s/single.piper" \
  --steps 6 "${recipe[@]}" --resume "$tmp/ck"
expect 0 "continuing with a changed recipe (--accept-changes): --lr 0.0006 -> 0.001" "accepted when asked" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --steps 6 --lr 1e-3 --seed 3 "${schedule[@]}" --decay-steps 4 --resume "$tmp/ck" \
  --accept-changes
expect 0 "other samples come next: --seed 3 -> 4" "a data setting changes what comes next: said" -- \
  "$run" "$tmp/m.pt" "$s/single.piper" --steps 6 --lr 6e-4 --seed 4 "${schedule[@]}" --decay-steps 4 --resume "$tmp/ck"
finish run_file_test
