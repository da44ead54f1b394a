"""The routes the server answers, one handler each: what a route's body may hold and how it is
checked (`parse`), what a batch of its inputs runs (`run`), and how a request's results are
answered (`shape`), looked up by name in `ROUTES` — as text-embeddings-inference's router
reads. A new route is one new handler here: its name, summary, request schema and code.

Inputs travel as small named records: `Text` (a text, pair or token ids to embed, with its
pooling and output form), `Pair` (a query and a text to score) and `Masked` (a text to fill);
/predict's inputs are the task's own (a text, a pair, a question and context, ...), checked by
the model's task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from bertkit._io import TASK_FILE
from bertkit.core.embedding import POOLINGS
from bertkit.errors import InputError
from bertkit.inference.texts import Ids
from bertkit.serve.clients import (
    RERANK_FIELDS,
    HfStyle,
    base64_floats,
    cohere_results,
    hf_fill_mask,
    hf_parameters,
    hf_prediction,
)
from bertkit.serve.config import ServeConfig

if TYPE_CHECKING:
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.inference.embedder import Embedder
    from bertkit.inference.fill_mask import FillMask as FillMasker
    from bertkit.inference.predict import Predictor


class RouteModel(Protocol):
    """What a route asks of the model it serves (`serve.engine.ServedModel` is the one):
    what it is, what it runs, and the checks and forwards the routes share."""

    name: str
    source: Path
    backend: str
    pooling: str
    max_seq_length: int
    tokenizer: BertTokenizer
    predictor: Predictor | None
    fill: FillMasker | None
    embedder: Embedder | None

    @property
    def endpoints(self) -> dict[str, bool]: ...
    @property
    def rerank_label(self) -> str | None: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def late_interaction(self) -> bool: ...
    def fits(self, texts: list[Any], truncate: bool, field: str,
             prompt_name: str | None = None) -> None: ...  # fmt: skip
    def task_input(self, text: str) -> Any: ...
    def embed(self, items: list[Text]) -> tuple[list[np.ndarray], list[int]]: ...
    def embed_all(self, items: list[Text]) -> list[np.ndarray]: ...
    def maxsim(self, pairs: list[tuple[str, str]]) -> list[float]: ...
    def embed_sparse(self, items: list[Text]) -> list[Any]: ...


Words = str | tuple[str, str]  # a text, or a pair of texts

# pieces of the request schemas (the API's documentation)
_TRUNCATE = {"type": "boolean", "default": False,
             "description": "cut texts over the model's length instead of a 413"}  # fmt: skip
_TEXTS = {"type": "array", "items": {"type": "string"}}
_PROMPT_NAME = {"type": "string", "description": "a prompt the model's folder declares "
                "(config_sentence_transformers.json), put before each text; default: its "
                "default prompt"}  # fmt: skip
_DIMENSIONS = {"type": "integer", "minimum": 1,
               "description": "the first n coordinates of each vector, then unit length"}  # fmt: skip
_ITEM = {
    "anyOf": [
        {"type": "string", "description": "a text"},
        {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2,
         "description": "a pair of texts (a tagger: a list of words)"},
        {"type": "object", "description": '{"question", "context"} (QA) or '
                                          '{"context", "choices"} (multiple choice)'},
    ]
}  # fmt: skip
_INPUTS = {"anyOf": [_ITEM, {"type": "array", "items": _ITEM}],
           "description": "one input, or a list of them (one result each)"}  # fmt: skip


@dataclass(frozen=True)
class Text:
    """One input to embed: a text, a pair or the model's token ids (`Ids`, run as they are);
    a text after the folder's prompt `prompt_name` (None: its default); pooled by `pooling`,
    its first `dimensions` kept (None: all), at unit length if `normalize`; OpenAI's answers
    may be written as base64; per-token vectors (/embed_all) made in its `role` (query or
    document)."""

    text: Words | Ids
    pooling: str
    normalize: bool = True
    dimensions: int | None = None
    base64: bool = False
    prompt_name: str | None = None
    role: str = "document"


@dataclass(frozen=True)
class Pair:
    """One (query, text) to score; `return_text`: the answer repeats the text; `top_n`: Cohere's
    best-n (the same for each pair of a request); `raw`: text-embeddings-inference's
    raw_scores."""

    query: str
    text: str
    return_text: bool = False
    top_n: int | None = None
    raw: bool = False  # the cross-encoder's logit, not its activation's score


@dataclass(frozen=True)
class Masked:
    """A text (or pair) whose [MASK]s to fill with the `top` most likely pieces each."""

    text: Words
    top: int


class Route:
    """One route: `answers(model)` whether this model serves it, `missing` why not; `parse` a
    body into inputs, `run` a batch of inputs (of any requests) into one result each, `shape`
    one request's results into its answer; `warm_inputs` a short and a long input to warm it
    with (None: it runs what another route warms)."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what the API's documentation says of it

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        """The request body's JSON schema: its properties and the required ones (the
        API's documentation): {"inputs": one input or a list of them}."""
        return {"inputs": _INPUTS}, ["inputs"]

    def answers(self, model: RouteModel) -> bool:
        return model.embedder is not None

    def missing(self, model: RouteModel) -> str:
        return (
            f"the ONNX export of {model.source} has no hidden states: serve it with --backend torch"
        )

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        raise NotImplementedError

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        raise NotImplementedError

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        return results

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any] | None:
        return None


