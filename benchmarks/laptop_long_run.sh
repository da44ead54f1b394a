#!/usr/bin/env bash
# The long run of the laptop recipe (issue 10, §5 and the plateau's onset): a 3-hour training
# budget on Wikipedia AA, held out AB, bert-base-uncased vocabulary. Resumable: run it again
# after a kill or a session's end and it continues from runs/long/tiny/trainer_state.pt on the
# budget's clock (a new machine, without runs/, starts it afresh). One thread, at low priority,
# so other work can share the machine.
#   BERTKIT_DATA=../shared/data bash benchmarks/laptop_long_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
data="${BERTKIT_DATA:?set BERTKIT_DATA to ../shared/data}"
bin=.venv/bin/bertkit
for split in AA AB; do
  if [ ! -f "runs/data/$split/meta.json" ]; then
    "$bin" prepare "$data/corpus/wikipedia_2015/$split" --vocab "$data/vocab/bert-base-uncased" \
      --out "runs/data/$split" --overwrite
  fi
done
mkdir -p runs/long
OMP_NUM_THREADS=1 exec nice -n 10 "$bin" pretrain --data runs/data/AA --eval-data runs/data/AB \
  --out runs/long/tiny --config tiny --batch-size 32 --lr 2e-3 --adam-beta2 0.98 \
  --warmup-fraction 0.05 --dropout 0 --mlm-bias-init unigram --budget 3h --eval-every 500 \
  --eval-batches 10 --save-every 200 --log-every 50 --resume
