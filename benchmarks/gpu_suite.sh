#!/usr/bin/env bash
# GPU speed in one call of a lent machine (at most ~8 minutes), everything prepared on the CPU:
#
#   1. BERT-base phase 1 (seq 128, batch 256), bf16: bertkit eager (unpadded and padded) against
#      transformers' BertForPreTraining (SDPA, fused AdamW) on the same batches, alternated;
#      tokens/s and MFU (benchmarks/gpu_throughput.py states the FLOPs formula and the peaks);
#      a profile of each (top kernels, the share of the step the card is busy).
#   2. The same, compiled (unpadded and padded) against transformers eager; compiled with
#      inductor's searches (coordinate-descent tuning; max-autotune); with CUDA graphs (the
#      padded path; the unpadded one with its row counts rounded up).
#   3. BERT-large phase 1 (128 x 256) and phase 2 (512 x 32), eager and compiled, against
#      transformers; SQuAD fine-tuning of BERT-large at 384 (batch 32): seq/s and MFU against
#      transformers.
#   4. The loop itself, `bertkit pretrain --config base` at the same batch, defaults (compile
#      auto: on with CUDA; data workers): tokens/s from its log, compile seconds on their own
#      line; what the throughput of steps 1-2 loses to the data path and the loop; then the
#      same with --data-workers 0 (batches made between steps).
#   5. Small models (tiny, small, mini; batch 256 x 128): launch-bound or not, eager, compiled
#      and with CUDA graphs; BERT-small in the loop by default (CUDA graphs) and compiled.
#   6. bf16 against fp32 loss curves: BERT-mini, 300 steps, the same data and seed.
#   7. Inference: BERT-base padded, unpadded and compiled against transformers.
#   8. First of all, fine-tuning and predict end to end (benchmarks/gpu_smoke.sh); then
#      bertkit compiled against transformers compiled, MFU by both counts.
#
# On the CPU machine, once (Wikipedia AA wiki_00..09 with the bert-base-uncased vocabulary,
# 5 MB of shards in runs/gpu_pack, which the call carries):
#   BERTKIT_DATA=../shared/data bash benchmarks/gpu_suite.sh pack
# On the GPU machine (OUT: what comes back; DEADLINE: seconds after which every step is stopped
# and what is done is packed; ONLY: the names of the steps to run, default all):
#   OUT=$OUT DEADLINE=450 bash benchmarks/gpu_suite.sh run
# The steps run in the order of what is still unmeasured, not of the list above.
# A dry run of the whole on the CPU, every step at toy size (the same commands):
#   DRY=1 OUT=/tmp/gpu_dry DEADLINE=900 bash benchmarks/gpu_suite.sh run
# What comes back: OUT/throughput.jsonl (one row per case and variant, with the machine), OUT/
# summary.txt (the card, driver, torch; each step's exit code and time; the printed tables) and
# OUT/logs.tar.gz (every step's log, the loop's and the curves' log.jsonl).
set -uo pipefail
cd "$(dirname "$0")/.."
pack=runs/gpu_pack
case "${1:-}" in
pack)
  data="${BERTKIT_DATA:?set BERTKIT_DATA to ../shared/data}"
  files=()
  for n in 00 01 02 03 04 05 06 07 08 09; do files+=("$data/corpus/wikipedia_2015/AA/wiki_$n"); done
  .venv/bin/bertkit prepare "${files[@]}" --vocab "$data/vocab/bert-base-uncased" \
    --out "$pack/shards" --overwrite || exit 1
  du -sh "$pack"
  exit 0 ;;
run) ;;
*) echo "usage: gpu_suite.sh pack|run" >&2; exit 2 ;;
esac

