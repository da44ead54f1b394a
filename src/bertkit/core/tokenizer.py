"""WordPiece tokenisation exactly as Google's BERT does it, on the `tokenizers` library.

The pipeline is Google's `FullTokenizer`: text cleanup (control characters dropped, every
whitespace character made a space), spaces around CJK ideographs, lower-casing and accent
stripping for uncased vocabularies, a split on whitespace and punctuation, then greedy
longest-match-first WordPiece with `##` continuations; a word of more than 100 characters or with
no matching piece becomes `[UNK]`. The special tokens (`[CLS]`, `[SEP]`, `[MASK]`, ...) written
literally in the text are recognised as such, as in Hugging Face's tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from bertkit._io import atomic_write_text, read_json
from bertkit.core.config import BertConfig
from bertkit.core.family import family_of, family_of_folder
from bertkit.core.hub import model_dir

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
_REQUIRED_TOKENS = (PAD, UNK, CLS, SEP)
MAX_INPUT_CHARS_PER_WORD = 100  # Google's WordpieceTokenizer default

TextInput = str | Sequence[str]


def load_vocab(path: str | os.PathLike) -> list[str]:
    """Read a `vocab.txt`: one token per line, the line number is the id.

    Raises ValueError naming the file and line for an empty or duplicated token, and when one of
    [PAD] [UNK] [CLS] [SEP] is missing.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: vocabulary file not found") from None
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is not part of the first token
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 (byte offset {err.start})") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()  # the final newline
    seen: dict[str, int] = {}
    for number, token in enumerate(tokens, start=1):
        token = token.rstrip("\r")
        tokens[number - 1] = token
        if not token:
            raise ValueError(f"{path}:{number}: empty token in vocabulary")
        if token in seen:
            raise ValueError(
                f"{path}:{number}: token {token!r} repeats line {seen[token]} (ids must be unique)"
            )
        seen[token] = number
    if not tokens:
        raise ValueError(f"{path}: vocabulary is empty")
    missing = [t for t in _REQUIRED_TOKENS if t not in seen]
    if missing:
        raise ValueError(f"{path}: not a BERT vocabulary, special tokens {missing} are missing")
    return tokens


def _vocab_of_tokenizer_json(path: Path) -> list[str] | None:
    """The vocabulary of a Hugging Face `tokenizer.json` with a WordPiece model, in id order
    (None when there is no such file or it is not WordPiece)."""
    if not path.exists():
        return None
    try:
        model = json.loads(path.read_text(encoding="utf-8")).get("model", {})
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"{path}: not a readable tokenizer.json ({err})") from None
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        return None
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(f"{path}: the WordPiece ids are not 0..{len(by_id) - 1}")
    return [token for token, _ in by_id]


def looks_uncased(tokens: Iterable[str]) -> bool:
    """True when no ordinary token has an upper-case letter (Google's uncased vocabularies).

    >>> looks_uncased(["[PAD]", "[UNK]", "the", "##s"]), looks_uncased(["[CLS]", "The"])
    (True, False)
    """
    for token in tokens:
        if token.startswith("[") and token.endswith("]"):
            continue
        if token != token.lower():
            return False
    return True


