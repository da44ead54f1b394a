"""What the server computes, free of any web framework: one checkpoint loaded once, its
endpoints, the checks on a request body, and the batch functions the batcher calls.

    model = ServedModel("runs/sst2")
    items = model.parse("predict", {"inputs": ["a fine film", "a dull one"]})
    model.run("predict", items)   # [{"label": "positive", "score": 0.97, ...}, ...]

A fine-tuned checkpoint (one with a task record) answers `predict` with its task's answers (labels
by name, entities with character offsets, answer spans, choices) and `embed` with its encoder;
a plain encoder (e.g. all-MiniLM-L6-v2) answers `embed`; one with a masked-LM head (bertkit
pre-training's output) `fill-mask` and `embed`. With `backend="onnx"` the model runs on ONNX
Runtime: an export folder is used as it is, any other checkpoint is exported (int8 with
`quantize="int8"`) into a temporary folder removed by `close()`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertkit._device import default_device
from bertkit._io import TASK_FILE
from bertkit.core.embedding import POOLINGS, declared_length, pool, read_pooling
from bertkit.errors import InputError
from bertkit.precision import (
    cast_for_inference,
    compile_for_inference,
    inference_compile,
    resolve_precision,
)
from bertkit.serve.clients import (
    RERANK_FIELDS,
    HfStyle,
    Ids,
    base64_floats,
    cohere_results,
    hf_fill_mask,
    hf_parameters,
    hf_prediction,
)
from bertkit.serve.config import ServeConfig
from bertkit.settings import BACKENDS, QUANTIZATIONS, replaced

if TYPE_CHECKING:
    from bertkit.inference.predict import Predictor

log = logging.getLogger(__name__)


class _Counting:
    """A model that reports each call (ONNX Runtime sessions have no forward hooks)."""

    def __init__(self, model: Any, count: Callable[[], None]) -> None:
        self._model, self._count = model, count

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class ServedModel:
    def __init__(
        self,
        path: str | Path,
        config: ServeConfig | None = None,
        *,
        on_forward: Callable[[], None] = lambda: None,
        **settings: Any,
    ) -> None:
        """The model `path` (a folder or a Hub name) served as `config` (or ServeConfig's fields
        by name: `backend`, `quantize`, `device`, `max_batch_size`, `precision`, `compile`,
        `served_model_name`) says. `compile="on"`: what /predict and /rerank run (a checkpoint
        with a task), or the encoder /embed runs (one without), compiled for inference
        (`precision.compile_for_inference`); fill-mask runs as it is. `served_model_name`: the
        model's name in /v1/models and the OpenAI-style answers (default: a Hub name as given,
        else the folder's name). `on_forward` is called at every model call."""
        from bertkit.core.hub import model_dir

        self.config = config = replaced(config or ServeConfig(), **settings)
        backend, quantize = config.backend, config.quantize
        given = str(path)
        path = model_dir(path)  # a folder, or a Hub name
        self.name = config.served_model_name or (
            given if Path(given) != path else Path(given).resolve().name
        )
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        if quantize not in (None, *QUANTIZATIONS):
            raise ValueError(f"quantize must be {', '.join(QUANTIZATIONS)}, not {quantize!r}")
        if quantize and backend != "onnx":
            raise ValueError("int8 serving runs on ONNX Runtime: add --backend onnx")
        compiled = inference_compile(config.compile, backend)
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such model folder")
        self.source, self.backend, self.quantize = path, backend, quantize
        self._exported: Path | None = None
        if backend == "onnx":
            path = self._onnx_folder(path, quantize)
        self.path = path
        # /embed's default: what a sentence-transformers folder declares, else the mean
        self.pooling = read_pooling(self.source) or "mean"
        self.device = default_device(config.device)
        self.precision = resolve_precision(config.precision, self.device, backend=backend)
        self.max_batch_size = config.max_batch_size
        self.predictor: Predictor | None = None
        self.fill: Any = None
        self._encoder: Any = None  # a torch BertModel, or an ONNX encoder export
        self._count = on_forward
        self.task_name: str | None = None
        if (path / TASK_FILE).exists():
            self._open_task_model(path, on_forward)
        else:
            self._open_encoder(path, compiled)

    def _onnx_folder(self, path: Path, quantize: str | None) -> Path:
        """The folder of the ONNX model to serve: `path`'s own export (of the asked
        quantisation), else one exported now into a folder of our own."""
        from bertkit.inference.export import export_onnx
        from bertkit.inference.loader import ONNX_FILE, ONNX_INFO

        if (path / ONNX_FILE).exists():
            info = json.loads((path / ONNX_INFO).read_text()) if (path / ONNX_INFO).exists() else {}
            if quantize and info.get("quantize") != quantize:
                raise ValueError(
                    f"{path / ONNX_FILE} is not {quantize} (it was exported with quantize="
                    f"{info.get('quantize')}); serve the checkpoint it came from instead"
                )
            return path
        self._exported = Path(tempfile.mkdtemp(prefix="bertkit-serve-"))
        log.warning("exporting %s to ONNX%s", path, f" ({quantize})" if quantize else "")
        export_onnx(path, self._exported, quantize=quantize, overwrite=True)
        return self._exported

    def _open_task_model(self, path: Path, on_forward: Callable[[], None]) -> None:
        """A fine-tuned folder: its Predictor answers /predict (and /rerank); its encoder
        /embed."""
        from bertkit.inference.predict import Predictor

        config = self.config
        self.predictor = Predictor(path, device=str(self.device), batch_size=config.max_batch_size,
                                   backend=config.backend, precision=config.precision,
                                   compile=config.compile)  # fmt: skip
        self.tokenizer = self.predictor.tokenizer
        self.max_seq_length = self.predictor.max_seq_length
        self.task_name = self.predictor.task.name
        if config.backend == "torch":
            self._encoder = getattr(self.predictor.model, "bert", None)
        # counted calls, whichever backend (an ONNX session has no forward hooks)
        self.predictor.model = _Counting(self.predictor.model, on_forward)  # type: ignore[assignment]

    def _open_encoder(self, path: Path, compiled: bool) -> None:
        """A folder without a task: its encoder answers /embed (and fill-mask with an MLM
        head)."""
        from bertkit.core.tokenizer import BertTokenizer
        from bertkit.inference.loader import OnnxModel

        self.tokenizer = BertTokenizer.from_pretrained(path)
        if self.backend == "onnx":
            session = OnnxModel(path)
            if "last_hidden_state" not in session.names:
                raise ValueError(
                    f"{path}: an ONNX export of {session.info.get('head')} without a task "
                    f"(no {TASK_FILE}): nothing to serve"
                )
            self._encoder = session
        else:
            self._encoder = self._load_torch_encoder(path)
            cast_for_inference(self.fill.model if self.fill else self._encoder, self.precision)
            if compiled:
                self._encoder = compile_for_inference(self._encoder)
        # a sentence-transformers folder's own length (all-MiniLM-L6-v2: 256), as
        # SentenceTransformer(path) cuts; else what the tokenizer and positions allow
        longest = min(self.tokenizer.model_max_length, self._max_positions())
        self.max_seq_length = min(declared_length(self.source) or longest, longest)

    def _load_torch_encoder(self, path: Path) -> torch.nn.Module:
        from bertkit.inference.fill_mask import FillMask, has_mlm_head
        from bertkit.inference.loader import load

        if not has_mlm_head(path):  # an encoder alone
            return load(path, head="BertModel", device=self.device).model
        self.fill = FillMask(path, device=str(self.device), batch_size=self.max_batch_size)
        self.fill.model.register_forward_pre_hook(lambda *_: self._count())
        return self.fill.model.bert

    def _max_positions(self) -> int:
        if isinstance(self._encoder, torch.nn.Module):
            config: Any = self._encoder.config
            return int(config.max_position_embeddings)
        config = json.loads((self.path / "config.json").read_text())
        return int(config.get("max_position_embeddings", 512))

    # ------------------------------------------------------------------ what it serves
    @property
    def endpoints(self) -> dict[str, bool]:
        return {
            "predict": self.predictor is not None,
            "embed": self._encoder is not None,
            "v1/embeddings": self._encoder is not None,
            "rerank": self.rerank_label is not None,
            "v1/rerank": self.rerank_label is not None,
            "similarity": self._encoder is not None,
            "fill-mask": self.fill is not None,
        }

    @property
    def rerank_label(self) -> str | None:
        """What /rerank scores (`Predictor.rerank_label`); None: not a cross-encoder."""
        return self.predictor.rerank_label if self.predictor is not None else None

    def missing(self, endpoint: str) -> str:
        """Why this model does not answer `endpoint`."""
        if endpoint == "predict":
            return (
                f"{self.source} is not a fine-tuned model (no {TASK_FILE}): it answers "
                + ", ".join(f"/{e}" for e, ok in self.endpoints.items() if ok)
            )
        if endpoint in ("rerank", "v1/rerank"):
            return (
                f"{self.source} is not a cross-encoder: /rerank takes a model fine-tuned on text "
                "pairs (a pair classifier or regressor)"
            )
        if endpoint in ("embed", "v1/embeddings", "similarity"):
            return f"the ONNX export of {self.source} has no hidden states: serve it with --backend torch"
        if self.backend == "onnx":
            return "fill-mask runs on the torch backend only"
        return f"{self.source} has no masked-LM head (a pre-trained BERT saved with it has)"

    def info(self) -> dict[str, Any]:
        labels = self.predictor.labels if self.predictor is not None else None
        return {
            "model": str(self.source),
            "name": self.name,
            "task": self.task_name,
            "labels": labels,
            "backend": self.backend,
            "quantize": self.quantize,
            "precision": self.precision.as_dict(),
            "device": str(self.device),
            "max_seq_length": self.max_seq_length,
            "endpoints": [f"/{e}" for e, ok in self.endpoints.items() if ok],
            "pooling": self.pooling,
            "rerank_label": self.rerank_label,
        }

    def close(self) -> None:
        if self._exported is not None:
            shutil.rmtree(self._exported, ignore_errors=True)
            self._exported = None

    # ------------------------------------------------------------------ requests
    def parse(self, endpoint: str, body: Any, limits: ServeConfig | None = None) -> list[Any]:
        """The inputs of a request body, checked against `limits` (a ServeConfig's max_inputs
        and max_chars; default its defaults): InputError (413 or 422) says what is wrong. Each
        input is what `run(endpoint, ...)` takes."""
        limits = limits or ServeConfig()
        if not isinstance(body, dict):
            raise InputError(f"the body must be a JSON object, not {_kind(body)}")
        if endpoint == "v1/embeddings":
            return self._parse_openai(body, limits)
        if endpoint == "rerank":
            return self._parse_rerank(body, limits)
        if endpoint == "v1/rerank":
            return self._parse_cohere(body, limits)
        if endpoint == "similarity":
            return self._parse_similarity(body, limits)
        allowed = {"inputs"} | {"embed": {"pooling", "normalize", "truncate"},
                                "fill-mask": {"top"}}.get(endpoint, set())  # fmt: skip
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise InputError(f"unknown field {unknown[0]!r}; {endpoint} takes {sorted(allowed)}")
        if "inputs" not in body:
            raise InputError('no "inputs": send {"inputs": "a text"} or {"inputs": [...]}')
        inputs = body["inputs"]
        if isinstance(inputs, (str, dict)):
            inputs = [inputs]
        if not isinstance(inputs, list):
            raise InputError(f'"inputs" must be a text, a list or an object, not {_kind(inputs)}')
        if not inputs:
            raise InputError('"inputs" is empty')
        if len(inputs) > limits.max_inputs:
            raise InputError(
                f"{len(inputs)} inputs in one request; the server takes at most "
                f"{limits.max_inputs} (--max-inputs)",
                413,
            )
        for n, item in enumerate(inputs):
            longest = _longest_text(item)
            if longest > limits.max_chars:
                raise InputError(
                    f"inputs[{n}]: a text of {longest:,} characters; the server takes at most "
                    f"{limits.max_chars:,} (--max-chars)",
                    413,
                )
        if endpoint == "predict":
            return [self._predict_item(item, n) for n, item in enumerate(inputs)]
        texts = [_text_or_pair(item, n) for n, item in enumerate(inputs)]
        if endpoint == "embed":
            pooling = body.get("pooling", self.pooling)
            if pooling not in POOLINGS:
                raise InputError(f'"pooling" must be one of {list(POOLINGS)}, not {pooling!r}')
            normalize = body.get("normalize", True)
            if not isinstance(normalize, bool):
                raise InputError(f'"normalize" must be true or false, not {normalize!r}')
            self._fits(texts, _flag(body, "truncate"), "inputs")
            return [(text, pooling, normalize) for text in texts]
        top = body.get("top", 5)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 100:
            raise InputError(f'"top" must be a whole number from 1 to 100, not {top!r}')
        from bertkit.core.tokenizer import MASK

        for n, text in enumerate(texts):
            if not any(MASK in t for t in ((text,) if isinstance(text, str) else text)):
                raise InputError(f"inputs[{n}]: no {MASK} to fill")
        return [(text, top) for text in texts]

    def _parse_openai(self, body: dict, limits: ServeConfig) -> list[Any]:
        """OpenAI's embeddings request: {"input": a text, texts, the model's token ids or lists
        of them, "model"?, "dimensions"?, "encoding_format"?: "float" or "base64", "user"?,
        "truncate"?}. Token ids are the model's own ([CLS] and [SEP] included, as its
        tokenizer writes them) and run as they are."""
        allowed = {"input", "model", "dimensions", "encoding_format", "user", "truncate"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise InputError(
                f"unknown field {unknown[0]!r}; /v1/embeddings takes {sorted(allowed)}"
            )
        texts = self._openai_input(body.get("input"))
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InputError(f'"encoding_format" must be "float" or "base64", not {encoding!r}')
        dims = body.get("dimensions")
        width = self.hidden_size
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int)
                                 or not 1 <= dims <= width):  # fmt: skip
            raise InputError(f'"dimensions" must be a whole number from 1 to {width}, not {dims!r}')
        _check_limits([t for t in texts if isinstance(t, str)], limits, "input", len(texts))
        self._fits(texts, _flag(body, "truncate"), "input")
        return [(text, self.pooling, True, dims, encoding) for text in texts]

    def _openai_input(self, given: Any) -> list[str | Ids]:
        """OpenAI's "input": a text, a list of texts, one list of token ids, or lists of them."""
        if isinstance(given, str):
            return [given]
        if isinstance(given, list) and given and all(_is_id(i) for i in given):
            given = [given]  # one text's ids
        if not isinstance(given, list) or not given:
            raise InputError('"input" must be a text, a non-empty list of texts, or token ids')
        texts: list[str | Ids] = []
        vocab = self.tokenizer.vocab_size
        for n, item in enumerate(given):
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list) and item and all(_is_id(i) for i in item):
                wrong = next((i for i in item if not 0 <= i < vocab), None)
                if wrong is not None:
                    raise InputError(f"input[{n}]: token id {wrong} is not in the model's "
                                     f"vocabulary (0 to {vocab - 1})")  # fmt: skip
                texts.append(Ids(item))
            else:
                raise InputError(f"input[{n}]: a text or a non-empty list of token ids expected, "
                                 f"not {_kind(item)}")  # fmt: skip
        return texts

    def _parse_cohere(self, body: dict, limits: ServeConfig) -> list[Any]:
        """Cohere's and Jina's rerank request: {"query", "documents" (texts, or objects with a
        "text"), "top_n"?, "return_documents"?, "model"?, "truncate"?}."""
        unknown = sorted(set(body) - set(RERANK_FIELDS))
        if unknown:
            raise InputError(
                f"unknown field {unknown[0]!r}; /v1/rerank takes {list(RERANK_FIELDS)}"
            )
        documents = body.get("documents")
        if isinstance(documents, list):  # texts, or objects with a "text"
            documents = [d.get("text") if isinstance(d, dict) else d for d in documents]
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):  # fmt: skip
            raise InputError(f'"top_n" must be a whole number from 1, not {top_n!r}')
        pairs = self._query_pairs(body, documents, limits, "documents")
        return [(pair, _flag(body, "return_documents"), top_n) for pair in pairs]

    def _parse_similarity(self, body: dict, limits: ServeConfig) -> list[Any]:
        """text-embeddings-inference's (and Hugging Face's sentence-similarity) request:
        {"inputs": {"source_sentence", "sentences"}, "truncate"?}: the source embedded first,
        then each sentence."""
        hf_parameters(body, ())
        unknown = sorted(set(body) - {"inputs", "parameters", "truncate"})
        if unknown:
            raise InputError(f"unknown field {unknown[0]!r}; /similarity takes "
                             '["inputs", "parameters", "truncate"]')  # fmt: skip
        inputs = body.get("inputs")
        if not isinstance(inputs, dict) or set(inputs) != {"source_sentence", "sentences"}:
            raise InputError('"inputs" must be {"source_sentence": a text, "sentences": texts}')
        source, sentences = inputs["source_sentence"], inputs["sentences"]
        if not isinstance(source, str) or not isinstance(sentences, list) or not sentences:
            raise InputError('"source_sentence" must be a text, "sentences" a non-empty list')
        if not all(isinstance(t, str) for t in sentences):
            raise InputError('"sentences" must hold texts')
        texts = [source, *sentences]
        _check_limits(texts, limits, "sentences", count=len(sentences))
        self._fits(texts, _flag(body, "truncate"), "sentences")
        return [(text, self.pooling, True) for text in texts]

    def route(self, body: Any) -> tuple[str, Any, HfStyle]:
        """What `POST /` (and `/invocations`) runs for `body`: the endpoint, the body as that
        endpoint takes it, and how to answer in Hugging Face's shape (`clients`)."""
        if not isinstance(body, dict):
            raise InputError(f"the body must be a JSON object, not {_kind(body)}")
        inputs = body.get("inputs")
        single = isinstance(inputs, str)
        if "query" in body and "texts" in body:
            return "rerank", body, HfStyle(single)
        if isinstance(inputs, dict) and "source_sentence" in inputs:
            return "similarity", body, HfStyle(single)
        if self.predictor is not None:
            parameters = hf_parameters(body, ("top_k",))
            own = {k: v for k, v in body.items() if k != "parameters"}
            return "predict", own, HfStyle(single, parameters.get("top_k"))
        if self.fill is not None:
            parameters = hf_parameters(body, ("top_k",))
            own = {k: v for k, v in body.items() if k != "parameters"}
            return "fill-mask", own | {"top": parameters.get("top_k", 5)}, HfStyle(single)
        # feature extraction: its parameters at the top level; the defaults are /embed's
        own = {k: v for k, v in body.items() if k != "parameters"}
        hf_parameters(body, ())
        if own.pop("truncation_direction", "right") != "right":
            raise InputError('"truncation_direction": this server cuts on the right only')
        return "embed", own, HfStyle(single)

    def _parse_rerank(self, body: dict, limits: ServeConfig) -> list[Any]:
        """text-embeddings-inference's rerank request: {"query", "texts", "return_text"?,
        "truncate"?}."""
        allowed = {"query", "texts", "return_text", "truncate"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise InputError(f"unknown field {unknown[0]!r}; /rerank takes {sorted(allowed)}")
        pairs = self._query_pairs(body, body.get("texts"), limits, "texts")
        return [(pair, _flag(body, "return_text")) for pair in pairs]

    def _query_pairs(self, body: dict, texts: Any, limits: ServeConfig, field: str) -> list[Any]:
        """(query, text) for each of `texts` (the body's `field`), checked."""
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InputError('"query" must be a non-empty text')
        if not isinstance(texts, list) or not texts:
            raise InputError(f'"{field}" must be a non-empty list of texts')
        if not all(isinstance(t, str) and t.strip() for t in texts):
            n = next(i for i, t in enumerate(texts) if not (isinstance(t, str) and t.strip()))
            raise InputError(f"{field}[{n}]: a non-empty text expected")
        _check_limits([query, *texts], limits, field, count=len(texts))
        pairs = [(query, text) for text in texts]
        self._fits(pairs, _flag(body, "truncate"), field)
        return pairs

    def _fits(self, texts: list[Any], truncate: bool, field: str) -> None:
        """Over the model's length (pieces with [CLS] and [SEP]) a 413 naming the text, unless
        `truncate` (then cut when run, as text-embeddings-inference's truncate). Only texts
        whose characters could reach the length are tokenised (a piece holds a character or
        more), so a request's texts are tokenised once, when run."""
        if truncate:
            return
        room = self.max_seq_length
        for n, text in enumerate(texts):
            if isinstance(text, Ids):
                count = len(text)
            else:
                parts = (text,) if isinstance(text, str) else tuple(text)
                if sum(len(p) for p in parts) + len(parts) + 1 <= room:
                    continue
                ids = self.tokenizer.encode_ids(list(parts))
                count = len(parts) + 1 + sum(len(i) for i in ids)
            if count > room:
                raise InputError(
                    f"{field}[{n}]: {count} pieces; the model reads {room}: shorten it, or send "
                    '"truncate": true to cut it',
                    413,
                )

    @property
    def hidden_size(self) -> int:
        if isinstance(self._encoder, torch.nn.Module):
            config: Any = self._encoder.config
            return int(config.hidden_size)
        return int(json.loads((self.path / "config.json").read_text())["hidden_size"])

    def shape(self, endpoint: str, items: list[Any], results: list[Any],
              style: HfStyle | None = None) -> Any:  # fmt: skip
        """A request's results as its route answers them: /v1/embeddings in OpenAI's shape,
        /rerank best first with each text's index (text-embeddings-inference's), /v1/rerank
        in Cohere's, /similarity each sentence's cosine with the source; with `style` (`POST
        /`), /predict and /fill-mask as Hugging Face's `InferenceClient` parses them."""
        if endpoint == "v1/embeddings":
            data = [{"object": "embedding", "index": i,
                     "embedding": base64_floats(vector) if item[4] == "base64" else vector}
                    for i, ((vector, _), item) in enumerate(zip(results, items, strict=True))]  # fmt: skip
            tokens = sum(pieces for _, pieces in results)
            return {"object": "list", "data": data, "model": self.name,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
        if endpoint == "v1/rerank":
            from bertkit.inference.predict import ranked

            (_, top_n), documents = items[0][1:], [text for (_, text), _, _ in items]
            results = cohere_results(ranked(results), documents, top_n, items[0][1])
            return {"model": self.name, "results": results}
        if endpoint == "similarity":  # unit vectors: the cosine is the dot product
            source = results[0]
            source = source.astype(np.float64)
            return [float(source @ v.astype(np.float64)) for v in results[1:]]
        if style is not None and endpoint == "predict":
            labels = self.predictor.labels if self.predictor is not None else None
            answers = [hf_prediction(r, labels, style.top_k) for r in results]
            tagged = any("words" in r for r in results)
            return answers[0] if style.single and tagged else answers
        if style is not None and endpoint == "fill-mask":
            from bertkit.core.tokenizer import MASK

            answers = [
                hf_fill_mask(text, r, MASK) for (text, _), r in zip(items, results, strict=True)
            ]
            return answers[0] if style.single else answers
        if endpoint == "rerank":
            from bertkit.inference.predict import ranked

            answer = ranked(results)
            for entry in answer:
                (_, text), return_text = items[entry["index"]]
                if return_text:
                    entry["text"] = text
            return answer
        return results

    def _predict_item(self, item: Any, n: int) -> Any:
        from bertkit.inference.predict import _plain

        assert self.predictor is not None
        try:
            self.predictor.task.example_of(_plain(item), n)
        except (ValueError, KeyError, TypeError) as err:
            message = str(err).removeprefix(f"item {n}: ")
            raise InputError(f"inputs[{n}]: {message}") from None
        return item

    # ------------------------------------------------------------------ batches
    def run(self, endpoint: str, items: list[Any]) -> list[Any]:
        """One result per input (inputs as `parse` returns them), in one batch."""
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            return self._run(endpoint, items)

    def _run(self, endpoint: str, items: list[Any]) -> list[Any]:
        if endpoint == "predict":
            assert self.predictor is not None
            return self.predictor(items)
        if endpoint in ("embed", "similarity"):
            return self._embed(items)[0]
        if endpoint == "v1/embeddings":  # (vector, its pieces: the usage)
            vectors, pieces = self._embed([item[:3] for item in items])
            return [(_shortened(v, item[3]), n)
                    for v, item, n in zip(vectors, items, pieces, strict=True)]  # fmt: skip
        if endpoint in ("rerank", "v1/rerank"):
            assert self.predictor is not None
            return self.predictor.relevance([item[0] for item in items])
        return self._fill_mask(items)

    @torch.inference_mode()
    def _embed(self, items: list[tuple[Any, str, bool]]) -> tuple[list[np.ndarray], list[int]]:
        """Each item's vector, and its pieces ([CLS] and [SEP] with)."""
        encoded = self._encode([text for text, _, _ in items])
        mask = encoded["attention_mask"]
        self._count()
        if isinstance(self._encoder, torch.nn.Module):
            encoder: Any = self._encoder
            # where the real tokens are, worked out here: the forward need not count them
            layouts = encoder.layouts(
                mask, tuple(mask.shape), self.device, unpad=True, causal=encoder.config.is_decoder
            ).to(self.device)
            hidden = (
                encoder(
                    encoded["input_ids"].to(self.device),
                    encoded["token_type_ids"].to(self.device),
                    mask.to(self.device),
                    unpad=True,
                    layouts=layouts,
                )
                .last_hidden_state.float()
                .cpu()
            )
        else:
            hidden = self._encoder(
                input_ids=encoded["input_ids"],
                token_type_ids=encoded["token_type_ids"],
                attention_mask=mask,
            ).last_hidden_state.float()
        pooled = {p: pool(hidden, mask, p) for p in {p for _, p, _ in items}}
        vectors = []
        for row, (_, pooling, normalize) in enumerate(items):
            vector = pooled[pooling][row]
            if normalize:
                vector = vector / vector.norm().clamp(min=1e-12)
            vectors.append(vector.numpy())  # float32: the response writes it as it is
        return vectors, mask.sum(1).tolist()

    def _encode(self, texts: list[Any]) -> dict[str, torch.Tensor]:
        """Texts, pairs and token ids (`Ids`, run as they are) as a padded batch, each cut to
        the model's length."""
        if not any(isinstance(t, Ids) for t in texts):
            firsts = [t if isinstance(t, str) else t[0] for t in texts]
            pairs = [None if isinstance(t, str) else t[1] for t in texts]
            return self.tokenizer(
                firsts,
                pairs if any(p is not None for p in pairs) else None,
                max_length=self.max_seq_length,
                truncation=True,
                padding=True,
                return_tensors="pt",
            )
        words = [t for t in texts if not isinstance(t, Ids)]
        encoded = self.tokenizer(
            [t if isinstance(t, str) else t[0] for t in words],
            [None if isinstance(t, str) else t[1] for t in words],
            max_length=self.max_seq_length,
            truncation=True,
        ) if words else {"input_ids": [], "token_type_ids": []}  # fmt: skip
        tokenized = iter(zip(encoded["input_ids"], encoded["token_type_ids"], strict=True))
        rows = [(list(t[: self.max_seq_length]), [0] * len(t[: self.max_seq_length]))
                if isinstance(t, Ids) else next(tokenized) for t in texts]  # fmt: skip
        width = max(len(ids) for ids, _ in rows)
        pad = self.tokenizer.pad_token_id
        return {
            "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows]),
            "token_type_ids": torch.tensor([seg + [0] * (width - len(seg)) for _, seg in rows]),
            "attention_mask": torch.tensor(
                [[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]
            ),  # fmt: skip
        }

    def _fill_mask(self, items: list[tuple[Any, int]]) -> list[list[dict[str, Any]]]:
        top = max(t for _, t in items)
        texts = [tuple(t) if isinstance(t, list) else t for t, _ in items]
        filled = self.fill(texts, top=top)
        return [
            [{key: value[:want] if isinstance(value, list) else value for key, value in m.items()}
             for m in masks]
            for masks, (_, want) in zip(filled, items, strict=True)
        ]  # fmt: skip

    def warm(self) -> None:
        """Each endpoint once on a short input, on a short and a long one, then on a full
        batch of the longest inputs: lazy set-up done, each kind of call a compiled model
        compiles for (a batch of one, of more) compiled, and the largest activations allocated
        at start-up: a server that will not fit fails then, not under its first heavy load."""
        from bertkit.core.tokenizer import MASK

        # a word that is one piece of this vocabulary, so n words are n pieces
        word = next((t for t in self.tokenizer.vocab if t.isalpha() and t.islower()), "a")
        short, long = "Warm up.", " ".join([word] * self.max_seq_length)
        for endpoint, ok in self.endpoints.items():
            if not ok or endpoint not in ("predict", "embed", "fill-mask"):  # the others call these
                continue
            if endpoint == "predict":
                assert self.predictor is not None
                small, large = self._predict_example(short), self._predict_example(long)
            elif endpoint == "embed":
                small, large = (short, "mean", True), (long, "mean", True)
            else:
                filler = " ".join([word] * (self.max_seq_length - 3))
                small, large = (f"Warm {MASK}.", 1), (f"{MASK} {filler}", 1)
            for batch in ([small], [small, large], [large] * self.max_batch_size):
                self.run(endpoint, batch)

    def _predict_example(self, text: str) -> Any:
        """An input this model's task takes, made of `text`."""
        assert self.predictor is not None
        for item in (text, [text, text], {"question": "What?", "context": text},
                     {"context": text, "choices": ["yes", "no"]}):  # fmt: skip
            try:
                self.predictor.task.example_of(item, 0)
            except (ValueError, KeyError, TypeError):
                continue
            return item
        raise ValueError(f"{self.source}: found no input its task {self.task_name} takes")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a text", bool: "true/false"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else "null"
    )


def _longest_text(item: Any) -> int:
    if isinstance(item, str):
        return len(item)
    if isinstance(item, (list, tuple)):
        return max((_longest_text(x) for x in item), default=0)
    if isinstance(item, dict):
        return max((_longest_text(x) for x in item.values()), default=0)
    return 0


def _text_or_pair(item: Any, n: int) -> str | tuple[str, str]:
    if isinstance(item, str):
        return item
    if isinstance(item, list) and len(item) == 2 and all(isinstance(t, str) for t in item):
        return (item[0], item[1])
    raise InputError(f"inputs[{n}]: a text or a pair of texts [a, b], not {_kind(item)}")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InputError(f'"{name}" must be true or false, not {value!r}')
    return value


def _check_limits(
    texts: list[str], limits: ServeConfig, field: str, count: int | None = None
) -> None:
    count = len(texts) if count is None else count
    if count > limits.max_inputs:
        raise InputError(
            f"{count} {field} in one request; the server takes at most {limits.max_inputs} "
            "(--max-inputs)",
            413,
        )
    for n, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise InputError(
                f"{field}[{n}]: a text of {len(text):,} characters; the server takes at most "
                f"{limits.max_chars:,} (--max-chars)",
                413,
            )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shortened(vector: np.ndarray, dims: int | None) -> np.ndarray:
    """The first `dims` coordinates, at unit length again (Matryoshka-style); all without."""
    if dims is None or dims >= len(vector):
        return vector
    part = vector[:dims]
    return part / (float(np.linalg.norm(part)) or 1.0)
