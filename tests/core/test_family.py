"""The BERT family (bertkit.core.family): RoBERTa, XLM-RoBERTa, ELECTRA and DistilBERT folders as
transformers saves them — tiny random models with their own tokenizers (byte-level BPE,
SentencePiece Unigram, WordPiece) — read by bertkit with the same pieces and the same hidden
states, and saved back in the family's own layout."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bertkit.core.model import BertModel
from bertkit.core.tokenizer import BertTokenizer, JsonTokenizer

T = pytest.importorskip("transformers")

from families import CORPUS, FAMILIES, PAIRS, SIZES, TEXTS, build  # noqa: E402, F401


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    return {family: build(family, root / family) for family in FAMILIES}


def _hidden(model, encoded, **options):
    with torch.no_grad():
        return model(**encoded, **options).last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_folder_reads_as_transformers_reads_it(folders, family):
    """The same pieces (singles, pairs, a batch of mixed lengths, offsets) and the same hidden
    states at every real token (fp32, 1e-5), on the padded and the unpadded path."""
    folder = folders[family]
    theirs_tokenizer = T.AutoTokenizer.from_pretrained(folder)
    tokenizer = BertTokenizer.from_pretrained(folder)
    assert isinstance(tokenizer, JsonTokenizer) == (family not in ("electra", "distilbert"))
    reference = T.AutoModel.from_pretrained(folder).eval()
    model = BertModel.from_pretrained(folder)
    assert model.config.model_type == family
    for texts, pairs in ((TEXTS, None), (TEXTS, PAIRS), (TEXTS[:1], PAIRS[:1])):
        # (cut as each cuts a pair: the longer side first, to the model's length)
        want = theirs_tokenizer(texts, pairs, padding=True, truncation=True, max_length=40,
                                return_tensors="pt", return_offsets_mapping=True)  # fmt: skip
        got = tokenizer(texts, pairs, padding=True, max_length=40, return_tensors="pt",
                        return_offsets=True)  # fmt: skip
        assert torch.equal(got["input_ids"], want["input_ids"]), family
        assert torch.equal(got["attention_mask"], want["attention_mask"])
        assert torch.equal(got["offset_mapping"], want["offset_mapping"])
        if "token_type_ids" in want and model.config.type_vocab_size > 1:
            assert torch.equal(got["token_type_ids"], want["token_type_ids"])
        inputs = {
            k: want[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in want
        }
        expected = _hidden(reference, inputs)
        real = want["attention_mask"][..., None].bool()
        assert real.sum() < real.numel() or len(texts) == 1  # padding in the batch
        for unpad in (False, True):
            hidden = _hidden(model, {**inputs, "token_type_ids": got["token_type_ids"]},
                             unpad=unpad)  # fmt: skip
            assert torch.allclose(hidden[real.expand_as(hidden)],
                                  expected[real.expand_as(expected)], atol=1e-5), (family, unpad)  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_model_saves_back_in_its_own_layout(folders, family, tmp_path):
    """Saved by bertkit, the folder keeps the family's config keys, tensor names and tokenizer
    files, and transformers loads it with the family's class, to the same outputs."""
    model = BertModel.from_pretrained(folders[family])
    out = tmp_path / "saved"
    model.save_pretrained(out, tokenizer=BertTokenizer.from_pretrained(folders[family]))
    written = json.loads((out / "config.json").read_text())
    original = json.loads((folders[family] / "config.json").read_text())
    assert written["model_type"] == family
    assert written["architectures"] == original["architectures"]
    for key in ("dim", "n_layers", "hidden_dim") if family == "distilbert" else ("hidden_size",):
        assert written[key] == original[key]
    reloaded = T.AutoModel.from_pretrained(out).eval()
    assert type(reloaded).__name__ == original["architectures"][0]
    reference = T.AutoModel.from_pretrained(folders[family]).eval()
    ids = torch.tensor([[0, 5, 9, 11, 2]])
    assert torch.equal(
        _hidden(reloaded, {"input_ids": ids}), _hidden(reference, {"input_ids": ids})
    )
    assert (
        T.AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"]
        == (T.AutoTokenizer.from_pretrained(folders[family])(TEXTS)["input_ids"])
    )