class Predict(Route):
    """/predict: the fine-tuned task's answers (labels, entities, spans, choices)."""

    name = "predict"
    summary = "the fine-tuned task's answer per input (label and score, entities, span, choice)"

    def answers(self, model: RouteModel) -> bool:
        return model.predictor is not None

    def missing(self, model: RouteModel) -> str:
        served = ", ".join(f"/{name}" for name, ok in model.endpoints.items() if ok)
        return (f"{model.source} is not a fine-tuned model (no {TASK_FILE}, and its config.json "
                f"names no classifier, tagger or reader): it answers {served}")  # fmt: skip

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        assert model.predictor is not None
        inputs = _inputs(body, self.name, limits, set())
        for n, item in enumerate(inputs):
            try:
                model.predictor.check(item, n)
            except (ValueError, KeyError, TypeError) as err:
                message = str(err).removeprefix(f"item {n}: ")
                raise InputError(f"inputs[{n}]: {message}") from None
        return inputs

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        assert model.predictor is not None
        return model.predictor(items)

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        if style is None:
            return results
        labels = model.predictor.labels if model.predictor is not None else None
        answers = [hf_prediction(r, labels, style.top_k) for r in results]
        # a tagger's entities and a reader's answer: one input's own (a classifier's: a list)
        own = any(key in r for r in results for key in ("words", "entities", "no_answer"))
        return answers[0] if style.single and own else answers

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any]:
        return model.task_input(short), model.task_input(long)


class Embed(Route):
    """/embed: text-embeddings-inference's {"inputs", "pooling"?, "normalize"?, "truncate"?,
    "prompt_name"?, "dimensions"?}."""

    name = "embed"
    summary = "a sentence embedding per input (mean-pooled or [CLS], unit length by default)"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {"inputs": _INPUTS, "pooling": {"enum": list(POOLINGS), "default": "mean"},
                "normalize": {"type": "boolean", "default": True}, "truncate": _TRUNCATE,
                "prompt_name": _PROMPT_NAME, "dimensions": _DIMENSIONS}, ["inputs"]  # fmt: skip

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        inputs = _inputs(body, self.name, limits,
                         {"pooling", "normalize", "truncate", "prompt_name", "dimensions"})  # fmt: skip
        texts = [_text_or_pair(item, n) for n, item in enumerate(inputs)]
        pooling = body.get("pooling", model.pooling)
        if pooling not in POOLINGS:
            raise InputError(f'"pooling" must be one of {list(POOLINGS)}, not {pooling!r}')
        normalize = body.get("normalize", True)
        if not isinstance(normalize, bool):
            raise InputError(f'"normalize" must be true or false, not {normalize!r}')
        prompt, dims = _prompt_and_dimensions(model, body)
        model.fits(texts, _flag(body, "truncate"), "inputs", prompt)
        return [Text(text, pooling, normalize, dims, prompt_name=prompt) for text in texts]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        return model.embed(items)[0]

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any]:
        return Text(short, "mean"), Text(long, "mean")


