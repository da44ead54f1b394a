"""The request and answer shapes of the clients people already use, free of any web framework:
OpenAI's (`/v1/embeddings`, `/v1/models`, its error object), Cohere's and Jina's rerank
(`/v1/rerank`), and Hugging Face's `InferenceClient`, which posts to the server's URL itself
(`POST /`, as text-embeddings-inference answers it, and `/invocations` likewise).

What `POST /` runs is the served model's own route, chosen by the body where a body says more:

    {"query", "texts"}                             /rerank (a cross-encoder)
    {"inputs": {"source_sentence", "sentences"}}   /similarity (an encoder)
    {"inputs": ..., "parameters"?: {...}}          /predict (a fine-tuned model), /fill-mask (a
                                                   masked LM), else /embed (an encoder)

and the answer is in the shape `InferenceClient` parses: a classifier's labels as
`[[{"label", "score"}, ...]]` (every label, best first), a tagger's entities as
`[{"entity_group", "score", "word", "start", "end"}]`, fill-mask as
`[{"score", "token", "token_str", "sequence"}]`, embeddings as a list of vectors, similarity
as a list of numbers.

    >>> openai_error(422, "bad", "validation")
    {'error': {'message': 'bad', 'type': 'invalid_request_error', 'code': 'validation', 'param': None}}
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertkit.errors import InputError

# Cohere's and Jina's rerank fields this server reads (and its own "truncate")
RERANK_FIELDS = ("model", "query", "documents", "top_n", "return_documents", "truncate")


def openai_error(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error object: the `openai` client raises its typed exception for the status
    (BadRequestError, AuthenticationError, NotFoundError, UnprocessableEntityError, ...) with
    this message."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def base64_floats(vector: Any) -> str:
    """A vector as OpenAI and text-embeddings-inference send it with `encoding_format:
    "base64"`: little-endian float32, base64.

    >>> base64_floats([1.0, -2.0])
    'AACAPwAAAMA='
    """
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


@dataclass(frozen=True)
class HfStyle:
    """How `POST /` answers a request: as `InferenceClient` parses it. `single`: "inputs" was
    one text (a tagger's or fill-mask's answer is then that text's list, not a list of lists);
    `top_k`: a classifier's or fill-mask's candidates (default: every label, 5 tokens)."""

    single: bool
    top_k: int | None = None


def hf_parameters(body: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The `parameters` object `InferenceClient` sends beside "inputs" (None values left out
    by the client), checked: a parameter this server does not apply is refused by name rather
    than ignored."""

    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InputError('"parameters" must be an object')
    unknown = sorted(set(parameters) - set(allowed))
    if unknown:
        takes = f"it takes {list(allowed)}" if allowed else "it takes none"
        raise InputError(f'"parameters": {unknown[0]!r} is not applied by this server ({takes})')
    top_k = parameters.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f'"parameters": "top_k" must be a whole number from 1, not {top_k!r}')
    return parameters


def hf_prediction(answer: dict[str, Any], labels: list[str] | None, top_k: int | None) -> Any:
    """One input's `/predict` answer in the shape of Hugging Face's task: a classifier's labels
    with their scores, best first (`text-classification`); a regressor its score under its
    label; a tagger's entities (`token-classification`: `entity_group`, or with aggregation
    "none" each piece's `entity` and `index`; the entity's text and character offsets), or
    each word's tag when its tags are plain; a reader's answer (`question-answering`: no answer
    at 0, 0); other tasks' answers as /predict gives them."""
    scores = answer.get("probabilities", answer.get("scores"))
    if isinstance(scores, dict):
        ranked = sorted(scores.items(), key=lambda item: -item[1])
        return [{"label": label, "score": score} for label, score in ranked[:top_k]]
    if "score" in answer and set(answer) <= {"score", "label"}:  # a regressor
        return [{"label": answer.get("label", (labels or ["LABEL_0"])[0]),
                 "score": answer["score"]}]  # fmt: skip
    if "entities" in answer:
        return [{"entity" if "index" in e else "entity_group": e["type"], "score": e["score"],
                 "word": e["text"], "start": e.get("start"), "end": e.get("end"),
                 **({"index": e["index"]} if "index" in e else {})}
                for e in answer["entities"]]  # fmt: skip
    if "tags" in answer:  # plain tags: each word
        offsets = answer.get("offsets") or [[None, None]] * len(answer["words"])
        return [{"entity": tag, "score": score, "word": word, "start": start, "end": end}
                for word, tag, score, (start, end)
                in zip(answer["words"], answer["tags"], answer["scores"], offsets,
                       strict=True)]  # fmt: skip
    if "answer" in answer and "no_answer" in answer:
        return {"answer": answer["answer"], "score": answer["score"],
                "start": answer["start"] or 0, "end": answer["end"] or 0}  # fmt: skip
    return answer


def hf_fill_mask(text: Any, masks: list[dict[str, Any]], mask: str) -> Any:
    """One text's fill-mask answer as `pipeline("fill-mask")` gives it: per [MASK] its
    candidates `{"score", "token", "token_str", "sequence"}` (the text with that [MASK]
    filled); one [MASK]: that list alone.

    >>> hf_fill_mask("a [MASK] .", [{"tokens": ["cat"], "ids": [7], "probabilities": [0.5]}],
    ...              "[MASK]")
    [{'score': 0.5, 'token': 7, 'token_str': 'cat', 'sequence': 'a cat .'}]
    """
    whole = text if isinstance(text, str) else " ".join(text)
    parts = whole.split(mask)
    answers = []
    for n, found in enumerate(masks):
        candidates = []
        for token, token_id, score in zip(found["tokens"], found["ids"], found["probabilities"],
                                          strict=True):  # fmt: skip
            filled = token.removeprefix("##")
            sequence = mask.join(parts[: n + 1]) + filled + mask.join(parts[n + 1 :])
            candidates.append({"score": score, "token": token_id, "token_str": token,
                               "sequence": sequence})  # fmt: skip
        answers.append(candidates)
    return answers[0] if len(answers) == 1 else answers


def cohere_results(ranking: list[dict[str, Any]], documents: list[str], top_n: int | None,
                   return_documents: bool) -> list[dict[str, Any]]:  # fmt: skip
    """/rerank's ranking (best first) as Cohere's and Jina's `results`: `index`,
    `relevance_score`, and the `document` ({"text"}) when asked for; the best `top_n`.

    >>> cohere_results([{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}], ["a", "b"],
    ...                1, True)
    [{'index': 1, 'relevance_score': 0.9, 'document': {'text': 'b'}}]
    """
    results = []
    for entry in ranking[:top_n]:
        result: dict[str, Any] = {"index": entry["index"], "relevance_score": entry["score"]}
        if return_documents:
            result["document"] = {"text": documents[entry["index"]]}
        results.append(result)
    return results
