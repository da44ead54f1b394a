"""Training curves (bertkit.viz): the log reader and the panels each kind of log gets."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.image
import matplotlib.pyplot as plt
import pytest

from bertkit import viz
from bertkit.cli import main
from bertkit.viz import _zoom, plot_log, read_log


def _write(path, entries, tail=""):
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + tail)
    return path


def _pretraining_log(path):
    entries = []
    for step in range(10, 410, 10):
        entries.append(
            {"step": step, "split": "train", "mlm_loss": 10.0 - step / 100, "nsp_loss": 0.69,
             "loss": 10.7 - step / 100, "lr": 1e-3 * min(1.0, step / 40)}
        )  # fmt: skip
        if step % 100 == 0:
            entries.append(
                {"step": step, "split": "eval", "mlm_loss": 9.0, "mlm_accuracy": step / 1000,
                 "nsp_accuracy": 0.5 + step / 2000, "mlm_perplexity": 8103.1}
            )  # fmt: skip
    return _write(path, entries)


def test_read_log_skips_a_line_a_kill_cut_short(tmp_path):
    log = _write(
        tmp_path / "log.jsonl", [{"step": 1, "split": "train", "loss": 2.0}], '{"step": 2, "spl'
    )
    assert read_log(log) == [{"step": 1, "split": "train", "loss": 2.0}]


@pytest.mark.parametrize(
    "bad, found",
    [(b"[1, 2]", "a JSON list"), (b"\xff\xfe not text", "not UTF-8"), (b"step 2", "not JSON")],
)
def test_a_broken_log_line_is_named_by_file_and_line(tmp_path, capsys, bad, found):
    good = json.dumps({"step": 1, "split": "train", "loss": 2.0}).encode()
    log = tmp_path / "log.jsonl"
    log.write_bytes(good + b"\n" + bad + b"\n" + good + b"\n")
    assert main(["viz", str(log), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert f"{log}:2: not a log entry" in err and found in err and "Traceback" not in err
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert main(["viz", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "c.png")]) == 2
    assert "empty.jsonl: no training entries to plot" in capsys.readouterr().err
    assert main(["viz", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "c.png")]) == 2
    assert "none.jsonl: no such file" in capsys.readouterr().err


def test_each_loss_gets_its_own_panel_then_evaluation_then_learning_rate(tmp_path):
    png = plot_log(_pretraining_log(tmp_path / "log.jsonl"), tmp_path / "curves.png", "run")
    height, width, _ = matplotlib.image.imread(png).shape
    # MLM loss, NSP loss, evaluation, learning rate: four panels of 4.3 inches at 100 dpi
    assert (width, height) == (round(4.3 * 4 * 100), 390)
    finetune = [
        {"step": s, "split": "train", "loss": 0.7 - s / 1000, "lr": 2e-5} for s in range(1, 60)
    ] + [{"step": 30 * e, "split": "eval", "epoch": e, "accuracy": 0.6 + e / 10} for e in (1, 2)]
    png = plot_log(_write(tmp_path / "ft.jsonl", finetune), tmp_path / "ft.png")
    assert matplotlib.image.imread(png).shape[1] == round(4.3 * 3 * 100)  # loss, dev, lr


def test_fine_tuning_figures_are_by_whole_epochs(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(viz, "save_png", lambda fig, png: figures.append(fig) or png)
    log = [{"step": s, "split": "train", "loss": 0.7, "lr": 2e-5} for s in range(1, 60)]
    log += [{"step": 30 * e, "split": "eval", "epoch": e, "accuracy": 0.6} for e in (1, 2)]
    plot_log(_write(tmp_path / "ft.jsonl", log), tmp_path / "ft.png")
    evaluation = figures[0].axes[1]
    assert evaluation.get_xlabel() == "epoch"
    ticks = [t for t in evaluation.get_xticks() if 1 <= t <= 2]
    assert ticks == [1, 2]  # not 1.0, 1.2, ..., 2.0


def test_nothing_is_drawn_without_training_entries(tmp_path):
    log = _write(tmp_path / "log.jsonl", [{"step": 5, "split": "eval", "accuracy": 0.5}])
    assert plot_log(log, tmp_path / "curves.png") is None
    assert plot_log(tmp_path / "missing.jsonl", tmp_path / "curves.png") is None
    assert not (tmp_path / "curves.png").exists()


def test_the_first_steps_loss_does_not_flatten_the_rest():
    fig, ax = plt.subplots()
    values = [math.log(30522)] + [3.0 - i / 100 for i in range(99)]  # ln V, then 3.0 .. 2.02
    ax.plot(values)
    _zoom(ax, values)
    low, high = ax.get_ylim()
    assert 1.9 < low < 2.02 and 3.0 < high < 3.2  # the start (10.3) is off the scale
    plt.close(fig)
