from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
import torch

from bertkit import BertTokenizer, train_vocab
from bertkit.core.tokenizer import load_vocab, looks_uncased

from helpers import data_path


def test_vocab_with_a_byte_order_mark_and_an_empty_pair(tmp_path):
    from bertkit.core.tokenizer import BertTokenizer, load_vocab

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    (tmp_path / "vocab.txt").write_text("\ufeff" + "\n".join(tokens) + "\n", encoding="utf-8")
    assert load_vocab(tmp_path / "vocab.txt") == tokens
    tokenizer = BertTokenizer.from_pretrained(tmp_path)
    assert tokenizer("a", "")["input_ids"] == tokenizer("a")["input_ids"] == [2, 5, 3]


ADVERSARIAL = [
    "",
    "   ",
    "\t\n\r",
    "Héllo wörld, naïve café, Ångström, ﬁancé, Æsir, ß, İstanbul",
    "ÀÉÎÕÜ àéîõü çÇ ñÑ",
    "中文字符和日本語のテキスト、한국어 텍스트",
    "mixed中文text with 汉字in the middle",
    "emoji 😀🤗👍🏽 👨‍👩‍👧 flags 🇫🇷 and ❤️",
    "control\x00chars\x01\x07\x1b[0m here\x7f",
    "zero\u200bwidth\u200cjoiner\u200dand\ufeffbom\u2060",
    "soft\u00adhyphen and non\u00a0breaking space",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101,
    "supercalifragilisticexpialidocious" * 4,
    "[CLS] [SEP] [MASK] [PAD] [UNK] [mask] [unused0] [ CLS ]",
    "don't stop—ever…  “quoted” ‘single’ «guillemets» ¿qué? ¡sí!",
    "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r@s#t$u%v^w&x*y+z=~`",
    "$1,234.56 — 50% off — 3.14159e-10 — 0x1F — C++ — C# — e-mail",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "Combining: e\u0301 a\u0308 n\u0303; precomposed: é ä ñ",
    "Greek Αθήνα, Cyrillic Москва, Arabic العربية, Hebrew עברית, Thai ภาษาไทย",
    "Devanagari हिन्दी, Tamil தமிழ், math ∑∫∂√∞≠≤≥, arrows ←→↔",
    "fullwidth ＡＢＣ１２３ and halfwidth ｶﾀｶﾅ",
    "tabs\tand\nnewlines\r\nand\u2028line\u2029separators\u0085",
    "   leading and trailing spaces   ",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
]