class OpenAIEmbeddings(Route):
    """/v1/embeddings: OpenAI's {"input": a text, texts, the model's token ids or lists of them,
    "model"?, "dimensions"?, "encoding_format"?: "float" or "base64", "user"?, "truncate"?}.
    Token ids are the model's own ([CLS] and [SEP] included, as its tokenizer writes them) and
    run as they are."""

    name = "v1/embeddings"
    summary = "OpenAI's embeddings: {input, dimensions?} -> {data: [{embedding}], usage}"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        ids = {"type": "array", "items": {"type": "integer"}, "description": "token ids"}
        return {"input": {"anyOf": [{"type": "string"}, _TEXTS, ids,
                                    {"type": "array", "items": ids}]},
                "model": {"type": "string"}, "dimensions": _DIMENSIONS,
                "truncate": _TRUNCATE, "prompt_name": _PROMPT_NAME,
                "encoding_format": {"enum": ["float", "base64"], "default": "float"}}, [
            "input"]  # fmt: skip

    fields = {"input", "model", "dimensions", "encoding_format", "user", "truncate", "prompt_name"}

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        _known(body, self.fields, "/" + self.name)
        texts = _openai_input(body.get("input"), model.tokenizer.vocab_size)
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InputError(f'"encoding_format" must be "float" or "base64", not {encoding!r}')
        prompt, dims = _prompt_and_dimensions(model, body)
        _check_limits([t for t in texts if isinstance(t, str)], limits, "input", len(texts))
        model.fits(texts, _flag(body, "truncate"), "input", prompt)
        return [Text(text, model.pooling, True, dims, encoding == "base64", prompt)
                for text in texts]  # fmt: skip

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        """(vector, its pieces: the usage) for each input."""
        vectors, pieces = model.embed(items)
        return list(zip(vectors, pieces, strict=True))

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        data = [{"object": "embedding", "index": i,
                 "embedding": base64_floats(vector) if item.base64 else vector}
                for i, ((vector, _), item) in enumerate(zip(results, items, strict=True))]  # fmt: skip
        tokens = sum(pieces for _, pieces in results)
        return {"object": "list", "data": data, "model": model.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip


class EmbedAll(Route):
    """/embed_all: text-embeddings-inference's {"inputs", "truncate"?, "prompt_name"?}, and
    sentence-transformers' "task": "query" or "document" (default): each text's per-token
    vectors — a multi-vector (ColBERT) model's, as `MultiVectorEncoder.encode_query` /
    `encode_document` make them; another encoder's final states at unit length."""

    name = "embed_all"
    summary = "per-token vectors of each text (late interaction, ColBERT's MaxSim)"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {"inputs": {"anyOf": [{"type": "string"}, _TEXTS]}, "truncate": _TRUNCATE,
                "prompt_name": _PROMPT_NAME,
                "task": {"enum": ["query", "document"], "default": "document"}}, ["inputs"]  # fmt: skip

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        inputs = _inputs(body, self.name, limits, {"truncate", "prompt_name", "task"})
        for n, item in enumerate(inputs):
            if not isinstance(item, str):
                raise InputError(f"inputs[{n}]: a text expected, not {kind_of(item)}")
        task = body.get("task", "document")
        if task not in ("query", "document"):
            raise InputError(f'"task" must be "query" or "document", not {task!r}')
        prompt, _ = _prompt_and_dimensions(model, body)
        if not model.late_interaction:  # a multi-vector model cuts at the role's length
            model.fits(inputs, _flag(body, "truncate"), "inputs", prompt)
        return [Text(text, model.pooling, prompt_name=prompt, role=task) for text in inputs]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        return model.embed_all(items)

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        return [vectors.tolist() for vectors in results]

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any]:
        return Text(short, "mean", role="query"), Text(long, "mean")


