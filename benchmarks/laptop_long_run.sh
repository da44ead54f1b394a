#!/usr/bin/env bash
# The long run of the laptop recipe (issue 10, §5: NSP above 70%; how far masked LM goes): a
# 3-hour training budget on Wikipedia AA, held out AB, bert-base-uncased vocabulary. Resumable:
# run it again after a kill or a session's end and it continues from runs/long/laptop's
# trainer_state.pt on the budget's clock (a new machine, without runs/, starts it afresh). One
# thread, at low priority, so other work can share the machine.
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
OMP_NUM_THREADS=1 exec nice -n 10 "$bin" pretrain --recipe laptop --objective mlm+nsp --budget 3h \
  --data runs/data/AA --eval-data runs/data/AB --out runs/long/laptop --eval-every 500 \
  --eval-batches 20 --save-every 200 --log-every 50 --resume