def test_an_embedder_of_a_family_folder_pools_as_sentence_transformers(folders):
    """`Embedder` on an XLM-RoBERTa folder: the mean of transformers' hidden states at the real
    tokens, at unit length (what sentence-transformers computes for a mean-pooled model)."""
    from bertkit.inference.embedder import Embedder

    folder = folders["xlm-roberta"]
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    hidden = _hidden(T.AutoModel.from_pretrained(folder).eval(), encoded)
    mask = encoded["attention_mask"][..., None].float()
    mean = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.normalize(mean, dim=-1).numpy()
    got = Embedder(folder, precision="fp32")(TEXTS)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_an_architecture_bertkit_does_not_run_is_named_with_those_it_does(folders, tmp_path):
    folder = tmp_path / "gpt"
    shutil.copytree(folders["roberta"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(
        ValueError, match=r"model_type 'gpt2' is not .* it runs bert, roberta, xlm-roberta"
    ):
        BertModel.from_pretrained(folder)


def test_a_folder_whose_tokenizer_does_not_match_its_model_is_refused(folders, tmp_path):
    """RoBERTa's weights beside XLM-R's tokenizer: refused by name before any text runs."""
    from bertkit.inference.loader import load

    folder = tmp_path / "mixed"
    shutil.copytree(folders["roberta"], folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folders["xlm-roberta"] / name, folder / name)
    with pytest.raises(ValueError, match=r"mixed: a Unigram tokenizer beside a roberta model, "
                                         "whose tokenizer is BPE"):  # fmt: skip
        _ = load(folder, head="BertModel").tokenizer


@pytest.mark.parametrize("family", FAMILIES)
def test_the_commands_that_read_an_encoder_take_a_family_folder(folders, family, tmp_path, ort):
    """extract, similarity, attention and export run on a family folder (byte-level BPE,
    SentencePiece, WordPiece without segments, ELECTRA's projection), and its ONNX export
    serves /embed as the torch model does."""
    from bertkit.cli import main
    from bertkit.serve import ServedModel

    folder = folders[family]
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat sat on the mat.\nA dog barked at the river bank.\n")
    commands = (
        ["extract", "--input", str(texts), "--out", str(tmp_path / "f.safetensors")],
        ["similarity", "--out", str(tmp_path / "s.png"), "The cat sat.", "A dog."],
        ["attention", "--out", str(tmp_path / "a.png"), "The cat sat."],
        ["export", "--out", str(tmp_path / "onnx")],
    )
    for command in commands:
        assert main([command[0], "--model", str(folder), *command[1:]]) == 0, command[0]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("f.safetensors", "s.png", "a.png"))
    body = {"inputs": ["The cat sat on the mat.", "日本語"]}
    answers = {}
    for backend, path in (("torch", folder), ("onnx", tmp_path / "onnx")):
        served = ServedModel(path, backend=backend)
        answers[backend] = np.stack(served.run("embed", served.parse("embed", body)))
    np.testing.assert_allclose(answers["onnx"], answers["torch"], atol=1e-5)


def _parity_runs(task, data, folder, auto_class, tmp_path, dropout=0.1, **settings):
    """A `--parity --precision fp32` run of bertkit's model and one of transformers' `auto_class`
    started from the same weights (saved by bertkit in the family's layout, loaded by
    transformers) on the same batches: {"ours"/"theirs": (each step's losses, results)} and
    how many forwards transformers' model made."""
    from bertkit.finetuning.train import FinetuneConfig, build_model, finetune

    from helpers import OWN_QUICK

    segments = T.AutoConfig.from_pretrained(folder).to_dict().get("type_vocab_size", 0)
    calls = []

    class Theirs(torch.nn.Module):
        def __init__(self, ours, where) -> None:
            super().__init__()
            ours.save_pretrained(where)
            self.hf = auto_class.from_pretrained(where)
            self.config = ours.config

        def forward(self, **inputs):
            calls.append(1)
            if not segments:  # (DistilBERT, MPNet and ModernBERT take no token types)
                inputs.pop("token_type_ids", None)
            return self.hf(**inputs)

        def save_pretrained(self, directory, tokenizer=None) -> None:
            self.hf.save_pretrained(directory)
            tokenizer.save_pretrained(directory)

    config = FinetuneConfig(
        **OWN_QUICK
        | {"epochs": 2, "parity": True, "precision": "fp32", "dropout": dropout}
        | settings
    )
    theirs = lambda task, model, seed: Theirs(build_model(task, model, seed), tmp_path / "start")  # noqa: E731
    runs = {}
    for side, builder in (("ours", None), ("theirs", theirs)):
        out = tmp_path / side
        results = finetune(task, folder, data, out, config, build=builder)
        lines = (out / "log.jsonl").read_text().splitlines()
        runs[side] = [e["loss"] for e in map(json.loads, lines) if e["split"] == "train"], results
    return runs, len(calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_fine_tuning_of_a_family_follows_transformers_run_for_run(folders, family, tmp_path):
    """`--parity --precision fp32` on a family folder: every step's loss and the dev figures of
    bertkit's run equal those of transformers' own class of the family (its classifier: RoBERTa's
    dense + tanh, ELECTRA's GELU, DistilBERT's pre_classifier), started from the same weights —
    saved by bertkit in the family's layout and loaded by transformers — on the same batches
    with the same dropout draws."""
    from helpers import topic_files

    # ModernBERT drops out elsewhere than BERT (inside its MLP, after its attention's Wo) and
    # is released without dropout: its parity run keeps its own 0
    runs, calls = _parity_runs("text-classification", topic_files(tmp_path), folders[family],
                               T.AutoModelForSequenceClassification, tmp_path,
                               dropout=0.0 if family == "modernbert" else 0.1)  # fmt: skip
    (ours, ours_results), (theirs, theirs_results) = runs["ours"], runs["theirs"]
    assert calls >= len(theirs) >= 5
    assert ours == pytest.approx(theirs, abs=1e-5), (ours, theirs)
    assert ours_results["dev"] == pytest.approx(theirs_results["dev"], abs=1e-6)
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == family
    assert saved["architectures"][0].endswith("ForSequenceClassification")


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_multiple_choice_of_a_family_follows_transformers(folders, family, tmp_path):
    """Multiple choice on each family, scored as its transformers class scores a choice (the
    pooler and one linear layer for RoBERTa, XLM-R and MPNet; DistilBERT's pre_classifier,
    ELECTRA's sequence_summary, ModernBERT's head), each choice laid out as the family's pair:
    bertkit's `--parity` run equals transformers' step for step, and saves the family's
    class."""
    from helpers import choice_rows

    rng = np.random.default_rng(0)
    for split, count in (("train", 64), ("dev", 16)):
        rows = choice_rows(count, rng)
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from bertkit.tasks.own import DataConfig

    data = DataConfig(train=str(tmp_path / "train.jsonl"), validation=str(tmp_path / "dev.jsonl"))
    # ModernBERT (no dropout, see above) at a fifth of the learning rate, its later steps
    # within 1e-4: its classifier's bias gets a gradient of rounding noise alone (a shift
    # shared by every choice changes no softmax), and Adam turns such noise, there and in the
    # tiny model's near-zero gradients, into whole steps of random sign. transformers' own
    # eager and sdpa attention part the same way (4e-6 by step 8 of a run at 5e-3, ours 8e-6;
    # this run at 5e-3: 5e-4 after step 2)
    modern = family == "modernbert"
    runs, calls = _parity_runs("multiple-choice", data, folders[family],
                               T.AutoModelForMultipleChoice, tmp_path,
                               **({"dropout": 0.0, "learning_rate": 1e-3} if modern else {}))  # fmt: skip
    (ours, ours_results), (theirs, theirs_results) = runs["ours"], runs["theirs"]
    assert calls >= len(theirs) >= 5
    assert ours[:2] == pytest.approx(theirs[:2], abs=1e-5), (ours, theirs)
    assert ours == pytest.approx(theirs, abs=1e-4 if modern else 1e-5), (ours, theirs)
    assert ours_results["dev"] == pytest.approx(theirs_results["dev"], abs=1e-4 if modern else 1e-6)
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == [T.AutoModelForMultipleChoice.from_pretrained(
        tmp_path / "ours").__class__.__name__]  # fmt: skip
    assert saved["architectures"][0].endswith("ForMultipleChoice")


@pytest.mark.parametrize("family", ["roberta", "mpnet", "distilbert", "modernbert"])
def test_fill_mask_reads_a_family_masked_lm(folders, family, tmp_path):
    """A family's masked LM (RoBERTa's lm_head, DistilBERT's vocab_projector) fills its own mask
    token (<mask>, [MASK]) with transformers' probabilities; saved back, transformers reads the
    head under its names."""
    from bertkit.core.heads import BertForMaskedLM
    from bertkit.inference.fill_mask import FillMask

    folder = tmp_path / "mlm"
    shutil.copytree(folders[family], folder)
    config = T.AutoConfig.from_pretrained(folder)
    torch.manual_seed(1)
    T.AutoModelForMaskedLM.from_config(config).eval().save_pretrained(folder)
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    text = f"the cat {tokenizer.mask_token} on the mat."
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = T.AutoModelForMaskedLM.from_pretrained(folder).eval()(**encoded).logits
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    expected = logits[0, position].softmax(-1).topk(3)
    [[answer]] = FillMask(folder)(text, top=3)
    assert answer["position"] == position
    assert answer["ids"] == expected.indices.tolist()
    assert answer["probabilities"] == pytest.approx(expected.values.tolist(), abs=1e-6)
    BertForMaskedLM.from_pretrained(folder).save_pretrained(tmp_path / "back")
    state = T.AutoModelForMaskedLM.from_pretrained(tmp_path / "back").state_dict()
    reference = T.AutoModelForMaskedLM.from_pretrained(folder).state_dict()
    assert all(torch.equal(state[k], reference[k]) for k in reference if "position_ids" not in k)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "modernbert"])