class EmbedSparse(Route):
    """/embed_sparse: text-embeddings-inference's {"inputs", "truncate"?, "prompt_name"?}: a
    sparse (SPLADE) vector per text, its non-zero entries as {"index", "value"}."""

    name = "embed_sparse"
    summary = "a sparse (SPLADE) vector per text: [{index, value}] over the vocabulary"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {"inputs": {"anyOf": [{"type": "string"}, _TEXTS]}, "truncate": _TRUNCATE,
                "prompt_name": _PROMPT_NAME}, ["inputs"]  # fmt: skip

    def answers(self, model: RouteModel) -> bool:
        return model.embedder is not None and model.embedder.mlm is not None

    def missing(self, model: RouteModel) -> str:
        return (f"{model.source} has no masked-LM head (sparse vectors are SPLADE's: a "
                "SparseEncoder folder, or a BERT saved with its MLM head, on --backend torch)")  # fmt: skip

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        inputs = _inputs(body, self.name, limits, {"truncate", "prompt_name"})
        for n, item in enumerate(inputs):
            if not isinstance(item, str):
                raise InputError(f"inputs[{n}]: a text expected, not {kind_of(item)}")
        prompt, _ = _prompt_and_dimensions(model, body)
        model.fits(inputs, _flag(body, "truncate"), "inputs", prompt)
        return [Text(text, model.pooling, prompt_name=prompt) for text in inputs]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        return model.embed_sparse(items)

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        return [[{"index": int(i), "value": float(v)} for i, v in zip(*vector, strict=True)]
                for vector in results]  # fmt: skip

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any]:
        return Text(short, "mean"), Text(long, "mean")


class Similarity(Route):
    """/similarity: text-embeddings-inference's (and Hugging Face's sentence-similarity)
    {"inputs": {"source_sentence", "sentences"}, "truncate"?}: each sentence's cosine with the
    source."""

    name = "similarity"
    summary = "{inputs: {source_sentence, sentences}} -> each sentence's cosine with the source"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        pair = {"type": "object", "properties": {"source_sentence": {"type": "string"},
                                                 "sentences": _TEXTS}}  # fmt: skip
        return {"inputs": pair, "truncate": _TRUNCATE}, ["inputs"]

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        hf_parameters(body, ())
        fields = '["inputs", "parameters", "truncate"]'
        _known(body, {"inputs", "parameters", "truncate"}, "/" + self.name, fields)
        inputs = body.get("inputs")
        if not isinstance(inputs, dict) or set(inputs) != {"source_sentence", "sentences"}:
            raise InputError('"inputs" must be {"source_sentence": a text, "sentences": texts}')
        source, sentences = inputs["source_sentence"], inputs["sentences"]
        if not isinstance(source, str) or not isinstance(sentences, list) or not sentences:
            raise InputError('"source_sentence" must be a text, "sentences" a non-empty list')
        if not all(isinstance(t, str) for t in sentences):
            raise InputError('"sentences" must hold texts')
        texts = [source, *sentences]  # the source embedded first
        _check_limits(texts, limits, "sentences", count=len(sentences))
        model.fits(texts, _flag(body, "truncate"), "sentences")
        return [Text(text, model.pooling) for text in texts]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        return model.embed(items)[0]

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        source = results[0].astype(np.float64)  # unit vectors: the cosine is the dot product
        return [float(source @ v.astype(np.float64)) for v in results[1:]]