out="${OUT:?set OUT}"
deadline="${DEADLINE:-450}"
PY="${PY:-python3}"
export PY  # (gpu_smoke.sh runs it too)
dry="${DRY:-}"
export PYTHONPATH="$PWD/src:$PWD/benchmarks" PYTHONUNBUFFERED=1
data="$pack/shards"
[ -f "$data/meta.json" ] || { echo "no $data: run 'gpu_suite.sh pack' first and carry $pack" >&2; exit 2; }
work=$(mktemp -d /tmp/gpu_suite.XXXX)
mkdir -p "$out" "$work/logs"
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
summary="$work/summary.txt"
# step NAME COMMAND...: runs it until the deadline, its output in logs/NAME.log
step() {
  local name=$1
  shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  echo "== $name (at ${SECONDS}s, $(left)s left)" | tee -a "$summary"
  timeout "$(left)" "$@" > "$work/logs/$name.log" 2>&1
  local rc=$?
  grep -E "seq/s|first step|warm-up|tokens/s|FAILED|COMPILED|failed|attention|Error|by kind|^smoke|^(tiny|base|minilm-l6) " "$work/logs/$name.log" | tee -a "$summary"
  echo "-- $name: exit $rc at ${SECONDS}s" | tee -a "$summary"
}

if [ -n "$dry" ]; then  # toy sizes on the CPU: every command runs, nothing is measured
  device=(--device cpu --precision fp32 --steps 2 --rounds 1)
  base=(tiny:32:8) small=(tiny:32:8) large=(tiny:64:4) large_compiled=(tiny:64:4)
  squad=(squad-tiny:64:4)
  loop=(--config tiny --max-steps 6 --batch-size 8 --seq-len 32 --device cpu --data-workers 2)
  loop_small=(--config tiny --max-steps 6 --batch-size 8 --seq-len 32 --device cpu)
  curves=(--config tiny --max-steps 6 --batch-size 8 --seq-len 32 --device cpu --warmup-steps 2)
  graphs=()  # (CUDA graphs need CUDA)
  infer=(--models tiny --vocab "$data" --batch 8 --seq-len 32 --dtype fp32 --device cpu --iters 2)
  bf16=fp32 smoke=(--device cpu)
else
  device=()
  base=(base:128:256) small=(tiny:128:256 small:128:256 mini:128:256)
  large=(large:128:256 large:512:32) large_compiled=(large:512:32)
  squad=(squad-large:384:32)
  loop=(--config base --max-steps 40 --batch-size 256 --seq-len 128)
  loop_small=(--config small --max-steps 120 --batch-size 256 --seq-len 128)
  curves=(--config mini --max-steps 300 --batch-size 128 --seq-len 128 --warmup-steps 30)
  graphs=(bertkit-graphs)
  # (base only: all-MiniLM-L6-v2's package is not on the lent machine, which has no internet)
  infer=(--models base --vocab "$data" --batch 256 --seq-len 128 --dtype bf16 --iters 20)
  bf16=bf16 smoke=()
fi
{
  date -u
  command -v nvidia-smi > /dev/null &&
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  "$PY" -c "import torch, machine; print(machine.line(), '| cuda', torch.version.cuda)"
} 2>&1 | tee -a "$summary"

rows="$work/throughput.jsonl"
bench=("$PY" benchmarks/gpu_throughput.py --data "$data" --out "$rows" "${device[@]}")
# in the order of what is still unmeasured (the first 2026-11-27 H200 call measured base,
# large, small and the curves; the second the compiled steps, SQuAD and the loops; the third
# `--compile auto`'s CUDA graphs for BERT-small, inference and BERT-large at 512 compiled, and its
# deadline cut inductor's searches); ONLY="name ..." runs just those steps
# fine-tuning and predict end to end on the card first (a minute): what no timed step runs;
# then inductor's searches, which the third run's deadline cut
step finetune_smoke bash benchmarks/gpu_smoke.sh "$data" "$work/smoke" "${smoke[@]}"
# Compiled against compiled (until now compiled bertkit met eager transformers), BERT-base
# phase 1 and BERT-large at 128, MFU by the strict count and the common one side by side
step compiled_vs_compiled "${bench[@]}" --case "${base[@]}" "${large[0]}" \
  --variants bertkit-compiled transformers-compiled --profile bertkit-compiled
# inductor's searches (benchmarks/gpu_throughput.py's TUNED): the pointwise kernels' settings;
# then the matrix products autotuned too (minutes of compiling)
step base_tuned "${bench[@]}" --case "${base[@]}" --variants bertkit-compiled bertkit-tuned \
  --profile bertkit-compiled bertkit-tuned
