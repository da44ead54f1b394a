#!/usr/bin/env bash
# Fine-tuning and prediction end to end on whatever device the machine has (gpu_suite.sh's
# first step): the suite's timed steps run pre-training's heads only, so a defect that shows on a
# GPU alone in a task head, its evaluation or `predict` would otherwise go unseen until a user
# meets it. A 2-step BERT-tiny pre-trained on the pack, then QNLI pairs and CoNLL tags from the
# tests' fixtures, then a prediction; eager (`--compile off`: seconds, not a minute of compiling
# per run; the timed steps run the compiled path), where a tensor on the wrong device fails too.
#   PY=python3 bash benchmarks/gpu_smoke.sh SHARDS WORKDIR [--device cpu]
set -euo pipefail
PY="${PY:-python3}"
data=$1 dir=$2
shift 2
cli=("$PY" -m bertkit.cli)
"${cli[@]}" pretrain --data "$data" --config tiny --max-steps 2 --batch-size 8 --seq-len 64 \
  --warmup-steps 1 --save-every 100000 --compile off --out "$dir/tiny" "$@"
"${cli[@]}" finetune qnli --model "$dir/tiny" --data tests/fixtures/glue/QNLI --epochs 1 \
  --batch-size 4 --compile off --out "$dir/qnli" "$@"
"${cli[@]}" finetune conll2003 --model "$dir/tiny" --data tests/fixtures/conll2003_iob1 \
  --epochs 1 --batch-size 4 --compile off --out "$dir/conll" "$@"
"${cli[@]}" predict --model "$dir/qnli" "Who wrote the book?" "She wrote the book." "$@"
echo "smoke: every command ran"
