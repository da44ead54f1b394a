"""Where a pre-trained BERT's masked positions look: per layer and head, the attention entropy
(against uniform), the weight on the neighbours (offsets -1 and +1), the mass on [SEP], [MASK]
and punctuation, and the mean distance attended to. A model on the unigram plateau attends to
sinks ([SEP], other [MASK]s) and at distances of a uniform spread; one that has learnt local
syntax puts weight on its neighbours.

    python benchmarks/attention_locality.py --model runs/sweep/t_lr1e3_d0 --data runs/data/AB

Every chosen piece of 16 held-out sequences is replaced by [MASK] (as the held-out measure does).
"""

from __future__ import annotations

import torch
from _args import arguments

from bertkit import BertForPreTraining
from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining.dataset import MaskingConfig, PretrainingData
from bertkit.pretraining.shards import Shards


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="held-out shards of the model's vocab")
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    model = BertForPreTraining.from_pretrained(args.model).eval()
    tokenizer = BertTokenizer.from_pretrained(args.model)
    stream = PretrainingData(
        Shards(args.data),
        tokenizer,
        batch_size=16,
        seq_len=args.seq_len,
        masking=MaskingConfig(mask_token_prob=1.0, random_token_prob=0.0),
        seed=1,
    )
    batch = stream.next_batch()
    with torch.no_grad():
        out = model.bert(
            batch["input_ids"],
            batch["token_type_ids"],
            batch["attention_mask"],
            output_attentions=True,
        )
    valid = batch["labels"] != -100
    rows_of = torch.arange(len(valid))[:, None].expand_as(valid)[valid]
    where = batch["masked_positions"][valid]
    ids = batch["input_ids"][rows_of]  # (n, S) the sequences of the masked positions
    length = batch["attention_mask"].sum(1).float().mean()
    print(f"{len(where)} masked positions; uniform attention entropy {torch.log(length):.2f}")
    for number, attention in enumerate(out.attentions):
        size = attention.shape[-1]
        distance = (torch.arange(size)[None, :] - where[:, None]).abs().float()
        for head in range(attention.shape[1]):
            rows = attention[rows_of, head, where]  # (n, S)
            entropy = -(rows.clamp_min(1e-12).log() * rows).sum(-1).mean()
            left = rows.gather(1, (where - 1).clamp_min(0)[:, None]).mean()
            right = rows.gather(1, (where + 1).clamp_max(size - 1)[:, None]).mean()
            mass = {
                name: float((rows * (ids == tokenizer.vocab[name])).sum(-1).mean())
                for name in ("[SEP]", "[MASK]", ",", ".")
            }
            sinks = " ".join(f"{k} {v:.2f}" for k, v in mass.items())
            print(
                f"layer {number} head {head}: entropy {entropy:.2f}, left {left:.3f}, right "
                f"{right:.3f}, {sinks}, mean distance {(rows * distance).sum(-1).mean():.1f}"
            )


if __name__ == "__main__":
    main()