def test_a_family_tagger_fine_tunes_predicts_serves_and_exports(folders, family, tmp_path, ort):
    """Token tagging on a family folder: words cut as transformers cuts words split beforehand
    (`add_prefix_space`: RoBERTa's `Ġword`); the fine-tuned folder predicts entities with
    character offsets, `serve` answers /predict alike, its ONNX export the same tags, and
    transformers' token-classification class of the family loads it."""
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.inference.export import export_onnx
    from bertkit.inference.predict import Predictor
    from bertkit.serve import ServedModel
    from bertkit.tasks.own import DataConfig

    from helpers import OWN_QUICK, conll_text, tagged_sentences

    words = ["Paris", "loves", "sushi", "today"]
    theirs = T.AutoTokenizer.from_pretrained(folders[family], add_prefix_space=True)
    if family == "modernbert":  # (its generic fast tokenizer takes no add_prefix_space)
        spaced = theirs([" " + w for w in words], add_special_tokens=False)["input_ids"]
        expected = [i for piece in spaced for i in piece]
    else:
        expected = theirs(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    got = BertTokenizer.from_pretrained(folders[family]).encode_words(words)
    assert [i for piece in got for i in piece] == expected
    for split, (count, seed) in {"train": (200, 0), "dev": (30, 1)}.items():
        (tmp_path / f"{split}.conll").write_text(conll_text(tagged_sentences(count, seed)))
    data = DataConfig(train=str(tmp_path / "train.conll"), validation=str(tmp_path / "dev.conll"))
    out = tmp_path / "tagger"
    finetune("token-classification", folders[family], data, out,
             FinetuneConfig(**OWN_QUICK | {"epochs": 3}))  # fmt: skip
    text = "paris loves sushi today"
    [answer] = Predictor(out)([text])
    assert answer["words"] == text.split() and len(answer["tags"]) == 4
    # the tagger learnt some of the training files' cities and foods: its entities, each at
    # its characters (none would leave the offsets unchecked). The tiny DistilBERT's WordPiece
    # vocabulary has no piece of "paris" or "sushi" ([UNK], like every entity word): it cannot
    # tell them apart, and tags nothing
    assert answer["entities"] or family == "distilbert", answer["tags"]
    for entity in answer["entities"]:
        assert text[entity["start"] : entity["end"]] == entity["text"]
    served = ServedModel(out)
    assert served.run("predict", served.parse("predict", {"inputs": text})) == [answer]
    export_onnx(out, tmp_path / "onnx")
    [exported] = Predictor(tmp_path / "onnx", backend="onnx")([text])
    assert exported["tags"] == answer["tags"]
    loaded = T.AutoModelForTokenClassification.from_pretrained(out)
    assert type(loaded).__name__.lower().startswith(family)


@pytest.mark.parametrize("family", ["xlm-roberta", "modernbert"])
def test_sentence_transformers_reads_a_folder_bertkit_saved(folders, family, tmp_path):
    """A family encoder saved by bertkit (its weights, config and tokenizer files) loads in
    sentence-transformers, whose mean-pooled vectors equal bertkit's `Embedder`'s."""
    st = pytest.importorskip("sentence_transformers")
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.inference.embedder import Embedder

    out = tmp_path / "saved"
    BertModel.from_pretrained(folders[family]).save_pretrained(
        out, tokenizer=BertTokenizer.from_pretrained(folders[family])
    )
    theirs = st.SentenceTransformer(str(out), device="cpu")
    expected = theirs.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(Embedder(out, precision="fp32")(TEXTS), expected, atol=1e-5)


def test_a_family_head_saved_by_transformers_opens_as_its_head(folders, tmp_path):
    """A folder transformers saved with RobertaForSequenceClassification (no task record)
    opens with bertkit's sequence classifier, its logits transformers' own."""
    from bertkit.inference.loader import load

    folder = tmp_path / "classifier"
    shutil.copytree(folders["roberta"], folder)
    torch.manual_seed(2)
    config = T.AutoConfig.from_pretrained(folder, num_labels=3)
    reference = T.AutoModelForSequenceClassification.from_config(config).eval()
    reference.save_pretrained(folder)
    loaded = load(folder)
    assert loaded.head == "BertForSequenceClassification"
    ids = torch.tensor([[0, 5, 9, 11, 2]])
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        assert torch.allclose(loaded.model(ids).logits, expected, atol=1e-6)


def _masked_lm_folder(folders, family, folder):
    """The family's tiny model with transformers' masked-LM head (ELECTRA's generator's)."""
    shutil.copytree(folders[family], folder)
    torch.manual_seed(1)
    T.AutoModelForMaskedLM.from_config(T.AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_pretraining_continues_a_family_masked_lm_as_transformers_scores_it(
    folders, family, tmp_path
):
    """`pretrain --init-from` a family's masked LM: the shards hold its own tokenizer's pieces,
    an instance is laid out as that tokenizer lays out a text (RoBERTa's <s> A </s>, no
    segments, its pad and mask ids; specials never masked), the objective is the masked LM (no
    NSP head in the family), the first step's loss is transformers' loss on the same batch, and
    the folder written loads in transformers as the family's masked LM with bertkit's logits."""
    from bertkit.core.heads import BertForMaskedLM
    from bertkit.core.losses import IGNORE_INDEX
    from bertkit.pretraining.dataset import PretrainingData
    from bertkit.pretraining.shards import Shards, prepare_shards
    from bertkit.pretraining.train import run_pretraining

    folder = _masked_lm_folder(folders, family, tmp_path / "mlm")
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(" ".join(CORPUS[i : i + 7]) for i in range(0, len(CORPUS), 7)))
    tokenizer = BertTokenizer.from_pretrained(folder)
    if family == "roberta":  # raw text: the run tokenises it (in worker processes)
        data, shards_dir = text, tmp_path / "out-shards"
    else:
        data = shards_dir = tmp_path / "shards"
        prepare_shards([text], tokenizer, shards_dir, workers=1, progress=False)
    settings = dict(init_from=folder, max_steps=2, batch_size=4, seq_len=32, log_every=1,
                    dropout=0.0, learning_rate=1e-3, warmup_steps=1, progress=False)  # fmt: skip
    run_pretraining(data, tmp_path / "out", **settings)
    shards = Shards(shards_dir)
    assert shards.tokenizer().vocab_hash == tokenizer.vocab_hash
    assert type(shards.tokenizer()) is type(tokenizer)

    batch = PretrainingData(
        shards, tokenizer, batch_size=4, seq_len=32, objective="mlm"
    ).next_batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (ids[:, 0] == tokenizer.cls_token_id).all()
    assert (ids[torch.arange(4), mask.sum(1) - 1] == tokenizer.sep_token_id).all()
    assert (ids[mask == 0] == tokenizer.pad_token_id).all()
    assert not batch["token_type_ids"].any()
    masked = batch["labels"] != IGNORE_INDEX
    at = ids.gather(1, batch["masked_positions"])[masked]
    layout = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id])
    assert not torch.isin(batch["labels"][masked], layout).any()  # ([UNK] may be a label)
    assert (at == tokenizer.mask_token_id).sum() > masked.sum() // 2  # 80% become the mask

    reference = T.AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = reference(input_ids=ids, attention_mask=mask).logits
    picked = logits.gather(1, batch["masked_positions"][..., None].expand(-1, -1, logits.shape[-1]))
    expected = torch.nn.functional.cross_entropy(
        picked.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
    )
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert log[1]["step"] == 1 and "nsp_loss" not in log[1]
    assert log[1]["mlm_loss"] == pytest.approx(expected.item(), abs=1e-5)

    back = T.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == type(reference).__name__
    with torch.no_grad():
        ours = BertForMaskedLM.from_pretrained(tmp_path / "out").eval()(ids, attention_mask=mask)
        theirs = back(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours.logits[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=0)
    if family == "roberta":
        with pytest.raises(ValueError, match="roberta model pre-trains with --objective mlm"):
            run_pretraining(data, tmp_path / "nsp", **settings, objective="mlm+nsp")


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "mpnet", "modernbert"])
def test_whole_word_masking_reads_the_word_marks_of_a_family_tokenizer(folders, family):
    """A piece continues a word exactly where the tokenizer's own word ids say so (Ġ of a
    byte-level BPE, ▁ of a SentencePiece, ## of a WordPiece); the random replacements of
    masked-LM pre-training never draw a special token."""
    tokenizer = BertTokenizer.from_pretrained(folders[family])
    continues = tokenizer.continues_word()
    encoding = tokenizer.backend.encode(" the investors bought shares near the river bank monday")
    words = encoding.word_ids
    expected = [i > 0 and words[i] == words[i - 1] for i in range(len(words))]
    assert [continues[i] for i in encoding.ids] == expected
    assert any(expected) or family == "mpnet"  # (its tiny WordPiece vocabulary: whole words)
    assert not set(tokenizer.ordinary_ids()) & set(tokenizer.all_special_ids)
    assert not any(continues[i] for i in tokenizer.all_special_ids)


