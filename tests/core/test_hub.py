"""Models by their Hub name (bertkit.core.hub): resolved in a Hugging Face cache laid out as the Hub
client lays it out (refs/REVISION naming a snapshot folder), offline; a name that is not there
is one line naming it and how to get it."""

import shutil
from pathlib import Path

import pytest
import torch

from bertkit import BertModel, BertTokenizer, cli
from bertkit.core.checkpoint import convert
from bertkit.core.hub import model_dir
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.predict import Predictor
from bertkit.tasks.own import DataConfig

from helpers import OWN_QUICK, topic_rows


def cache(home, repo: str, folder, revision: str = "main", commit: str = "a" * 40):
    """Put `folder` in HF_HOME's hub cache as `repo` at `revision`."""
    root = home / "hub" / ("models--" + repo.replace("/", "--"))
    shutil.copytree(folder, root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def test_a_model_by_its_hub_name_everywhere_a_folder_is_taken(words_model, hub, tmp_path, capsys):
    cache(hub, "acme/words-bert", words_model)
    assert model_dir("acme/words-bert").is_dir()
    # by name: the folder's own weights and vocabulary, not some other model's or a fresh one's
    by_name, folder = (
        BertModel.from_pretrained("acme/words-bert"),
        BertModel.from_pretrained(words_model),
    )
    assert by_name.config.to_dict() == folder.config.to_dict()
    theirs = folder.state_dict()
    assert by_name.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in by_name.state_dict().items())
    assert BertTokenizer.from_pretrained("acme/words-bert").vocab == (
        BertTokenizer.from_pretrained(words_model).vocab
    )
    rows = topic_rows(60)
    train = tmp_path / "train.csv"
    train.write_text("headline,topic\n" + "".join(f"{r['headline']},{r['topic']}\n" for r in rows))
    data = DataConfig(train=str(train), validation=str(train), text_column="headline",
                      label_column="topic")  # fmt: skip
    finetune("text-classification", "acme/words-bert", data, tmp_path / "run",
             FinetuneConfig(**OWN_QUICK | {"epochs": 1}))  # fmt: skip
    cache(hub, "acme/topics", tmp_path / "run", revision="v1", commit="b" * 40)
    answer = Predictor("acme/topics@v1")(["goal match team"])[0]
    assert answer == Predictor(tmp_path / "run")(["goal match team"])[0]
    assert cli.main(["predict", "--model", "acme/topics@v1", "goal match team"]) == 0
    assert '"label"' in capsys.readouterr().out
    assert (
        convert("acme/words-bert", tmp_path / "google", to="google") / "bert_config.json"
    ).exists()


def test_a_name_that_cannot_be_had_is_one_line(hub, capsys):
    with pytest.raises(FileNotFoundError, match=r"acme/nothing: no such folder, and not in the "
                       r"Hugging Face cache .*HF_HUB_OFFLINE is set.*huggingface-cli download "
                       r"acme/nothing"):  # fmt: skip
        model_dir("acme/nothing")
    assert cli.main(["predict", "--model", "acme/nothing@v2", "text"]) == 2
    err = capsys.readouterr().err
    assert "acme/nothing@v2: no such folder" in err and "Traceback" not in err
    assert model_dir("runs/a/b").parts == ("runs", "a", "b")  # a path, never looked up


def test_org_slash_name_under_a_folder_here_is_a_path(hub, tmp_path, monkeypatch, capsys):
    """`runs/mrpc` reads as a Hub id, but where `runs/` is a folder here it is a path (one not
    written yet, or mistyped): said so, not looked up on the Hub with a download hint."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert model_dir("runs/mrpc") == Path("runs/mrpc")
    assert cli.main(["predict", "--model", "runs/mrpc", "a text"]) == 2
    err = capsys.readouterr().err
    assert "runs/mrpc: no such folder" in err and "huggingface" not in err.lower()
    with pytest.raises(FileNotFoundError, match="acme/nothing: no such folder, and not in"):
        model_dir("acme/nothing")  # no acme/ here: still a Hub id