class BertTokenizer:
    """Google's BERT tokenizer over a WordPiece `vocab.txt`.

    >>> tok = BertTokenizer.from_pretrained("path/to/model")      # doctest: +SKIP
    >>> tok("Hello, world!")["input_ids"]                        # doctest: +SKIP
    [101, 7592, 1010, 2088, 999, 102]
    """

    def __init__(
        self,
        vocab_file: str | os.PathLike | None = None,
        lowercase: bool = True,
        *,
        vocab: Sequence[str] | None = None,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = 512,
    ) -> None:
        if (vocab_file is None) == (vocab is None):
            raise ValueError("give exactly one of vocab_file and vocab")
        self.vocab_file = Path(vocab_file) if vocab_file is not None else None
        tokens = load_vocab(vocab_file) if vocab_file is not None else list(vocab)  # type: ignore[arg-type]
        self._tokens = tokens
        self._ids = {t: i for i, t in enumerate(tokens)}
        self.lowercase = bool(lowercase)
        # Google strips accents exactly when lower-casing; HF lets `strip_accents` override.
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = int(model_max_length)

        backend = Tokenizer(
            models.WordPiece(
                self._ids, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD
            )
        )
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,
            lowercase=self.lowercase,
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        cls, sep = self._ids[CLS], self._ids[SEP]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS}:0 $A:0 {SEP}:0",
            pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
            special_tokens=[(CLS, cls), (SEP, sep)],
        )
        backend.add_special_tokens(
            [
                AddedToken(t, normalized=False, special=True)
                for t in SPECIAL_TOKENS
                if t in self._ids
            ]
        )
        self.backend = backend
        self._settings: tuple | None = None

    # the special tokens by role: Google's names; a tokenizer.json's own (`JsonTokenizer`)
    pad_token, unk_token, cls_token, sep_token, mask_token = PAD, UNK, CLS, SEP, MASK
    token_types = True  # segment ids 0/1 (a model without segments reads all 0)

    # ----------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """Load from a model directory (or a `vocab.txt` path).

        `do_lower_case` comes from `tokenizer_config.json` when present, otherwise from the
        vocabulary itself (an uncased vocabulary has no upper-case tokens); keyword arguments
        override both. `path` may be a Hub name (`bertkit.core.hub.model_dir`).
        """
        path = model_dir(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such folder (a model directory or vocab.txt)")
        directory = path.parent if path.is_file() else path
        vocab_file = path if path.is_file() else path / "vocab.txt"
        vocab = None
        if path.is_dir() and (directory / "tokenizer.json").exists() and _ships_json(directory):
            return JsonTokenizer.from_pretrained(directory, **overrides)
        if not vocab_file.exists():
            vocab = _vocab_of_tokenizer_json(directory / "tokenizer.json")
            if vocab is None and (directory / "tokenizer.json").exists():
                # a byte-level BPE (RoBERTa) or SentencePiece (XLM-R) tokenizer, as shipped
                return JsonTokenizer.from_pretrained(directory, **overrides)
            if vocab is None:
                raise FileNotFoundError(
                    f"{directory}: no vocab.txt (a BERT WordPiece vocabulary) and no tokenizer.json"
                )
        settings: dict[str, Any] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.exists():
            data = read_json(config_file)
            if "do_lower_case" in data:
                settings["lowercase"] = bool(data["do_lower_case"])
            if data.get("strip_accents") is not None:
                settings["strip_accents"] = bool(data["strip_accents"])
            if "tokenize_chinese_chars" in data:
                settings["tokenize_chinese_chars"] = bool(data["tokenize_chinese_chars"])
            max_length = data.get("model_max_length")
            if isinstance(max_length, int) and 0 < max_length < 1_000_000:
                settings["model_max_length"] = max_length
        if "model_max_length" not in settings:
            for name in ("config.json", "bert_config.json"):
                model_config = directory / name
                if model_config.exists():
                    try:
                        positions = json.loads(model_config.read_text(encoding="utf-8")).get(
                            "max_position_embeddings"
                        )
                    except (json.JSONDecodeError, AttributeError):
                        positions = None
                    if isinstance(positions, int) and positions > 0:
                        settings["model_max_length"] = positions
                    break
        settings.update(overrides)
        if "lowercase" not in settings:
            settings["lowercase"] = looks_uncased(vocab or load_vocab(vocab_file))
        if vocab is not None:  # a Hugging Face folder with only tokenizer.json
            return cls(vocab=vocab, **settings)
        return cls(vocab_file, **settings)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `vocab.txt` and a Hugging Face compatible `tokenizer_config.json`, atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "vocab.txt", "".join(t + "\n" for t in self._tokens))
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "model_max_length": self.model_max_length,
            "unk_token": UNK,
            "sep_token": SEP,
            "pad_token": PAD,
            "cls_token": CLS,
            "mask_token": MASK,
        }
        atomic_write_text(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")

    # ----------------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._ids)

    @property
    def vocab_hash(self) -> str:
        """sha256 of the token list and the casing: equal hashes give equal token ids."""
        digest = hashlib.sha256()
        digest.update(f"lowercase={self.lowercase};strip_accents={self.strip_accents};".encode())
        digest.update("\n".join(self._tokens).encode("utf-8"))
        return digest.hexdigest()

    pad_token_id = property(lambda self: self._ids[self.pad_token])
    unk_token_id = property(lambda self: self._ids[self.unk_token])
    cls_token_id = property(lambda self: self._ids[self.cls_token])
    sep_token_id = property(lambda self: self._ids[self.sep_token])
    mask_token_id = property(lambda self: self._ids.get(self.mask_token))

    @property
    def all_special_ids(self) -> list[int]:
        roles = (self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token)
        return [self._ids[t] for t in roles if t in self._ids]

    def special_tokens_added(self, pair: bool = False) -> int:
        """How many special tokens an input gets: [CLS] A [SEP] 2, with B [SEP] 3 (RoBERTa's
        <s> A </s></s> B </s>: 4)."""
        return int(self.backend.num_special_tokens_to_add(pair))

    def with_specials(self, a: Sequence[int], b: Sequence[int] | None = None
                      ) -> tuple[list[int], list[int]]:  # fmt: skip
        """The ids of A (and B) as the model reads them, and their segment ids: [CLS] A [SEP]
        (B [SEP]), segments 0 then 1; RoBERTa's <s> A </s></s> B </s>, all 0. The layout is
        the tokenizer's own post-processor's (read once from a probe)."""
        parts = self._layout(b is not None)
        ids: list[int] = []
        types: list[int] = []
        for part, type_id in parts:
            chosen = a if part == "A" else b if part == "B" else part
            assert chosen is not None
            ids += chosen
            types += [type_id if self.token_types else 0] * len(chosen)
        return ids, types

    def second_start(self, first: int) -> int:
        """Where B's first piece sits in `with_specials(A, B)` for an A of `first` pieces."""
        start = 0
        for part, _ in self._layout(True):
            if part == "B":
                return start
            start += first if part == "A" else len(part)
        raise ValueError("the tokenizer's pair layout has no second segment")

    def _layout(self, pair: bool) -> tuple[tuple[Any, int], ...]:
        """The post-processor's layout: runs of special ids and the markers "A" and "B", each
        with its segment id (from encoding a probe text, or pair, and reading which pieces are
        whose), worked out once per tokenizer."""
        layouts = self.__dict__.setdefault("_layouts", {})
        if pair not in layouts:
            layouts[pair] = self._probe_layout(pair)
        return layouts[pair]

    def _probe_layout(self, pair: bool) -> tuple[tuple[Any, int], ...]:
        probe = self.backend.encode("a", "b") if pair else self.backend.encode("a")
        parts: list[tuple[Any, int]] = []
        for token, sequence, type_id in zip(probe.ids, probe.sequence_ids, probe.type_ids,
                                            strict=True):  # fmt: skip
            if sequence is not None:
                marker = "AB"[sequence]
                if not parts or parts[-1][0] != marker:
                    parts.append((marker, type_id))
            elif parts and isinstance(parts[-1][0], list) and parts[-1][1] == type_id:
                parts[-1][0].append(token)
            else:
                parts.append(([token], type_id))
        return tuple((tuple(p) if isinstance(p, list) else p, t) for p, t in parts)

    def most_pieces(self, text: str) -> int:
        """The most pieces `text` can become: a WordPiece holds a character or more."""
        return len(text)

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each text's pieces as it reads inside a longer text, after a space: the words of a
        text split beforehand (tagging), the sentences of a document (pre-training shards)."""
        return self.encode_ids(words)

    def ordinary_ids(self) -> list[int]:
        """The ids of pieces of text, not of special tokens or reserved slots ([CLS], [unused7]):
        what masked-LM pre-training draws its random replacements from (Google draws from the
        whole vocabulary)."""
        return [
            i for i, t in enumerate(self._tokens) if not (t.startswith("[") and t.endswith("]"))
        ]

    def continues_word(self) -> list[bool]:
        """Per id, whether its piece continues the word before it (WordPiece's ##): the pieces
        whole-word masking chooses together."""
        return [t.startswith("##") for t in self._tokens]

    @property
    def kind(self) -> str:
        """The tokenizer's model: WordPiece (a tokenizer.json's own: BPE, Unigram, ...)."""
        return "WordPiece"

    @property
    def continuing_subword_prefix(self) -> str | None:
        """What marks a piece that continues a word (WordPiece's ##; None where the
        vocabulary marks word starts instead, or nothing)."""
        return "##"

    def check_model(self, config: Any, where: Any) -> None:
        """Refuse (ValueError naming `where`) a model this tokenizer is not the tokenizer of:
        another kind of tokenizer than its family ships, or more tokens than it embeds."""
        family = family_of(config.model_type)
        if self.kind != family.tokenizer:
            raise ValueError(
                f"{where}: a {self.kind} tokenizer beside a {config.model_type} model, whose "
                f"tokenizer is {family.tokenizer}: not this model's tokenizer"
            )
        if self.vocab_size > config.vocab_size:
            raise ValueError(
                f"{where}: the tokenizer has {self.vocab_size} tokens, the model embeds "
                f"{config.vocab_size}: not this model's vocabulary"
            )

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Ids of tokens; a token not in the vocabulary maps to [UNK]'s id."""
        unk = self._ids[self.unk_token]
        if isinstance(tokens, str):
            return self._ids.get(tokens, unk)
        return [self._ids.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, (int, np.integer)):
            return self._tokens[int(ids)]
        return [self._tokens[int(i)] for i in ids]

    # ----------------------------------------------------------------------- encoding
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of one text, without [CLS]/[SEP].

        >>> tok.tokenize("Unaffable!")               # doctest: +SKIP
        ['una', '##ffa', '##ble', '!']
        """
        try:
            return self.backend.encode(text, add_special_tokens=False).tokens
        except TypeError:
            _check_texts([text], "text")
            raise

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids of each text: no special tokens, no truncation, no padding (what
        pre-training shards store).

        >>> tok.encode_ids(["Hello world", "unaffable"])      # doctest: +SKIP
        [[7592, 2088], [14477, 20961, 3085]]
        """
        self._configure(None, self.model_max_length, None, None)
        try:
            encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        except TypeError:
            _check_texts(texts, "text")
            raise
        return [e.ids for e in encodings]

    def __call__(
        self,
        text: TextInput,
        text_pair: str | Sequence[str | None] | None = None,  # a None in a batch: no pair
        *,
        max_length: int | None = None,
        truncation: bool | str = "longest_first",
        padding: bool | str = False,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        return_offsets: bool = False,
        return_word_ids: bool = False,
        return_special_tokens_mask: bool = False,
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        """Encode one text (or pair) or a batch as `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]`.

        Returns a dict with `input_ids`, `token_type_ids` (0 for A, 1 for B), `attention_mask`
        and, on request, `offset_mapping` ((start, end) character offsets into the text each token
        came from; (0, 0) for special tokens), `word_ids` and `special_tokens_mask` (1 where the
        tokenizer added the token).

        - `truncation`: "longest_first" (default; Google's: drop from the end of the longer of A
          and B, one token at a time), "only_first", "only_second", True (= longest_first) or False.
          Sequences are cut to `max_length`, default `model_max_length`.
        - `padding`: False, True/"longest" (to the longest in the batch) or "max_length".
        - `return_tensors`: None (lists), "pt" (torch) or "np" (numpy); a single text gets a batch
          dimension of 1 with tensors.
        """
        single = isinstance(text, str)
        texts, pairs = _as_batch(text, text_pair)
        limit = self.model_max_length if max_length is None else int(max_length)
        strategy = _truncation_strategy(truncation)
        pad_mode = _padding_mode(padding)
        self._configure(strategy, limit, pad_mode, pad_to_multiple_of)
        # An empty (or None) second segment is no second segment (Google's `if example.text_b:`,
        # and transformers'): `[CLS] A [SEP]`, not `[CLS] A [SEP] [SEP]`; a batch may mix both.
        inputs = (
            texts
            if pairs is None
            else [(a, b) if b else a for a, b in zip(texts, pairs, strict=True)]
        )
        try:
            encodings = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        except TypeError:
            # The Rust side rejects non-strings and lone surrogates with an opaque TypeError;
            # find the culprit only on failure so the common path pays nothing.
            _check_texts(texts, "text")
            if pairs is not None:
                _check_texts(pairs, "text_pair")
            raise

        result = _result(encodings, single, return_tensors, return_offsets, return_word_ids,
                         self.token_types)  # fmt: skip
        if return_special_tokens_mask:
            masks = [e.special_tokens_mask for e in encodings]
            result["special_tokens_mask"] = (
                _to_tensor(masks, return_tensors) if return_tensors else masks[0] if single
                else masks
            )  # fmt: skip
        return result

    def _configure(
        self, strategy: str | None, limit: int, pad_mode: str | None, multiple: int | None
    ) -> None:
        # The Rust tokenizer keeps truncation/padding as state; set it only when it changes.
        settings = (strategy, limit, pad_mode, multiple)
        if settings == self._settings:
            return
        if strategy is None:
            self.backend.no_truncation()
        else:
            if limit < 3:
                raise ValueError(f"max_length must be at least 3 ([CLS] x [SEP]), got {limit}")
            self.backend.enable_truncation(limit, strategy=strategy)
        if pad_mode is None:
            self.backend.no_padding()
        else:
            self.backend.enable_padding(
                pad_id=self._ids[self.pad_token],
                pad_token=self.pad_token,
                pad_type_id=0,
                length=limit if pad_mode == "max_length" else None,
                pad_to_multiple_of=multiple,
            )
        self._settings = settings

    def decode(self, ids: Sequence[int] | Any, skip_special_tokens: bool = True) -> str:
        """Text of token ids: `##` pieces joined to their word, spaces around punctuation cleaned."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        source = self.vocab_file or "<in memory>"
        return (
            f"BertTokenizer({source}, vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"model_max_length={self.model_max_length})"
        )


class JsonTokenizer(BertTokenizer):
    """The tokenizer a checkpoint of the BERT family ships as `tokenizer.json` (RoBERTa's
    byte-level BPE, XLM-RoBERTa's SentencePiece Unigram, ...), run by the `tokenizers` library
    as transformers' fast tokenizers run it: its normaliser, pre-tokeniser, model and
    post-processor (RoBERTa's `<s> A </s></s> B </s>`), with the special tokens its
    `tokenizer_config.json` names. Segment ids are kept where the model reads them
    (`type_vocab_size` above 1 in its config.json), else all 0, as transformers gives them.
    The same interface as `BertTokenizer`: encoding, truncation, padding, offsets.

    >>> tok = BertTokenizer.from_pretrained("xlm-roberta-folder")   # doctest: +SKIP
    >>> type(tok).__name__, tok.cls_token, tok.sep_token              # doctest: +SKIP
    ('JsonTokenizer', '<s>', '</s>')
    """

    def __init__(
        self, directory: str | os.PathLike, *, model_max_length: int = 512,
        token_types: bool = False,
    ) -> None:  # fmt: skip
        directory = Path(directory)
        file = directory / "tokenizer.json"
        try:
            self._json = file.read_text(encoding="utf-8")
            backend = Tokenizer.from_str(self._json)
        except Exception as err:  # unreadable, or what the Rust side refuses
            raise ValueError(
                f"{file}: not a tokenizer.json the tokenizers library reads ({err})"
            ) from None
        backend.no_truncation()
        backend.no_padding()
        self.backend, self._settings = backend, None
        shape = json.loads(self._json)
        self._kind = str(shape.get("model", {}).get("type", "unknown"))
        pre_tokenizer = json.dumps(shape.get("pre_tokenizer"))
        # how its pieces mark words (`continues_word`): Ġ, ▁, or a WordPiece's ##
        self._byte_level, self._metaspace = (
            '"ByteLevel"' in pre_tokenizer,
            '"Metaspace"' in pre_tokenizer,
        )
        self._prefix = shape.get("model", {}).get("continuing_subword_prefix") or None
        self._word_prefix = self._prefix or "##"
        self.vocab_file = file
        self._config_files = {  # (written back as they are)
            name: (directory / name).read_text(encoding="utf-8")
            for name in ("tokenizer_config.json", "special_tokens_map.json")
            if (directory / name).exists()
        }
        settings, mapped = _json_object(directory / "tokenizer_config.json", self._config_files), \
            _json_object(directory / "special_tokens_map.json", self._config_files)  # fmt: skip
        vocab = backend.get_vocab(with_added_tokens=True)
        self._ids = dict(vocab)
        self._tokens = [""] * (max(vocab.values()) + 1)
        for token, i in vocab.items():
            self._tokens[i] = token
        for role, defaults in _JSON_ROLES.items():
            named = _token_name(settings.get(role)) or _token_name(mapped.get(role))
            found = (
                named if named in self._ids else next((t for t in defaults if t in self._ids), None)
            )
            if found is None and role != "mask_token":
                raise ValueError(
                    f"{directory}: the tokenizer has no {role.replace('_', ' ')} "
                    f"(tokenizer_config.json names {named!r}; none of {list(defaults)} is in "
                    "tokenizer.json)"
                )
            setattr(self, role, found)
        self.lowercase, self.strip_accents, self.tokenize_chinese_chars = False, None, False
        self.model_max_length = int(model_max_length)
        self.token_types = token_types

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> JsonTokenizer:
        """The `tokenizer.json` of a model folder, its length from `tokenizer_config.json`
        (else the model's positions, less RoBERTa's offset), segments as its config.json has
        them."""
        directory = model_dir(path)
        directory = directory.parent if directory.is_file() else directory
        settings: dict[str, Any] = {}
        length = _json_object(directory / "tokenizer_config.json").get("model_max_length")
        if isinstance(length, int) and 0 < length < 1_000_000:
            settings["model_max_length"] = length
        model = _json_object(directory / "config.json")
        if "model_max_length" not in settings and "vocab_size" in model:
            # the positions an input may have (less RoBERTa's offset): the config's to say
            settings["model_max_length"] = BertConfig.from_dict(model, strict=False).max_length
        settings["token_types"] = int(model.get("type_vocab_size", 0) or 0) > 1
        settings.update(overrides)
        return cls(directory, **settings)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """The folder's tokenizer files as they were read, atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "tokenizer.json", self._json)
        for name, text in self._config_files.items():
            atomic_write_text(directory / name, text)

    def most_pieces(self, text: str) -> int:
        """The most pieces `text` can become: a byte-level piece holds a byte or more."""
        return len(text.encode("utf-8", "surrogatepass"))

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's pieces as a byte-level BPE reads a word after a space (RoBERTa's
        `Ġword`, what transformers' `add_prefix_space` gives words split beforehand); a
        Metaspace tokenizer (XLM-R's ▁) marks every word alone already."""
        if self._byte_level:
            return self.encode_ids([" " + word for word in words])
        return self.encode_ids(words)

    def ordinary_ids(self) -> list[int]:
        """The ids of pieces of text: not the tokenizer's added special tokens (<s>, <mask>,
        ModernBERT's [unused0] ...) nor a bracketed reserved slot."""
        added = {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        special = added | set(self.all_special_ids)
        return [i for i in super().ordinary_ids() if i not in special]

    def continues_word(self) -> list[bool]:
        """Per id, whether its piece continues the word before it: a WordPiece's prefix (##), a
        byte-level BPE piece without the space mark (Ġ, so punctuation after a word goes with
        it), a SentencePiece piece without its ▁; special tokens start their own. A model
        without word marks has every piece a word (whole-word masking is then per piece)."""
        special = set(self.all_special_ids) | set(self.backend.get_added_tokens_decoder())
        if self._kind == "WordPiece":
            flags = [t.startswith(self._word_prefix) for t in self._tokens]
        elif self._byte_level:
            flags = [not t.startswith("\u0120") for t in self._tokens]
        elif self._metaspace:
            flags = [not t.startswith("\u2581") for t in self._tokens]
        else:
            flags = [False] * len(self._tokens)
        return [flag and i not in special for i, flag in enumerate(flags)]

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def continuing_subword_prefix(self) -> str | None:
        return self._prefix

    @property
    def vocab_hash(self) -> str:
        """sha256 of the tokenizer.json: equal hashes give equal token ids."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return (
            f"JsonTokenizer({self.vocab_file}, vocab_size={self.vocab_size}, "
            f"model_max_length={self.model_max_length})"
        )


# each special token's role, and the names it goes by where the tokenizer's config names none
_JSON_ROLES = {
    "pad_token": ("<pad>", "[PAD]"),
    "unk_token": ("<unk>", "[UNK]"),
    "cls_token": ("<s>", "[CLS]"),
    "sep_token": ("</s>", "[SEP]"),
    "mask_token": ("<mask>", "[MASK]"),
}


def _ships_json(directory: Path) -> bool:
    """Whether the folder's model is of a family whose special tokens its tokenizer.json holds,
    not its vocab.txt (MPNet's: `core.family`)."""
    return family_of_folder(directory).tokenizer_json


def _json_object(path: Path, read: dict[str, str] | None = None) -> dict[str, Any]:
    """A JSON file's object ({} without the file), from its text in `read` (by file name) where
    it was read already; ValueError naming a broken one."""
    text = (read or {}).get(path.name)
    if text is None and not path.exists():
        return {}
    try:
        data = json.loads(text if text is not None else path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: invalid JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _check_texts(texts: Sequence[Any], name: str) -> None:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"{name}[{index}] has a lone surrogate {text[err.start]!r} at character "
                f"{err.start}; text must be valid Unicode"
            ) from None


def _truncation_strategy(truncation: bool | str) -> str | None:
    if truncation is False or truncation is None or truncation == "do_not_truncate":
        return None
    if truncation is True:
        return "longest_first"
    if truncation in ("longest_first", "only_first", "only_second"):
        return truncation
    raise ValueError(
        f"truncation must be True/False or 'longest_first', 'only_first', 'only_second'; "
        f"got {truncation!r}"
    )


def _padding_mode(padding: bool | str) -> str | None:
    if padding is False or padding is None or padding == "do_not_pad":
        return None
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        return "max_length"
    raise ValueError(f"padding must be True/False, 'longest' or 'max_length'; got {padding!r}")


def _to_tensor(rows: list, kind: str) -> Any:
    array = np.asarray(rows, dtype=np.int64)
    if kind == "np":
        return array
    if kind == "pt":
        import torch

        return torch.from_numpy(array)
    raise ValueError(f"return_tensors must be None, 'pt' or 'np', got {kind!r}")


def _canonical_order(token: str) -> tuple[int, str]:
    """Characters first (as Google's vocabularies), then `##` characters, words, `##` pieces."""
    body = token.removeprefix("##")
    return (int(body != token) + (2 if len(body) > 1 else 0), token)


def train_vocab(
    files: Iterable[str | os.PathLike] | None = None,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 30522,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    num_unused: int = 100,
    out_dir: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> BertTokenizer:
    """Learn a WordPiece vocabulary from text files (or an iterable of `texts`).

    The vocabulary starts like Google's: `[PAD] [UNK] [CLS] [SEP] [MASK]`, then `num_unused`
    `[unusedN]` slots (for tokens a user adds later without resizing the model), then the learnt
    characters and pieces. Text goes through the same normalisation and pre-tokenisation as at
    encoding time. With `out_dir`, the tokenizer is also saved there.
    """
    if (files is None) == (texts is None):
        raise ValueError("give exactly one of files and texts")
    reserved = list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(num_unused)]
    if vocab_size <= len(reserved):
        raise ValueError(
            f"vocab_size {vocab_size} leaves no room after {len(reserved)} reserved tokens"
        )
    if files is not None:
        paths = [str(f) for f in files]
        if not paths:
            raise ValueError("train_vocab: no input files")
        for path in paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: no such corpus file")
    else:
        texts = list(texts or [])  # read twice below

    def train(vocab_size: int, special_tokens: list[str], progress: bool) -> Tokenizer:
        model = Tokenizer(
            models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
        )
        model.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
        )
        model.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=special_tokens,
            limit_alphabet=limit_alphabet,
            continuing_subword_prefix="##",
            show_progress=progress,
        )
        if files is not None:
            model.train(paths, trainer)
        else:
            model.train_from_iterator(texts, trainer)
        return model

    # The trainer numbers the `##` characters in hash-map order, and breaks ties between equally
    # frequent merges by those numbers, so the same corpus could give another vocabulary on the
    # next run (huggingface/tokenizers#1794). A first pass without merges finds the `##`
    # characters; registering them up front, sorted, makes every id and every merge reproducible.
    alphabet = train(len(reserved) + 1, reserved, False).get_vocab()
    continuations = sorted(t for t in alphabet if t.startswith("##") and len(t) == 3)
    model = train(vocab_size, reserved + continuations, show_progress)
    reserved_set = set(reserved)
    learnt = [t for t in model.get_vocab() if t not in reserved_set]
    if not learnt:
        raise ValueError("train_vocab: the corpus is empty (no word was learnt)")
    # The trainer orders tokens of equal frequency differently from run to run (Rust hash maps);
    # a canonical order makes the same corpus give the same ids, and the same vocab_hash.
    tokens = reserved + sorted(learnt, key=_canonical_order)
    tokenizer = BertTokenizer(vocab=tokens, lowercase=lowercase)
    if out_dir is not None:
        tokenizer.save_pretrained(out_dir)
        tokenizer.vocab_file = Path(out_dir) / "vocab.txt"
    return tokenizer


def _as_batch(
    text: TextInput, text_pair: str | Sequence[str | None] | None
) -> tuple[list[str], list[str | None] | None]:
    """One text (or pair) or a batch as lists; a pair's two sides must both be one or both be
    batches of one length."""
    single = isinstance(text, str)
    texts = [text] if single else list(text)
    if text_pair is None:
        return texts, None  # type: ignore[return-value]
    pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
    if single != isinstance(text_pair, str) or len(pairs) != len(texts):
        raise ValueError(
            f"text and text_pair must both be strings or equal-length lists, got "
            f"{len(texts)} and {len(pairs)} items"
        )
    return texts, pairs  # type: ignore[return-value]


def _result(
    encodings: list,
    single: bool,
    return_tensors: str | None,
    return_offsets: bool,
    return_word_ids: bool,
    token_types: bool = True,
) -> dict[str, Any]:
    """What `BertTokenizer.__call__` returns for the `tokenizers` library's encodings (segment
    ids all 0 without `token_types`)."""
    result: dict[str, Any] = {
        "input_ids": [e.ids for e in encodings],
        "token_type_ids": [e.type_ids if token_types else [0] * len(e.ids) for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
    }
    if return_offsets:
        result["offset_mapping"] = [e.offsets for e in encodings]
    if return_word_ids:
        result["word_ids"] = [
            [-1 if w is None else w for w in e.word_ids] if return_tensors else e.word_ids
            for e in encodings
        ]
    if return_tensors is not None:
        lengths = {len(ids) for ids in result["input_ids"]}
        if len(lengths) > 1:
            raise ValueError(
                f"sequences have different lengths {sorted(lengths)}; pass padding=True to "
                "return tensors"
            )
        return {k: _to_tensor(v, return_tensors) for k, v in result.items()}
    if single:
        return {k: v[0] for k, v in result.items()}
    return result