class Rerank(Route):
    """/rerank: text-embeddings-inference's {"query", "texts", "return_text"?, "truncate"?};
    answered best first with each text's index."""

    name = "rerank"
    summary = "a cross-encoder's relevance of each text to the query, best first"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {
            "query": {"type": "string"},
            "texts": _TEXTS,
            "truncate": _TRUNCATE,
            "return_text": {"type": "boolean", "default": False},
            "raw_scores": {"type": "boolean", "default": False,
                           "description": "the cross-encoder's logits, not its activation's"},
        }, ["query", "texts"]  # fmt: skip

    fields = {"query", "texts", "return_text", "truncate", "raw_scores"}

    def answers(self, model: RouteModel) -> bool:
        return model.rerank_label is not None or model.late_interaction

    def missing(self, model: RouteModel) -> str:
        return (
            f"{model.source} is not a cross-encoder: /rerank takes a model fine-tuned on text "
            "pairs (a pair classifier or regressor) or a multi-vector (ColBERT) model"
        )

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        _known(body, self.fields, "/" + self.name)
        query, texts = _query_and_texts(model, body, body.get("texts"), limits, "texts")
        keep, raw = _flag(body, "return_text"), _flag(body, "raw_scores")
        return [Pair(query, text, keep, raw=raw) for text in texts]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        if model.predictor is None:  # a multi-vector model: MaxSim
            return model.maxsim([(item.query, item.text) for item in items])
        scores: list[Any] = [None] * len(items)
        for raw in (False, True):  # (a batch may hold requests of either)
            chosen = [i for i, item in enumerate(items) if item.raw == raw]
            if chosen:
                found = model.predictor.relevance(
                    [(items[i].query, items[i].text) for i in chosen], raw=raw
                )
                for i, score in zip(chosen, found, strict=True):
                    scores[i] = score
        return scores

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        from bertkit.inference.predict import ranked

        answer = ranked(results)
        for entry in answer:
            item = items[entry["index"]]
            if item.return_text:
                entry["text"] = item.text
        return answer


class CohereRerank(Rerank):
    """/v1/rerank: Cohere's and Jina's {"query", "documents" (texts, or objects with a "text"),
    "top_n"?, "return_documents"?, "model"?, "truncate"?}."""

    name = "v1/rerank"
    summary = (
        "Cohere's and Jina's rerank: {query, documents, top_n?, return_documents?} -> "
        "{results: [{index, relevance_score, document?}]}"
    )

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {"query": {"type": "string"}, "documents": _TEXTS,
                "top_n": {"type": "integer", "minimum": 1}, "model": {"type": "string"},
                "return_documents": {"type": "boolean", "default": False},
                "truncate": _TRUNCATE}, ["query", "documents"]  # fmt: skip

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        _known(body, set(RERANK_FIELDS), "/" + self.name, str(list(RERANK_FIELDS)))
        documents = body.get("documents")
        if isinstance(documents, list):  # texts, or objects with a "text"
            documents = [d.get("text") if isinstance(d, dict) else d for d in documents]
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):  # fmt: skip
            raise InputError(f'"top_n" must be a whole number from 1, not {top_n!r}')
        query, texts = _query_and_texts(model, body, documents, limits, "documents")
        keep = _flag(body, "return_documents")
        return [Pair(query, text, keep, top_n) for text in texts]

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        from bertkit.inference.predict import ranked

        first = items[0]
        documents = [item.text for item in items]
        answer = cohere_results(ranked(results), documents, first.top_n, first.return_text)
        return {"model": model.name, "results": answer}


