"""`bertkit predict` and the Predictor on a fine-tuned checkpoint (bertkit.predict)."""

from __future__ import annotations

import json

from bertkit import cli

from helpers import FIXTURES, grow_copies


def test_predict_command_line(tiny_checkpoint, tmp_path, capsys):
    data = grow_copies(FIXTURES / "glue" / "QNLI", tmp_path / "data", 5)
    out = tmp_path / "run"
    argv = ["finetune", "qnli", "--model", str(tiny_checkpoint), "--data", str(data)]
    argv += ["--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-seq-length", "64"]
    assert cli.main(argv) == 0
    assert "accuracy" in json.loads((out / "results.json").read_text())["dev"]
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(out), "Who painted it?", "Anna painted it."]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["label"] in ("entailment", "not_entailment")
    assert cli.main(["predict", "--model", str(out), "only one text"]) == 2
    assert "takes two texts" in capsys.readouterr().err
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"text": "a", "text_pair": "b"}\n{oops\n')
    assert cli.main(["predict", "--model", str(out), "--input", str(bad)]) == 2
    assert "in.jsonl:2: not JSON" in capsys.readouterr().err
    assert cli.main(["evaluate", "--model", str(out), "--data", str(data), "--split", "dev"]) == 0