def _real_lines() -> list[str]:
    """>= 20k lines of real text: SQuAD contexts and questions, CoNLL-2003 sentences,
    Wikipedia paragraphs and Gutenberg sentences from $BERTKIT_DATA."""
    lines: list[str] = []
    squad = json.loads(data_path("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            lines.append(paragraph["context"])
            lines.extend(qa["question"] for qa in paragraph["qas"])
    words: list[str] = []
    conll = 0
    for line in data_path("conll2003", "train.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words and conll < 4000:
                lines.append(" ".join(words))
                conll += 1
            words = []
        elif not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
    wiki = 0
    for line in (
        data_path("corpus", "wikipedia_2015", "AB", "wiki_00")
        .read_text(encoding="utf-8")
        .splitlines()
    ):
        if line.strip() and not line.startswith(("<doc", "</doc")) and wiki < 4000:
            lines.append(line)
            wiki += 1
    for book in ("melville-moby_dick.txt", "austen-emma.txt"):
        text = data_path("corpus", "gutenberg_nltk_tokenized", book).read_text(encoding="utf-8")
        lines.extend([line for line in text.splitlines() if line.strip()][:1500])
    return lines


@pytest.fixture(scope="module")
def real_lines() -> list[str]:
    lines = _real_lines()
    assert len(lines) >= 20_000, len(lines)
    return lines


def _vocab_dirs(minilm_dir):
    return {"bert-base-uncased": data_path("vocab", "bert-base-uncased"), "minilm": minilm_dir}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert-base-uncased", "minilm"])
def test_ids_match_hf_fast_on_real_text(name, real_lines, minilm_dir, transformers):
    directory = _vocab_dirs(minilm_dir)[name]
    ours = BertTokenizer.from_pretrained(directory)
    assert ours.lowercase
    hf = transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=True)
    texts = real_lines + ADVERSARIAL
    expected = hf(texts, truncation=False)["input_ids"]
    got = ours(texts, truncation=False)["input_ids"]
    mismatches = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
    assert not mismatches, f"{len(mismatches)} lines differ, first: {texts[mismatches[0]]!r}"
    # pairs with truncation and padding, as fine-tuning uses them
    firsts, seconds = texts[0:4000:2], texts[1:4000:2]
    kwargs = dict(max_length=64, truncation="longest_first", padding="max_length")
    a = hf(firsts, seconds, **kwargs)
    b = ours(firsts, seconds, **kwargs)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert a[key] == b[key], key


def test_matches_googles_algorithm_slow_port(real_lines, transformers):
    """transformers' slow BertTokenizer is a line-by-line port of Google's tokenization.py."""
    directory = data_path("vocab", "bert-base-uncased")
    ours = BertTokenizer.from_pretrained(directory)
    slow = transformers.BertTokenizer(str(directory / "vocab.txt"), do_lower_case=True)
    texts = real_lines[::10] + ADVERSARIAL
    for text in texts:
        assert ours.tokenize(text) == slow.tokenize(text), text


def test_cased_mode_keeps_case_and_accents(transformers):
    directory = data_path("vocab", "bert-base-uncased")
    ours = BertTokenizer.from_pretrained(directory, lowercase=False)
    hf = transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=False)
    for text in ADVERSARIAL:
        assert ours(text)["input_ids"] == hf(text)["input_ids"], text
    assert ours.tokenize("Héllo") != BertTokenizer.from_pretrained(directory).tokenize("Héllo")


def _check_offsets(tok: BertTokenizer, texts: list[str]) -> int:
    encoded = tok(texts, truncation=False, return_offsets=True)
    checked = exact = 0
    for text, ids, offsets in zip(
        texts, encoded["input_ids"], encoded["offset_mapping"], strict=True
    ):
        for token_id, (start, end) in zip(ids, offsets, strict=True):
            token = tok.convert_ids_to_tokens(token_id)
            if token_id in tok.all_special_ids and token_id != tok.unk_token_id:
                # inserted by the template: (0, 0); written in the text: its literal span
                assert (start, end) == (0, 0) or text[start:end] == token
                continue
            piece = text[start:end]
            assert piece, (text, token)
            if token == "[UNK]":
                continue  # an unknown word: its whole span, nothing to compare
            normalised = tok.backend.normalizer.normalize_str(piece).strip()  # CJK gets spaces
            # Usually equal; a character that normalises to several (Hangul syllables under NFD)
            # gives several pieces that all point at that one character.
            assert token.removeprefix("##") in normalised, (text, token, piece)
            exact += normalised == token.removeprefix("##")
            checked += 1
    assert exact / checked > 0.999
    return checked


def test_offsets_slice_back_to_the_original_text(real_lines):
    tok = BertTokenizer.from_pretrained(data_path("vocab", "bert-base-uncased"))
    assert _check_offsets(tok, real_lines[::4] + ADVERSARIAL) > 100_000


def test_offsets_for_pairs_point_into_each_text():
    tok = BertTokenizer.from_pretrained(data_path("vocab", "bert-base-uncased"))
    a, b = "Where is Émile?", "Émile lives in Paris."
    enc = tok(a, b, return_offsets=True)
    pieces = [
        (a if segment == 0 else b)[s:e]
        for segment, (s, e) in zip(enc["token_type_ids"], enc["offset_mapping"], strict=True)
    ]
    assert pieces == ["", "Where", "is", "Émile", "?", "", "Émile", "lives", "in", "Paris", ".", ""]


def test_layout_truncation_padding_and_tensors():
    tok = BertTokenizer.from_pretrained(data_path("vocab", "bert-base-uncased"))
    single = tok("hello world")
    assert single["input_ids"] == [101, 7592, 2088, 102]
    assert single["token_type_ids"] == [0, 0, 0, 0] and single["attention_mask"] == [1] * 4
    pair = tok("hello", "big world")
    assert pair["input_ids"] == [101, 7592, 102, 2502, 2088, 102]
    assert pair["token_type_ids"] == [0, 0, 0, 1, 1, 1]
    # longest_first drops from the end of the longer segment, one token at a time (Google's)
    apple, pear = tok.convert_tokens_to_ids(["apple", "pear"])
    long_a = " ".join(["apple"] * 10)
    cut = tok(long_a, "pear pear", max_length=8)
    assert cut["input_ids"] == [101, apple, apple, apple, 102, pear, pear, 102]
    only_second = tok("pear pear", long_a, max_length=8, truncation="only_second")
    assert only_second["input_ids"] == [101, pear, pear, 102, apple, apple, apple, 102]
    assert len(tok("word " * 1000)["input_ids"]) == 512  # model_max_length by default
    assert len(tok("word " * 1000, truncation=False)["input_ids"]) == 1002
    batch = tok(["a", "a b c"], padding=True, return_tensors="pt")
    assert isinstance(batch["input_ids"], torch.Tensor)
    assert batch["input_ids"].tolist() == [[101, 1037, 102, 0, 0], [101, 1037, 1038, 1039, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    as_np = tok("a", return_tensors="np", padding="max_length", max_length=6)
    assert isinstance(as_np["input_ids"], np.ndarray) and as_np["input_ids"].shape == (1, 6)
    multiple = tok(["a b c d e"], padding=True, pad_to_multiple_of=8)
    assert len(multiple["input_ids"][0]) == 8
    with pytest.raises(ValueError, match="different lengths"):
        tok(["a", "a b c"], return_tensors="pt")
    with pytest.raises(ValueError, match="equal-length lists"):
        tok(["a", "b"], ["c"])
    words = tok("unaffable dog", return_word_ids=True)
    assert words["word_ids"] == [None, 0, 0, 0, 1, None]


def test_decode_and_conversions():
    tok = BertTokenizer.from_pretrained(data_path("vocab", "bert-base-uncased"))
    ids = tok("Hello, unaffable world!")["input_ids"]
    assert tok.decode(ids) == "hello, unaffable world!"
    assert tok.decode(torch.tensor(ids), skip_special_tokens=False).startswith("[CLS]")
    assert tok.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    assert tok.convert_tokens_to_ids(["[CLS]", "the", "not-a-token"]) == [101, 1996, 100]
    assert tok.convert_ids_to_tokens(103) == "[MASK]" and tok.mask_token_id == 103
    # special tokens written in the text are the special tokens, as in Hugging Face
    assert tok("the [MASK] sat")["input_ids"] == [101, 1996, 103, 2938, 102]


def test_bad_text_and_vocab_errors(tmp_path):
    tok = BertTokenizer.from_pretrained(data_path("vocab", "bert-base-uncased"))
    with pytest.raises(
        ValueError, match=r"text\[1\] has a lone surrogate '\\ud800' at character 1"
    ):
        tok(["fine", "a\ud800b"])
    with pytest.raises(TypeError, match=r"text\[0\] must be a string, got int"):
        tok([3])
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.tokenize("\udfff")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\nthe\n")
    with pytest.raises(ValueError, match=r"vocab.txt:6: token 'the' repeats line 5"):
        BertTokenizer(vocab)
    vocab.write_text("[PAD]\n[UNK]\nthe\n")
    with pytest.raises(ValueError, match=r"special tokens \['\[CLS\]', '\[SEP\]'\] are missing"):
        BertTokenizer(vocab)
    vocab.write_text("[PAD]\n\n[UNK]\n")
    with pytest.raises(ValueError, match="vocab.txt:2: empty token"):
        BertTokenizer(vocab)
    vocab.write_bytes(b"[PAD]\n[UNK]\n\xff\xfe\n")
    with pytest.raises(ValueError, match="vocab.txt:3: not UTF-8"):
        BertTokenizer(vocab)
    with pytest.raises(FileNotFoundError, match="nowhere: no such folder"):
        BertTokenizer.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path / "empty")
    vocab.write_text("[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nthe\r\n")  # Windows line ends
    assert BertTokenizer(vocab)("the")["input_ids"] == [2, 4, 3]


def test_casing_detected_from_config_or_vocab(tmp_path):
    assert looks_uncased(load_vocab(data_path("vocab", "bert-base-uncased", "vocab.txt")))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nThe\nthe\n")
    assert not BertTokenizer.from_pretrained(tmp_path).lowercase
    (tmp_path / "tokenizer_config.json").write_text(
        '{"do_lower_case": true, "model_max_length": 128}'
    )
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert tok.lowercase and tok.model_max_length == 128


def test_save_load_round_trip_and_hf_reads_it(tmp_path, minilm_dir, transformers):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    tok.save_pretrained(tmp_path)
    again = BertTokenizer.from_pretrained(tmp_path)
    assert again.vocab_hash == tok.vocab_hash and again.lowercase
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in ADVERSARIAL:
        assert hf(text)["input_ids"] == again(text)["input_ids"]


def test_train_vocab_layout_and_use(tmp_path):
    lines = [
        "The quick brown fox jumps over the lazy dog.",
        "Pack my box with five dozen liquor jugs!",
        "How vexingly quick daft zebras jump; the five boxing wizards jump quickly.",
    ] * 50
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    tok = train_vocab(
        [corpus], vocab_size=300, num_unused=10, out_dir=tmp_path / "vocab", show_progress=False
    )
    tokens = load_vocab(tmp_path / "vocab" / "vocab.txt")
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[5:15] == [f"[unused{i}]" for i in range(10)]
    assert len(tokens) <= 300 and len(set(tokens)) == len(tokens)
    assert any(t.startswith("##") for t in tokens)
    assert looks_uncased(tokens)
    ids = tok("The quick brown fox")["input_ids"]
    assert tok.unk_token_id not in ids and ids[0] == tok.cls_token_id
    assert tok.decode(ids) == "the quick brown fox"
    reloaded = BertTokenizer.from_pretrained(tmp_path / "vocab")
    assert reloaded("Pack my box")["input_ids"] == tok("Pack my box")["input_ids"]
    # Reproducible: the same corpus gives the same ids, from files or from an iterator (with room
    # for every merge; at a tight cut-off the trainer may pick among equally frequent merges).
    runs = [
        train_vocab([corpus], vocab_size=5000, show_progress=False),
        train_vocab(texts=iter(lines), vocab_size=5000, show_progress=False),
        train_vocab(texts=iter(lines), vocab_size=5000, show_progress=False),
    ]
    assert runs[0].vocab == runs[1].vocab == runs[2].vocab
    assert runs[0].vocab_hash == runs[2].vocab_hash
    with pytest.raises(ValueError, match="corpus is empty"):
        train_vocab(texts=iter([]), vocab_size=300, show_progress=False)
    with pytest.raises(FileNotFoundError, match="missing.txt: no such corpus file"):
        train_vocab([tmp_path / "missing.txt"], show_progress=False)


def test_normaliser_is_googles_cleanup():
    tok = BertTokenizer(vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"], lowercase=True)
    normalize = tok.backend.normalizer.normalize_str
    assert normalize("A\x00b\tB") == "ab b"  # control chars dropped, whitespace -> space
    assert normalize("É") == unicodedata.normalize("NFD", "e")  # lower-cased, accent stripped
    assert normalize("中") == " 中 "  # CJK ideographs are split off


def test_a_folder_with_only_tokenizer_json(tmp_path, minilm_dir):
    import shutil

    shutil.copy(minilm_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    only_json = BertTokenizer.from_pretrained(tmp_path)
    reference = BertTokenizer.from_pretrained(minilm_dir)
    text = "Hello, World! The café's naïve résumé."
    assert only_json(text)["input_ids"] == reference(text)["input_ids"]
    assert only_json.vocab_size == reference.vocab_size == 30522