def test_modernbert_attends_sequence_by_sequence_as_transformers_on_the_grid(folders, monkeypatch):
    """In inference on the CPU, ModernBERT's attention runs on each sequence's own rows (its
    rotary positions from its first piece, its 8-piece windows over its own pieces): a batch of
    a long input beside short ones gives transformers' hidden states and classifier logits,
    and the path is the one taken; so do long sequences' global layers through SDPA's kernel
    (`SDPA_FROM`, here from 16 keys)."""
    from bertkit.core import unpad
    from bertkit.core.heads import BertForSequenceClassification

    folder = folders["modernbert"]
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    texts = [" ".join(CORPUS[:12]), "The cat sat.", " ".join(CORPUS[3:5]), "Ein Hund"]
    inputs = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    lengths = inputs["attention_mask"].sum(1)
    assert inputs["input_ids"].shape[1] == 64 and lengths.min() < 8 < 16 < lengths[2] < 64
    model = BertModel.from_pretrained(folder).eval()
    layouts = model.layouts(inputs["attention_mask"], tuple(inputs["input_ids"].shape), "cpu",
                            unpad=True, causal=False)  # fmt: skip
    assert layouts.rows.spans is not None
    real = inputs["attention_mask"].bool()
    expected = _hidden(T.AutoModel.from_pretrained(folder).eval(), inputs)
    hidden = _hidden(model, inputs, unpad=True)
    torch.testing.assert_close(hidden[real], expected[real], atol=1e-5, rtol=0)
    monkeypatch.setattr(unpad, "SDPA_FROM", 16)
    hidden = _hidden(model, inputs, unpad=True)
    torch.testing.assert_close(hidden[real], expected[real], atol=1e-5, rtol=0)

    torch.manual_seed(3)
    reference = T.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3).eval()
    reference.save_pretrained(folder.parent / "modernbert-classifier")
    classifier = BertForSequenceClassification.from_pretrained(
        folder.parent / "modernbert-classifier"
    )
    with torch.no_grad():
        ours = classifier.eval()(inputs["input_ids"], attention_mask=inputs["attention_mask"])
        torch.testing.assert_close(ours.logits, reference(**inputs).logits, atol=1e-5, rtol=0)


def test_modernbert_by_sequence_under_bf16_autocast_keeps_the_added_rows_apart(
    folders, monkeypatch
):
    """Under bf16 autocast the rows are rounded up to 64 and the extra rows sit in a sequence's
    span after its real ones: they take no rotary position and no window, and every real
    token's state is the grid's (to bf16's rounding)."""
    from bertkit.core import model as model_module

    monkeypatch.setattr(model_module, "by_sequence_from", lambda device: 48)  # (the tiny width)
    model = BertModel.from_pretrained(folders["modernbert"]).eval()
    lengths = [64, 37, 61, 3]
    ids = torch.randint(5, 250, (4, 64), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(64)[None] < torch.tensor(lengths)[:, None]).long()
    outputs = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layout = model.layouts(mask, (4, 64), "cpu", unpad=True, causal=False).rows
        assert layout.spans is not None and any(c > k for _, c, k in layout.spans)
        for by_sequence in (True, False):
            model.attention_by_sequence = by_sequence
            outputs[by_sequence] = model(ids, attention_mask=mask, unpad=True).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(outputs[True][real].float(), outputs[False][real].float(),
                               atol=5e-2, rtol=0)  # fmt: skip
