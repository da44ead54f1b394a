"""What the server computes, free of any web framework: one checkpoint loaded once, its
endpoints, the checks on a request body, and the batch functions the batcher calls.

    model = ServedModel("runs/sst2")
    items = model.parse("predict", {"inputs": ["a fine film", "a dull one"]})
    model.run("predict", items)   # [{"label": "positive", "score": 0.97, ...}, ...]

What each route parses, runs and answers is its handler's (`routes.ROUTES`); the model is
opened by the one loader (`inference.loader.load`, through `Predictor` for a fine-tuned folder).

A fine-tuned checkpoint (one with a task record) answers `predict` with its task's answers (labels
by name, entities with character offsets, answer spans, choices) and `embed` with its encoder;
a plain encoder (e.g. all-MiniLM-L6-v2) answers `embed`; one with a masked-LM head (bertkit
pre-training's output) `fill-mask` and `embed`. With `backend="onnx"` the model runs on ONNX
Runtime: an export folder is used as it is, any other checkpoint is exported (int8 with
`quantize="int8"`) into a temporary folder removed by `close()`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertkit._device import default_device
from bertkit._io import TASK_FILE
from bertkit.core.embedding import read_pooling, shortened
from bertkit.errors import InputError
from bertkit.inference.texts import Ids
from bertkit.precision import inference_compile, resolve_precision
from bertkit.serve.clients import HfStyle, hf_parameters
from bertkit.serve.config import ServeConfig
from bertkit.serve.routes import ROUTES, Text, kind_of
from bertkit.settings import BACKENDS, QUANTIZATIONS, replaced
from bertkit.tasks.saved import has_task

if TYPE_CHECKING:
    from bertkit.inference.embedder import Embedder
    from bertkit.inference.fill_mask import FillMask
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
        (`precision.compile_for_inference`); fill-mask runs as it is.
        `served_model_name`: the model's name in /v1/models and the OpenAI-style answers
        (default: a Hub name as given, else the folder's name). `on_forward` is called at
        every model call."""
        from bertkit.core.hub import model_dir

        self.config = config = replaced(config or ServeConfig(), **settings)
        backend, quantize = config.runtime.backend, config.quantize
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
        inference_compile(config.runtime.compile, backend)  # refused before anything loads
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such model folder")
        self.source, self.backend, self.quantize = path, backend, quantize
        self._exported: Path | None = None
        if backend == "onnx":  # its own export, else one made now (removed by `close`)
            from bertkit.inference.export import onnx_folder

            path, self._exported = onnx_folder(path, quantize)
        self.path = path
        # /embed's default: what a sentence-transformers folder declares, else the mean
        self.pooling = read_pooling(self.source) or "mean"
        self.device = default_device(config.runtime.device)
        self.precision = resolve_precision(config.runtime.precision, self.device, backend=backend)
        self.max_batch_size = config.max_batch_size
        self.predictor: Predictor | None = None
        self.fill: FillMask | None = None
        self.embedder: Embedder | None = None  # what /embed runs: the encoder, on the one path
        self._count = on_forward
        self.task_name: str | None = None
        if has_task(self.source):  # a task record, or a saved classifier, tagger or reader
            self._open_task_model(path, on_forward)
        else:
            self._open_encoder(path)

    def _open_task_model(self, path: Path, on_forward: Callable[[], None]) -> None:
        """A fine-tuned folder: its Predictor answers /predict (and /rerank); its encoder
        /embed."""
        from bertkit.inference.embedder import Embedder
        from bertkit.inference.predict import Predictor

        config = self.config
        runtime = vars(config.runtime) | {"device": str(self.device)}  # (resolved once, above)
        self.predictor = Predictor(path, batch_size=config.max_batch_size, **runtime,
                                   **vars(config.heads))  # fmt: skip
        self.tokenizer = self.predictor.tokenizer
        self.max_seq_length = self.predictor.max_seq_length
        self.task_name = self.predictor.task.name
        encoder = getattr(self.predictor.model, "bert", None)
        if config.backend == "torch" and encoder is not None:
            self.embedder = Embedder.of(self.predictor.loaded, encoder,
                                        batch_size=config.max_batch_size,
                                        max_seq_length=self.max_seq_length)  # fmt: skip
        # counted calls, whichever backend (an ONNX session has no forward hooks)
        self.predictor.model = _Counting(self.predictor.model, on_forward)  # type: ignore[assignment]

    def _open_encoder(self, path: Path) -> None:
        """A folder without a task, opened by the loader: its encoder answers /embed; with a
        masked-LM head (torch) it answers fill-mask too."""
        from bertkit.inference.embedder import Embedder
        from bertkit.inference.fill_mask import FillMask, has_mlm_head
        from bertkit.inference.loader import load

        config = self.config
        masked = self.backend == "torch" and has_mlm_head(path)
        # fill-mask runs eagerly (its forward counts its tokens); `compile` is /embed's encoder's
        loaded = load(path, head="BertForMaskedLM" if masked else "BertModel",
                      device=self.device, precision=config.precision, backend=self.backend,
                      compile=config.compile, compile_encoder_only=masked)  # fmt: skip
        self.tokenizer = loaded.tokenizer
        encoder = loaded.encoder
        if masked:
            self.fill = FillMask.of(loaded, batch_size=self.max_batch_size)
            loaded.model.register_forward_pre_hook(lambda *_: self._count())
        elif self.backend == "onnx" and "last_hidden_state" not in loaded.model.names:
            raise ValueError(
                f"{path}: an ONNX export of {loaded.model.info.get('head')} without a task "
                f"(no {TASK_FILE}): nothing to serve"
            )
        # the one path: the folder's length (all-MiniLM-L6-v2: 256, as SentenceTransformer(path)
        # cuts), else what the tokenizer and positions allow; its pooling
        self.embedder = Embedder.of(loaded, encoder, batch_size=self.max_batch_size,
                                    pooling=self.pooling,
                                    mlm=loaded.model.cls.predictions if masked else None)  # fmt: skip
        self.max_seq_length = self.embedder.max_seq_length

    # ------------------------------------------------------------------ what it serves
    @property
    def endpoints(self) -> dict[str, bool]:
        """Each route, and whether this model answers it."""
        return {name: route.answers(self) for name, route in ROUTES.items()}

    @property
    def rerank_label(self) -> str | None:
        """What /rerank scores (`Predictor.rerank_label`); None: not a cross-encoder."""
        return self.predictor.rerank_label if self.predictor is not None else None

    def missing(self, endpoint: str) -> str:
        """Why this model does not answer `endpoint`."""
        return ROUTES[endpoint].missing(self)

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
        if not isinstance(body, dict):
            raise InputError(f"the body must be a JSON object, not {kind_of(body)}")
        return ROUTES[endpoint].parse(self, body, limits or ServeConfig())

    def shape(self, endpoint: str, items: list[Any], results: list[Any],
              style: HfStyle | None = None) -> Any:  # fmt: skip
        """A request's results as its route answers them; with `style` (`POST /`), /predict
        and /fill-mask as Hugging Face's `InferenceClient` parses them."""
        return ROUTES[endpoint].shape(self, items, results, style)

    def route(self, body: Any) -> tuple[str, Any, HfStyle]:
        """What `POST /` (and `/invocations`) runs for `body`: the endpoint, the body as that
        endpoint takes it, and how to answer in Hugging Face's shape (`clients`)."""
        if not isinstance(body, dict):
            raise InputError(f"the body must be a JSON object, not {kind_of(body)}")
        inputs = body.get("inputs")
        single = isinstance(inputs, (str, dict))  # one text, or one question and its context
        if "query" in body and "texts" in body:
            return "rerank", body, HfStyle(single)
        if isinstance(inputs, dict) and "source_sentence" in inputs:
            return "similarity", body, HfStyle(single)
        if self.predictor is not None:
            served = vars(self.config.heads)  # what this server's heads answer by
            parameters = hf_parameters(body, ("top_k", *served))
            for name, value in parameters.items():
                if name in served and value != served[name]:
                    raise InputError(
                        f'"parameters": {name} {value!r}: this server answers with '
                        f"{served[name]!r} (start it with --{name.replace('_', '-')})"
                    )
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

    def fits(self, texts: list[Any], truncate: bool, field: str,
             prompt_name: str | None = None) -> None:  # fmt: skip
        """Over the model's length (pieces with the special tokens; a text with its prompt,
        `prompt_name` or the folder's default) a 413 naming the text, unless `truncate` (then
        cut when run, as text-embeddings-inference's truncate). Only texts that could reach the
        length are tokenised (`most_pieces`), so a request's texts are tokenised once, when
        run."""
        if truncate:
            return
        room = self.max_seq_length
        prompt = ""
        if self.embedder is not None:
            prompt = self.embedder.resolve_prompt(prompt_name or self.embedder.prompt_name)[0]
        for n, text in enumerate(texts):
            if isinstance(text, Ids):
                count = len(text)
            else:
                parts = (prompt + text,) if isinstance(text, str) else tuple(text)
                specials = self.tokenizer.special_tokens_added(len(parts) == 2)
                if sum(map(self.tokenizer.most_pieces, parts)) + specials <= room:
                    continue
                ids = self.tokenizer.encode_ids(list(parts))
                count = specials + sum(map(len, ids))
            if count > room:
                raise InputError(
                    f"{field}[{n}]: {count} pieces; the model reads {room}: shorten it, or send "
                    '"truncate": true to cut it',
                    413,
                )

    @property
    def hidden_size(self) -> int:
        assert self.embedder is not None
        return self.embedder.dimension

    def task_input(self, text: str) -> Any:
        """An input this model's task takes, made of `text`."""
        assert self.predictor is not None
        # a reader's before a pair: a pair of long texts is a question with no room left
        for item in (text, {"question": "What?", "context": text}, [text, text],
                     {"context": text, "choices": ["yes", "no"]}):  # fmt: skip
            try:
                self.predictor.check(item)
            except (ValueError, KeyError, TypeError):
                continue
            return item
        raise ValueError(f"{self.source}: found no input its task {self.task_name} takes")

    # ------------------------------------------------------------------ batches
    def run(self, endpoint: str, items: list[Any]) -> list[Any]:
        """One result per input (inputs as `parse` returns them), in one batch."""
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            return ROUTES[endpoint].run(self, items)

    def embed(self, items: list[Text]) -> tuple[list[np.ndarray], list[int]]:
        """Each item's vector (the one path: `Embedder`; its first `dimensions` where it asks,
        cut before the normalising), and its pieces (the special tokens and prompt with)."""
        assert self.embedder is not None
        self._count()
        rows = self.embedder.inputs([item.text for item in items],
                                    prompt_name=[item.prompt_name for item in items])[0]  # fmt: skip
        vectors, pieces = self.embedder.encode(rows, pooling=[item.pooling for item in items],
                                               normalize=[item.normalize for item in items])  # fmt: skip
        out = list(vectors)  # float32: the response writes it as it is
        for n, item in enumerate(items):
            if item.dimensions is not None and item.dimensions < len(out[n]):
                # the cut of a unit vector brought to unit length again: the cut of the pooled
                # vector, normalised (one rule: `shortened`)
                cut = shortened(torch.from_numpy(out[n][None]), item.dimensions, item.normalize)
                out[n] = cut[0].numpy()
        return out, pieces

    @property
    def late_interaction(self) -> bool:
        """Whether this is a multi-vector (ColBERT) model: /rerank scores by MaxSim."""
        return self.embedder is not None and self.embedder.declares_multi_vector

    def embed_all(self, items: list[Text]) -> list[np.ndarray]:
        """Each item's per-token vectors, in its role (query or document)."""
        assert self.embedder is not None
        self._count()
        out: list[Any] = [None] * len(items)
        for role in ("query", "document"):
            chosen = [i for i, item in enumerate(items) if item.role == role]
            for name in {items[i].prompt_name for i in chosen}:
                mine = [i for i in chosen if items[i].prompt_name == name]
                rows = self.embedder.multi_inputs([str(items[i].text) for i in mine], role, name)
                for i, vectors in zip(mine, self.embedder.encode_multi(rows, role)[0],
                                      strict=True):  # fmt: skip
                    out[i] = vectors
        return out

    def maxsim(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Each (query, text)'s late-interaction score (MaxSim, MeanMaxSim where the folder
        says), the query and the texts in their roles."""
        assert self.embedder is not None
        self._count()
        return self.embedder.maxsim_pairs(pairs)

    def embed_sparse(self, items: list[Text]) -> list[Any]:
        """Each item's sparse (SPLADE) vector, (indices, values), on the one path."""
        assert self.embedder is not None
        self._count()
        rows = self.embedder.inputs([item.text for item in items],
                                    prompt_name=[item.prompt_name for item in items])[0]  # fmt: skip
        return self.embedder.encode_sparse(rows)[0]

    def warm(self) -> None:
        """Each route with inputs of its own once on a short input, on a short and a long one,
        then on a full batch of the longest inputs: lazy set-up done, each kind of call a
        compiled model compiles for (a batch of one, of more) compiled, and the largest
        activations allocated at start-up: a server that will not fit fails then, not under its
        first heavy load."""
        # a word that is one piece of this vocabulary, so n words are n pieces
        word = next((t for t in self.tokenizer.vocab if t.isalpha() and t.islower()), "a")
        short, long = "Warm up.", " ".join([word] * self.max_seq_length)
        for endpoint, ok in self.endpoints.items():
            inputs = ROUTES[endpoint].warm_inputs(self, short, long) if ok else None
            if inputs is None:  # not served, or runs what another route warms
                continue
            small, large = inputs
            for batch in ([small], [small, large], [large] * self.max_batch_size):
                self.run(endpoint, batch)
