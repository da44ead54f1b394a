"""What serving in int8 costs in dev score: a fine-tuned checkpoint scored on its
task's dev set through PyTorch, its ONNX export in fp32, and in int8 (dynamic quantisation).

    BERTKIT_DATA=../shared/data python benchmarks/int8_dev_scores.py --model runs/mrpc \
        --data ../shared/data/glue/MRPC --out runs/mrpc-serving

The exports go to OUT/fp32 and OUT/int8; the scores are the task's official metrics on the same
dev features, printed as a table with the change from PyTorch in points.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _args import arguments

from bertkit.core.heads import MODEL_CLASSES
from bertkit.core.tokenizer import BertTokenizer
from bertkit.inference.export import export_onnx
from bertkit.inference.loader import OnnxModel
from bertkit.tasks import get_task
from bertkit.tasks.base import read_task_info, run_outputs


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--model", type=Path, required=True, help="a bertkit finetune output")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    info = read_task_info(args.model)
    task = get_task(info["task"])
    tokenizer = BertTokenizer.from_pretrained(args.model)
    length = int(info.get("max_seq_length", task.default_max_seq_length))
    split = task.dev_splits()[0]
    examples = task.read(args.data, split)
    features = task.featurize(examples, tokenizer, length)
    models = {"pytorch": MODEL_CLASSES[info["head"]].from_pretrained(args.model).eval()}
    for kind in ("fp32", "int8"):
        if not (args.out / kind / "model.onnx").exists():
            export_onnx(args.model, args.out / kind, quantize="int8" if kind == "int8" else None)
        models[f"onnx {kind}"] = OnnxModel(args.out / kind)
    scores = {}
    for name, model in models.items():
        with torch.inference_mode():
            outputs = run_outputs(task, model, features, args.batch_size, torch.device("cpu"))
        scores[name] = task.score(examples, task.predictions(examples, features, outputs))
    metrics = list(task.metrics)
    print(f"{info['task']} {split} ({len(examples)} examples), {args.model}")
    print("| backend | " + " | ".join(metrics) + " | change from PyTorch (points) |")
    print("|---|" + "---|" * (len(metrics) + 1))
    for name, figures in scores.items():
        change = ", ".join(f"{100 * (figures[m] - scores['pytorch'][m]):+.2f}" for m in metrics)
        cells = " | ".join(f"{100 * figures[m]:.2f}" for m in metrics)
        print(f"| {name} | {cells} | {change} |")


if __name__ == "__main__":
    main()