# CUDA graphs for BERT-base: the third run's host launched its kernels more slowly than the
# card ran them (busy 75%); the padded path (one shape) and the unpadded one (row counts rounded
# up to 512: a graph for each of a few counts)
step base_graphs "${bench[@]}" --case "${base[@]}" \
  --variants bertkit-compiled "${graphs[@]}" bertkit-graphs-unpadded --profile bertkit-graphs-unpadded
# the dropout masks drawn by torch's kernels inside the compiled graph (inductor's fallback_random)
step base_rng "${bench[@]}" --case "${base[@]}" --variants bertkit-compiled bertkit-eager-rng \
  --profile bertkit-eager-rng
step base_autotuned "${bench[@]}" --case "${base[@]}" --variants bertkit-compiled \
  bertkit-autotuned --profile bertkit-autotuned
step base_compiled "${bench[@]}" --case "${base[@]}" \
  --variants transformers bertkit-compiled bertkit-synced-compiled bertkit-padded-compiled \
  --profile bertkit-compiled
step squad "${bench[@]}" --case "${squad[@]}" --variants bertkit transformers \
  --profile bertkit transformers
step loop "$PY" -m bertkit.cli pretrain --data "$data" "${loop[@]}" --warmup-steps 4 \
  --log-every 5 --save-every 100000 --out "$work/loop"
# the same without data workers: the batches made between steps (what the loop did before)
step loop_serial "$PY" -m bertkit.cli pretrain --data "$data" "${loop[@]}" --warmup-steps 4 \
  --log-every 5 --save-every 100000 --data-workers 0 --out "$work/loop_serial"
step base "${bench[@]}" --case "${base[@]}" --variants bertkit bertkit-padded transformers \
  --profile bertkit transformers
step large "${bench[@]}" --case "${large[@]}" --variants bertkit transformers --profile bertkit
step small "${bench[@]}" --case "${small[@]}" \
  --variants bertkit bertkit-compiled "${graphs[@]}" transformers --profile bertkit
# measured in the third run (2026-11-27 21:38), last
# BERT-small in the loop as `--compile auto` runs it (CUDA graphs), then plain compiled
step loop_small "$PY" -m bertkit.cli pretrain --data "$data" "${loop_small[@]}" \
  --warmup-steps 4 --log-every 20 --save-every 100000 --out "$work/loop_small"
step loop_small_compiled "$PY" -m bertkit.cli pretrain --data "$data" "${loop_small[@]}" \
  --warmup-steps 4 --log-every 20 --save-every 100000 --compile on \
  --out "$work/loop_small_compiled"
# inference: padded, unpadded and compiled (predict/serve --compile on) against transformers
step infer "$PY" benchmarks/forward_throughput.py "${infer[@]}" --compiled \
  --json "$work/logs/infer.json"
# BERT-large compiled at 512 (128 x 256 was measured in the second run)
step large_compiled "${bench[@]}" --case "${large_compiled[@]}" \
  --variants transformers bertkit-compiled --profile bertkit-compiled transformers
for precision in fp32 "$bf16"; do
  step "curves_$precision" "$PY" -m bertkit.cli pretrain --data "$data" "${curves[@]}" \
    --lr 1e-4 --log-every 10 --save-every 100000 --seed 0 --compile off \
    --precision "$precision" --out "$work/curves_$precision"
  [ -n "$dry" ] && break  # (the dry run's two precisions are one)
done

# what comes back (8 files at most): the rows, the summary, every log in one archive
for run in loop loop_serial loop_small loop_small_compiled curves_fp32 curves_bf16; do
  [ -f "$work/$run/log.jsonl" ] && cp "$work/$run/log.jsonl" "$work/logs/$run.log.jsonl"
done
echo "done at ${SECONDS}s" | tee -a "$summary"
[ -f "$rows" ] && cp "$rows" "$out/throughput.jsonl"
cp "$summary" "$out/summary.txt"
tar czf "$out/logs.tar.gz" -C "$work" logs
ls -la "$out"