class FillMask(Route):
    """/fill-mask: {"inputs", "top"?}: the `top` pieces at each [MASK]."""

    name = "fill-mask"
    summary = "the likeliest tokens at each [MASK] of each input"

    def schema(self) -> tuple[dict[str, Any], list[str]]:
        return {"inputs": _INPUTS,
                "top": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5}}, [
            "inputs"]  # fmt: skip

    def answers(self, model: RouteModel) -> bool:
        return model.fill is not None

    def missing(self, model: RouteModel) -> str:
        if model.backend == "onnx":
            return "fill-mask runs on the torch backend only"
        return f"{model.source} has no masked-LM head (a pre-trained BERT saved with it has)"

    def parse(self, model: RouteModel, body: dict, limits: ServeConfig) -> list[Any]:
        mask = model.tokenizer.mask_token  # [MASK], RoBERTa's <mask>
        inputs = _inputs(body, self.name, limits, {"top"})
        texts = [_text_or_pair(item, n) for n, item in enumerate(inputs)]
        top = body.get("top", 5)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 100:
            raise InputError(f'"top" must be a whole number from 1 to 100, not {top!r}')
        for n, text in enumerate(texts):
            if not any(mask in t for t in ((text,) if isinstance(text, str) else text)):
                raise InputError(f"inputs[{n}]: no {mask} to fill")
        return [Masked(text, top) for text in texts]

    def run(self, model: RouteModel, items: list[Any]) -> list[Any]:
        assert model.fill is not None
        filled = model.fill([item.text for item in items], top=max(i.top for i in items))
        return [
            [{key: value[: item.top] if isinstance(value, list) else value
              for key, value in m.items()} for m in masks]
            for masks, item in zip(filled, items, strict=True)
        ]  # fmt: skip

    def shape(self, model: RouteModel, items: list[Any], results: list[Any],
              style: HfStyle | None) -> Any:  # fmt: skip
        if style is None:
            return results
        mask = model.tokenizer.mask_token
        answers = [hf_fill_mask(item.text, r, mask) for item, r in zip(items, results, strict=True)]
        return answers[0] if style.single else answers

    def warm_inputs(self, model: RouteModel, short: str, long: str) -> tuple[Any, Any]:
        mask = model.tokenizer.mask_token
        filler = " ".join(long.split()[: model.max_seq_length - 3])
        return Masked(f"Warm {mask}.", 1), Masked(f"{mask} {filler}", 1)


ROUTES: dict[str, Route] = {
    route.name: route
    for route in (
        Predict(),
        Embed(),
        OpenAIEmbeddings(),
        EmbedSparse(),
        EmbedAll(),
        Rerank(),
        CohereRerank(),
        Similarity(),
        FillMask(),
    )  # fmt: skip
}
ENDPOINTS = tuple(ROUTES)  # the routes' names, in the order /info lists them


# --------------------------------------------------------------------------- body checks
def _known(body: dict, allowed: set[str], route: str, shown: str | None = None) -> None:
    """Refuse a field `route` does not take, naming what it takes (`shown`, default: sorted)."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InputError(f"unknown field {unknown[0]!r}; {route} takes {shown or sorted(allowed)}")


def _inputs(body: dict, route: str, limits: ServeConfig, extra: set[str]) -> list[Any]:
    """The body's "inputs" (a text or object made a list of one), within the limits."""
    allowed = {"inputs"} | extra
    _known(body, allowed, route)  # these name the route without its slash
    if "inputs" not in body:
        raise InputError('no "inputs": send {"inputs": "a text"} or {"inputs": [...]}')
    inputs = body["inputs"]
    if isinstance(inputs, (str, dict)):
        inputs = [inputs]
    if not isinstance(inputs, list):
        raise InputError(f'"inputs" must be a text, a list or an object, not {kind_of(inputs)}')
    if not inputs:
        raise InputError('"inputs" is empty')
    _check_limits(inputs, limits, "inputs")
    return inputs


def _query_and_texts(model: RouteModel, body: dict, texts: Any, limits: ServeConfig,
                     field: str) -> tuple[str, list[str]]:  # fmt: skip
    """The body's query and `texts` (its `field`), checked, and each pair within the model's
    length unless truncated."""
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InputError('"query" must be a non-empty text')
    if not isinstance(texts, list) or not texts:
        raise InputError(f'"{field}" must be a non-empty list of texts')
    if not all(isinstance(t, str) and t.strip() for t in texts):
        n = next(i for i, t in enumerate(texts) if not (isinstance(t, str) and t.strip()))
        raise InputError(f"{field}[{n}]: a non-empty text expected")
    _check_limits([query, *texts], limits, field, count=len(texts))
    if model.predictor is None:  # late interaction reads the query and each text apart
        model.fits([query, *texts], _flag(body, "truncate"), field)
    else:
        model.fits([(query, text) for text in texts], _flag(body, "truncate"), field)
    return query, texts


