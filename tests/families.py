"""Tiny random models of the BERT family with their own tokenizers (byte-level BPE, SentencePiece
Unigram, WordPiece), saved by transformers: what the family's and the saved heads' tests read."""

from __future__ import annotations

import json

import torch
import transformers as T

CORPUS = [
    "The cat sat on the mat.", "A dog barked at the cat near the river bank.",
    "Stock markets rose on Monday!", "Investors bought shares of banks and miners.",
    "naïve café, déjà vu", "日本語のテキスト", "Ein Hund bellte am Fluss.",
] * 20  # fmt: skip
TEXTS = [
    "The cat sat.",
    "Investors bought banks, naïve café!",
    "日本語",
    "A dog barked at the cat.",
]
PAIRS = ["A dog.", "Stock markets rose on Monday near the river bank.", "Ein Hund", "mat"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=66)  # fmt: skip
FAMILIES = ("roberta", "xlm-roberta", "mpnet", "electra", "distilbert", "modernbert")


def _bpe(folder):
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=specials)
    bpe._tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
    )
    bpe.save(str(folder / "tokenizer.json"))
    _special_config(folder, "RobertaTokenizer", "<s>", "</s>", "<pad>", "<unk>", "<mask>")
    return bpe.get_vocab_size()


def _modern_bpe(folder):
    """ModernBERT's tokenizer: a byte-level BPE tokenizer.json with BERT's special tokens and
    pairs ([CLS] A [SEP] B [SEP]), read as it is (PreTrainedTokenizerFast)."""
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=specials)
    bpe._tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    bpe.save(str(folder / "tokenizer.json"))
    _special_config(folder, "PreTrainedTokenizerFast", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
    return bpe.get_vocab_size()


def _unigram(folder):
    """A SentencePiece Unigram tokenizer laid out as XLM-RoBERTa's tokenizer.json is: spaces
    split off, then the Metaspace's ▁ (transformers builds that pipeline for the class)."""
    from tokenizers import SentencePieceUnigramTokenizer, normalizers, pre_tokenizers, processors

    unigram = SentencePieceUnigramTokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    unigram.train_from_iterator(CORPUS, vocab_size=200, special_tokens=specials, unk_token="<unk>")
    unigram.add_special_tokens(["<mask>"])
    unigram._tokenizer.normalizer = normalizers.Replace(" {2,}", " ")
    unigram._tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
    )
    s, e = unigram.token_to_id("<s>"), unigram.token_to_id("</s>")
    unigram._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", s), ("</s>", e)],
    )
    unigram.save(str(folder / "tokenizer.json"))
    _special_config(folder, "XLMRobertaTokenizer", "<s>", "</s>", "<pad>", "<unk>", "<mask>")
    return unigram.get_vocab_size()


def _wordpiece(folder, tokenizer_class):
    words = sorted({w.strip(".,!") for t in CORPUS for w in t.lower().split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *sorted(set("".join(words)))]
    (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": tokenizer_class, "do_lower_case": True})
    )
    return len(dict.fromkeys(vocab))


def _mpnet_wordpiece(folder):
    """MPNet's tokenizer as all-mpnet-base-v2 ships it: a WordPiece tokenizer.json whose
    vocabulary holds <s> </s> <pad> beside BERT's [CLS] [SEP] [UNK], RoBERTa's pairs."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    size = _wordpiece(folder, "MPNetTokenizer")
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + (folder / "vocab.txt").read_text().split("\n")[
        :size
    ]
    tokens.append("<mask>")
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    _special_config(folder, "MPNetTokenizer", "<s>", "</s>", "<pad>", "[UNK]", "<mask>")
    return len(tokens)


def _special_config(folder, tokenizer_class, cls, sep, pad, unk, mask):
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": tokenizer_class, "bos_token": cls, "eos_token": sep, "cls_token": cls,
        "sep_token": sep, "pad_token": pad, "unk_token": unk, "mask_token": mask,
        "model_max_length": SIZES["max_position_embeddings"] - 2,
    }))  # fmt: skip


def build(family: str, folder):
    """A tiny random `family` model and its tokenizer, saved by transformers into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if family == "roberta":
        vocab = _bpe(folder)
        model = T.RobertaModel(T.RobertaConfig(vocab_size=vocab, type_vocab_size=1, **SIZES))
    elif family == "xlm-roberta":
        vocab = _unigram(folder)
        config = T.XLMRobertaConfig(vocab_size=vocab, type_vocab_size=1, **SIZES)
        model = T.XLMRobertaModel(config)
    elif family == "mpnet":
        vocab = _mpnet_wordpiece(folder)
        model = T.MPNetModel(T.MPNetConfig(vocab_size=vocab, **SIZES))
    elif family == "modernbert":
        vocab = _modern_bpe(folder)
        config = T.ModernBertConfig(  # a window of 8 pieces: shorter than the test's texts
            vocab_size=vocab, **SIZES | {"num_hidden_layers": 3}, local_attention=8,
            pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
        )  # fmt: skip
        model = T.ModernBertModel(config)
    elif family == "bert":
        vocab = _wordpiece(folder, "BertTokenizer")
        model = T.BertModel(T.BertConfig(vocab_size=vocab, **SIZES))
    elif family == "electra":
        vocab = _wordpiece(folder, "ElectraTokenizer")
        model = T.ElectraModel(T.ElectraConfig(vocab_size=vocab, embedding_size=16, **SIZES))
    else:
        vocab = _wordpiece(folder, "DistilBertTokenizer")
        config = T.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4,
                                    hidden_dim=37, max_position_embeddings=66)  # fmt: skip
        model = T.DistilBertModel(config)
    model.eval().save_pretrained(folder)
    return folder