def _check_limits(items: list[Any], limits: ServeConfig, field: str,
                  count: int | None = None) -> None:  # fmt: skip
    """413 beyond --max-inputs inputs (`count`, default: how many `items`) or a text (anywhere
    in an item: a pair's, an object's values) of more than --max-chars characters."""
    count = len(items) if count is None else count
    if count > limits.max_inputs:
        raise InputError(
            f"{count} {field} in one request; the server takes at most {limits.max_inputs} "
            "(--max-inputs)",
            413,
        )
    for n, item in enumerate(items):
        longest = _longest_text(item)
        if longest > limits.max_chars:
            raise InputError(
                f"{field}[{n}]: a text of {longest:,} characters; the server takes at most "
                f"{limits.max_chars:,} (--max-chars)",
                413,
            )


def _openai_input(given: Any, vocab: int) -> list[str | Ids]:
    """OpenAI's "input": a text, a list of texts, one list of token ids, or lists of them."""
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and given and all(_is_id(i) for i in given):
        given = [given]  # one text's ids
    if not isinstance(given, list) or not given:
        raise InputError('"input" must be a text, a non-empty list of texts, or token ids')
    texts: list[str | Ids] = []
    for n, item in enumerate(given):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, list) and item and all(_is_id(i) for i in item):
            wrong = next((i for i in item if not 0 <= i < vocab), None)
            if wrong is not None:
                raise InputError(
                    f"input[{n}]: token id {wrong} is not in the model's vocabulary (0 to "
                    f"{vocab - 1}): were these ids made by another model's tokenizer? "
                    "OpenAI clients that tokenize before sending (LangChain's OpenAIEmbeddings "
                    "sends tiktoken's ids unless check_embedding_ctx_length=False) must send "
                    "the text itself to this server"
                )
            texts.append(Ids(item))
        else:
            raise InputError(f"input[{n}]: a text or a non-empty list of token ids expected, "
                             f"not {kind_of(item)}")  # fmt: skip
    return texts


def kind_of(value: Any) -> str:
    """A JSON value's kind as an error message names it ("an object", "a text", ...)."""
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


def _text_or_pair(item: Any, n: int) -> Words:
    if isinstance(item, str):
        return item
    if isinstance(item, list) and len(item) == 2 and all(isinstance(t, str) for t in item):
        return (item[0], item[1])
    raise InputError(f"inputs[{n}]: a text or a pair of texts [a, b], not {kind_of(item)}")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InputError(f'"{name}" must be true or false, not {value!r}')
    return value


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_and_dimensions(model: RouteModel, body: dict) -> tuple[str | None, int | None]:
    """A request's "prompt_name" (one the folder declares; None: its default) and
    "dimensions" (1 to the model's; None: all)."""
    assert model.embedder is not None
    name = body.get("prompt_name")
    if name is not None:
        if not isinstance(name, str):
            raise InputError(f'"prompt_name" must be a text, not {kind_of(name)}')
        try:
            model.embedder.resolve_prompt(name)
        except ValueError:
            declared = ", ".join(sorted(model.embedder.prompts)) or "none"
            raise InputError(f'"prompt_name": {name!r} is not a prompt of this model (it '
                             f"declares {declared})") from None  # fmt: skip
    dims, width = body.get("dimensions"), model.hidden_size
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int)
                             or not 1 <= dims <= width):  # fmt: skip
        raise InputError(f'"dimensions" must be a whole number from 1 to {width}, not {dims!r}')
    return name, dims
