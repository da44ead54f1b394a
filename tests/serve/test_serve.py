"""What `bertkit serve` computes, without HTTP (issue 26): every head answers a batch gathered
from many requests as it answers each alone, request bodies are checked with the right status,
embeddings and fill-mask equal the library's, ONNX serving equals torch; and the dynamic batcher
gathers, splits, isolates a faulty request and refuses work when full."""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from bertkit import Predictor
from bertkit.core.model import BertModel
from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.train import FinetuneConfig, build_model, save_finetuned
from bertkit.inference.fill_mask import FillMask
from bertkit.serve import DynamicBatcher, InputError, QueueFull, ServeConfig, ServedModel
from bertkit.tasks import get_task

HEADLINES = ["stocks market profit bank today", "the team goal match coach", "a new chip",
             "robot startup cloud phone", "coach after the league"]  # fmt: skip
INPUTS = {
    "sst2": HEADLINES,
    "mrpc": [["stocks rally", "the market rallies"], ["a new chip", "the team wins"]],
    "stsb": [["stocks rally", "the market rallies"], ["a new chip", "a chip"]],
    "conll2003": ["paris loves pizza today", ["oslo", "eats", "sushi"], "lima"],
    "squad2": [{"question": "who eats sushi ?", "context": "oslo eats sushi . lima eats tacos ."},
               {"question": "what ?", "context": "the team wins the match"}],
    "swag": [{"context": "the team wins", "choices": ["the match", "the chip", "a bank"]},
             {"context": "stocks rally", "question": "the", "endings": ["market", "team"]}],
}  # fmt: skip


@pytest.fixture(scope="module")
def heads(words_model, tmp_path_factory):
    """A random fine-tuned checkpoint of each kind of head (sequence classification, pairs,
    regression, tagging, span QA with null answers, multiple choice)."""
    tokenizer = BertTokenizer.from_pretrained(words_model)
    made = {}
    for name in INPUTS:
        task = get_task(name)
        out = tmp_path_factory.mktemp(name)
        save_finetuned(build_model(task, words_model, seed=0), tokenizer, out, task,
                       FinetuneConfig(max_seq_length=48))  # fmt: skip
        made[name] = out
    return made


# every route a model may answer, in /info's order
ROUTE_NAMES = ("predict", "embed", "v1/embeddings", "embed_sparse", "embed_all", "rerank",
               "v1/rerank", "similarity", "fill-mask")  # fmt: skip


def _answering(*names: str) -> dict[str, bool]:
    """`ServedModel.endpoints` of a model that answers `names` and no other route."""
    return {name: name in names for name in ROUTE_NAMES}


@pytest.mark.parametrize("name", list(INPUTS))
def test_every_head_answers_a_gathered_batch_as_each_input_alone(name, heads):
    served = ServedModel(heads[name], max_batch_size=8)
    alone = Predictor(heads[name])
    items = served.parse("predict", {"inputs": INPUTS[name]})
    gathered = served.run("predict", items + items[:1])  # two requests in one batch
    expected = [alone([item])[0] for item in INPUTS[name]]
    assert _close(gathered[: len(items)], expected)
    assert _close(gathered[-1:], expected[:1])
    # pair classifiers and regressors rerank (mrpc's relevant class is "1", stsb's its score)
    rerank = {"mrpc": "1", "stsb": "score"}.get(name)
    assert served.rerank_label == rerank
    reranks = ("rerank", "v1/rerank") if rerank is not None else ()
    assert served.endpoints == _answering("predict", "embed", "v1/embeddings", "embed_all",
                                          "similarity", *reranks)  # fmt: skip


def _close(got, expected) -> bool:
    """Answers equal but for float rounding (batch composition changes the last bits)."""
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_close(got[k], expected[k]) for k in got)
    if isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(
            _close(g, e) for g, e in zip(got, expected, strict=True)
        )
    if isinstance(expected, float):
        return got == pytest.approx(expected, abs=1e-4)
    return got == expected


def test_label_names_and_entities(topics_model, heads):
    served = ServedModel(topics_model)
    answers = served.run("predict", served.parse("predict", {"inputs": HEADLINES[:2]}))
    assert answers[0]["label"] == "business" and answers[1]["label"] == "sports"
    assert set(answers[0]["probabilities"]) == {"business", "sports", "tech"}
    assert served.info()["labels"] == ["business", "sports", "tech"]
    tagger = ServedModel(heads["conll2003"])
    [answer] = tagger.run("predict", ["paris loves pizza"])
    assert answer["words"] == ["paris", "loves", "pizza"] and answer["offsets"][2] == [12, 17]
    assert len(answer["tags"]) == 3 and "entities" in answer


@pytest.mark.parametrize(
    "body, status, words",
    [
        ([], 422, "must be a JSON object"),
        ({"input": "x"}, 422, "unknown field 'input'"),
        ({}, 422, 'no "inputs"'),
        ({"inputs": []}, 422, "is empty"),
        ({"inputs": 3}, 422, "not a number"),
        ({"inputs": [["a", "b"]]}, 422, "inputs[0]: text-classification takes single texts"),
        ({"inputs": ["ok", 7]}, 422, "inputs[1]"),
        ({"inputs": ["x"] * 5}, 413, "5 inputs in one request; the server takes at most 4"),
        ({"inputs": ["ok", "y" * 41]}, 413, "inputs[1]: a text of 41 characters"),
    ],
)
def test_bad_bodies_are_refused_with_a_status_and_a_reason(topics_model, body, status, words):
    served = ServedModel(topics_model)
    with pytest.raises(InputError) as caught:
        served.parse("predict", body, ServeConfig(max_inputs=4, max_chars=40))
    assert caught.value.status == status
    assert words in str(caught.value)


def test_embed_is_the_mean_or_cls_of_the_encoder(minilm_dir):
    served = ServedModel(minilm_dir)
    assert served.endpoints == _answering("embed", "v1/embeddings", "embed_all", "similarity")
    assert "not a fine-tuned model" in served.missing("predict")
    texts = ["A man is playing a guitar.", "Stocks fell.", ["A question?", "Its answer."]]
    body = {"inputs": texts, "normalize": False}
    mean = torch.tensor(np.stack(served.run("embed", served.parse("embed", body))))
    cls = torch.tensor(np.stack(served.run("embed", served.parse("embed", body | {"pooling": "cls"}))))  # fmt: skip
    unit = torch.tensor(np.stack(served.run("embed", served.parse("embed", {"inputs": texts}))))
    model = BertModel.from_pretrained(minilm_dir).eval()
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    for row, text in enumerate(texts):
        pair = (text, None) if isinstance(text, str) else tuple(text)
        encoded = tokenizer(*pair, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**encoded).last_hidden_state[0]
        assert torch.allclose(mean[row], hidden.mean(0), atol=1e-5)
        assert torch.allclose(cls[row], hidden[0], atol=1e-5)
        assert torch.allclose(unit[row], hidden.mean(0) / hidden.mean(0).norm(), atol=1e-5)
    with pytest.raises(InputError, match="pooling"):
        served.parse("embed", {"inputs": "x", "pooling": "max"})


def test_openai_embeddings_tokenise_each_text_once_and_count_its_pieces(minilm_dir, monkeypatch):
    """/v1/embeddings' usage is the pieces the model read ([CLS] and [SEP] with), counted when
    the batch runs: a short text is not tokenised when the request is read, only a text long
    enough to be over the model's length is (to refuse it before it queues)."""
    served = ServedModel(minilm_dir)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    calls = []
    encode_ids = served.tokenizer.encode_ids
    monkeypatch.setattr(served.tokenizer, "encode_ids",
                        lambda texts: calls.append(texts) or encode_ids(texts))  # fmt: skip
    texts = ["A man is playing a guitar.", "Stocks fell."]
    items = served.parse("v1/embeddings", {"input": texts})
    assert calls == []
    answer = served.shape("v1/embeddings", items, served.run("v1/embeddings", items))
    assert calls == [texts]  # once, when the batch ran
    calls.clear()
    pieces = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert answer["usage"] == {"prompt_tokens": pieces, "total_tokens": pieces}
    long = "word " * 600  # over 256 pieces: all-MiniLM-L6-v2's sentence_bert_config.json length
    with pytest.raises(InputError, match="pieces; the model reads 256"):
        served.parse("v1/embeddings", {"input": long})
    assert len(calls) == 1
    items = served.parse("v1/embeddings", {"input": long, "truncate": True})
    assert served.shape("v1/embeddings", items, served.run("v1/embeddings", items))["usage"][
        "prompt_tokens"] == 256  # fmt: skip


def test_fill_mask_is_the_library_s(mlm_dir):
    served = ServedModel(mlm_dir)
    assert served.endpoints == _answering("embed", "v1/embeddings", "embed_sparse", "embed_all",
                                          "similarity", "fill-mask")  # fmt: skip
    texts = ["the capital of [MASK] is [MASK] .", ["a [MASK] sat", "on the mat"]]
    answers = served.run("fill-mask", served.parse("fill-mask", {"inputs": texts, "top": 3}))
    expected = FillMask(mlm_dir)([texts[0], tuple(texts[1])], top=3)
    assert _close(answers, expected)
    with pytest.raises(InputError, match=r"inputs\[0\]: no \[MASK\]"):
        served.parse("fill-mask", {"inputs": "no mask here"})
    with pytest.raises(InputError, match="top"):
        served.parse("fill-mask", {"inputs": "a [MASK]", "top": 0})


def test_a_route_is_one_handler_in_the_table(minilm_dir, monkeypatch):
    """Each served route is its handler in `routes.ROUTES` (named as config.ENDPOINTS lists
    them); one handler added there is answered, listed in /info and warmed, with nothing else
    changed."""
    from bertkit.serve import routes
    from bertkit.serve.routes import ENDPOINTS

    assert tuple(routes.ROUTES) == ENDPOINTS
    warmed = []

    class Length(routes.Route):  # how many pieces each text has
        name = "length"

        def parse(self, model, body, limits):
            return [routes.Text(t, "mean") for t in routes._inputs(body, self.name, limits, set())]

        def run(self, model, items):
            warmed.append(len(items))
            return model.embed(items)[1]

        def shape(self, model, items, results, style):
            return {"pieces": results}

        def warm_inputs(self, model, short, long):
            return routes.Text(short, "mean"), routes.Text(long, "mean")

    monkeypatch.setitem(routes.ROUTES, "length", Length())
    served = ServedModel(minilm_dir, max_batch_size=2)
    assert "/length" in served.info()["endpoints"]
    served.warm()
    assert warmed == [1, 2, 2]  # a short input, a short and a long one, a full batch
    items = served.parse("length", {"inputs": ["a cat", "the cat sat on the mat"]})
    assert served.shape("length", items, served.run("length", items)) == {"pieces": [4, 8]}


def test_onnx_serving_answers_as_torch_and_cleans_up(topics_model, ort):
    torch_answers = ServedModel(topics_model).run("predict", HEADLINES)
    for quantize, tolerance in ((None, 1e-4), ("int8", 0.05)):
        served = ServedModel(topics_model, backend="onnx", quantize=quantize)
        exported = served.path
        assert (exported / "model.onnx").exists() and exported != topics_model
        assert not served.endpoints["embed"] and "--backend torch" in served.missing("embed")
        answers = served.run("predict", HEADLINES)
        for got, want in zip(answers, torch_answers, strict=True):
            for label, p in want["probabilities"].items():
                assert got["probabilities"][label] == pytest.approx(p, abs=tolerance)
        served.close()
        assert not exported.exists()
    with pytest.raises(ValueError, match="add --backend onnx"):
        ServedModel(topics_model, quantize="int8")


# --------------------------------------------------------------------------- the batcher
def _batcher(run, **settings) -> DynamicBatcher:
    return DynamicBatcher(run, ThreadPoolExecutor(1), **settings)


def _answers(run, requests, **settings) -> list:
    """Each request's answer (or its exception), the requests submitted together to one batcher
    of `settings`."""

    async def main():
        batcher = _batcher(run, **settings)
        batcher.start()
        submitted = (batcher.submit(r) for r in requests)
        answers = await asyncio.gather(*submitted, return_exceptions=True)
        await batcher.stop()
        return answers

    return asyncio.run(main())


def _upper_failing_on_bad(ran: list):
    """A model call that records its batches, upper-cases them, and fails on a batch with "bad"."""

    def run(items):
        ran.append(list(items))
        if "bad" in items:
            raise ValueError("bad input")
        return [s.upper() for s in items]

    return run


def test_batches_hold_at_most_max_batch_size_a_large_request_in_parts():
    sizes = []

    def run(items):
        sizes.append(len(items))
        time.sleep(0.01)
        return [x * 10 for x in items]

    requests = [list(range(n, n + 2)) for n in range(0, 20, 2)] + [list(range(100, 107))]
    answers = _answers(run, requests, max_batch_size=5, max_wait_ms=30)
    assert answers == [[x * 10 for x in r] for r in requests]  # each request's own, in order
    assert sum(sizes) == 27 and max(sizes) == 5 and len(sizes) < len(requests)


def _recording(seconds: float):
    """A model call that takes `seconds` and records each batch as the first letters of its
    inputs (sorted, once each): the order batches ran in."""
    order: list[str] = []

    def run(items):
        order.append("".join(sorted({str(x)[0] for x in items})))
        time.sleep(seconds)
        return list(items)

    return order, run


def test_a_large_request_holds_up_a_later_small_one_by_one_batch():
    """Fair queueing: a one-input request that comes while a 40-input request runs in parts
    of 4 waits for the part in flight, not for the nine after it; two large requests share
    the model part for part."""
    order, run = _recording(0.02)

    async def main():
        batcher = _batcher(run, max_batch_size=4, max_wait_ms=0)
        batcher.start()
        large = asyncio.ensure_future(batcher.submit([f"a{n}" for n in range(40)]))
        await asyncio.sleep(0.03)  # its first part runs
        small = asyncio.ensure_future(batcher.submit(["s"]))
        other = asyncio.ensure_future(batcher.submit([f"b{n}" for n in range(8)]))
        answers = await asyncio.gather(large, small, other)
        await batcher.stop()
        return answers

    large, small, other = asyncio.run(main())
    assert large == [f"a{n}" for n in range(40)] and small == ["s"] and other[-1] == "b7"
    assert order.index("s") <= 2, order  # after the part in flight (and at most one more)
    assert order.index("b") < 5 and order.count("a") == 10, order  # b's parts did not wait for a's


def test_a_small_request_runs_within_two_batches_of_many_large_ones_and_none_starves():
    """Ten requests of 12 inputs (parts of 4) wait; a one-input request that comes after them
    runs within two batches, not after their ten first parts. A stream of small requests that
    fills every batch still leaves the large ones every other batch."""
    order, run = _recording(0.01)

    async def main():
        batcher = _batcher(run, max_batch_size=4, max_wait_ms=0)
        batcher.start()
        large = [asyncio.ensure_future(batcher.submit([f"L{n}"] * 12)) for n in range(10)]
        await asyncio.sleep(0.005)  # the first part runs
        ran_before = len(order)
        await batcher.submit(["s"])
        small_after = len(order) - ran_before
        flood = [asyncio.ensure_future(batcher.submit(["f"] * 4)) for _ in range(20)]
        await asyncio.gather(*large, *flood)
        await batcher.stop()
        return small_after

    small_after = asyncio.run(main())
    assert small_after <= 2, order
    # while the flood of full small batches waited, large parts ran every other batch
    flood = [i for i, o in enumerate(order) if o == "f"]
    between = order[flood[0] : flood[-1]]
    assert between.count("L") >= between.count("f") - 1, order


def test_idle_connections_are_trimmed_only_beside_busy_cpus_and_an_idle_pool():
    from bertkit.serve.connections import trims_idle_connections

    assert trims_idle_connections(64, 2, others_busy=0.96)  # the httpx load's state
    assert not trims_idle_connections(64, 2, others_busy=0.05)  # alone: a remote client
    assert not trims_idle_connections(64, 62, others_busy=1.0)  # a pool kept busy
    assert not trims_idle_connections(3, 1, others_busy=1.0)  # two idle: a client's turnaround


def test_a_request_gone_mid_way_leaves_its_later_parts_uncomputed():
    ran: list[list[int]] = []

    def run(items):
        ran.append(list(items))
        time.sleep(0.05)
        return list(items)

    async def main():
        batcher = _batcher(run, max_batch_size=4, max_wait_ms=0)
        batcher.start()
        gone = asyncio.ensure_future(batcher.submit(list(range(20))))
        await asyncio.sleep(0.07)  # its first part ran, the second runs
        gone.cancel()
        kept = await batcher.submit([100])
        await batcher.stop()
        return kept, batcher.waiting, batcher.cancelled

    kept, waiting, cancelled = asyncio.run(main())
    assert kept == [100] and waiting == 0
    assert ran[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]] and ran[2:] == [[100]]  # 8..19 never ran
    assert cancelled == 12


def test_a_faulty_request_fails_alone():
    run = _upper_failing_on_bad([])
    first, second, third = _answers(run, [["a"], ["bad"], ["b", "c"]], max_batch_size=8,
                                    max_wait_ms=30)  # fmt: skip
    assert first == ["A"] and third == ["B", "C"]
    assert isinstance(second, ValueError) and "bad input" in str(second)


def test_a_large_request_with_a_faulty_part_fails_whole_its_later_parts_unrun():
    ran: list[list[str]] = []
    requests = [["a", "bad", "c", "d", "e", "f"], ["x"]]
    faulty, fine = _answers(_upper_failing_on_bad(ran), requests, max_batch_size=2, max_wait_ms=0)
    assert isinstance(faulty, ValueError) and fine == ["X"]
    assert not any("e" in batch for batch in ran)  # its third part never ran


def test_a_full_queue_refuses_and_stop_answers_what_waits():
    async def main():
        batcher = _batcher(lambda items: list(items), max_batch_size=64, max_wait_ms=10_000,
                           max_queue=3)  # fmt: skip
        batcher.start()
        waiting = asyncio.ensure_future(batcher.submit([1, 2]))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull) as full:
            await batcher.submit([3, 4])
        assert full.value.retry_after >= 1
        started = time.perf_counter()
        await batcher.stop()  # does not wait out the 10 s
        return await waiting, time.perf_counter() - started

    answer, seconds = asyncio.run(main())
    assert answer == [1, 2] and seconds < 2


def test_a_cancelled_request_leaves_the_queue_uncomputed():
    """A request cancelled while it waits (its client went away) is never run; the others
    are, and the loop goes on (a queue emptied by cancellation while it waited included)."""
    ran: list[list[int]] = []

    async def main():
        batcher = _batcher(lambda items: ran.append(list(items)) or list(items),
                           max_batch_size=64, max_wait_ms=200)  # fmt: skip
        batcher.start()
        alone = asyncio.ensure_future(batcher.submit([1, 2, 3]))
        await asyncio.sleep(0.05)
        alone.cancel()  # the only request: the loop waits on an emptied queue
        await asyncio.sleep(0.3)
        kept = asyncio.ensure_future(batcher.submit([4]))
        gone = asyncio.ensure_future(batcher.submit([5, 6]))
        await asyncio.sleep(0.05)
        gone.cancel()
        answer = await kept
        await batcher.stop()
        return answer, batcher.waiting, batcher.cancelled

    assert asyncio.run(main()) == ([4], 0, 5)
    assert ran == [[4]]


def test_precision_follows_the_hardware_for_serving_and_prediction(topics_model, monkeypatch):
    fp32 = ServedModel(topics_model)
    assert fp32.precision.name == "fp32" and fp32.info()["precision"]["compute"] == "fp32"
    monkeypatch.setenv("BERTKIT_CPU_FLAGS", "avx2 avx512_bf16")
    bf16 = ServedModel(topics_model)
    assert bf16.info()["precision"] == {"compute": "bf16",
                                        "why": "bf16 autocast: this CPU has AVX512-BF16"}  # fmt: skip
    assert Predictor(topics_model).precision.name == "bf16"
    assert Predictor(topics_model, precision="fp32").precision.name == "fp32"
    computed = []  # what the first dense layer computed in, per call
    layer = next(m for m in bf16.predictor.model.modules() if isinstance(m, torch.nn.Linear))
    layer.register_forward_hook(lambda module, args, out: computed.append(out.dtype))
    answers = bf16.run("predict", HEADLINES)
    assert computed and set(computed) == {torch.bfloat16}, computed
    differ = 0
    for got, want in zip(answers, fp32.run("predict", HEADLINES), strict=True):
        for label, p in want["probabilities"].items():
            assert got["probabilities"][label] == pytest.approx(p, abs=0.05)
            differ += got["probabilities"][label] != p
    assert differ, "bf16 answered fp32's probabilities to the bit: it did not run in bf16"
    with pytest.raises(ValueError, match="fp16 on a CPU"):
        ServedModel(topics_model, precision="fp16")


@pytest.mark.slow  # compiles
def test_compiled_serving_answers_as_eager_in_one_graph_per_kind(topics_model, monkeypatch):
    """`--compile on`: each kind of call the warm-up makes (one input; inputs with padding; a
    full batch) compiles once, in one graph (the layouts come from the host: counting tokens
    inside the forward would break it), and later calls of those kinds compile nothing new
    and answer as the eager model does."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = ServedModel(topics_model, compile="on", max_batch_size=4)
    compiled.warm()
    assert not counters["graph_break"], dict(counters["graph_break"])
    frames = counters["stats"]["unique_graphs"]
    assert frames >= 1, "the warm-up compiled nothing"  # else the checks below hold vacuously
    eager = ServedModel(topics_model, max_batch_size=4)
    for batch in (HEADLINES[:1], HEADLINES[:3], HEADLINES[1:4]):
        for got, want in zip(compiled.run("predict", batch), eager.run("predict", batch),
                             strict=True):  # fmt: skip
            assert got["label"] == want["label"]
            for label, p in want["probabilities"].items():
                assert got["probabilities"][label] == pytest.approx(p, abs=1e-5)
    assert counters["stats"]["unique_graphs"] == frames  # warmed: no new compile
    with pytest.raises(ValueError, match="compiles the torch backend"):
        ServedModel(topics_model, compile="on", backend="onnx")
    with pytest.raises(ValueError, match="--compile 'yes' is not one of off, on"):
        ServedModel(topics_model, compile="yes")
    # predict refuses the same before it loads anything (no ONNX export is looked for)
    with pytest.raises(ValueError, match="compiles the torch backend"):
        Predictor(topics_model, compile="on", backend="onnx")


def test_a_started_server_freezes_what_it_loaded_and_leaves_fastapi_telemetry_off(
    minilm_dir, monkeypatch
):
    """Full collections walked the ~10^6 objects of torch, the model and the app every 0.7 s
    under load, pausing both threads for 75-150 ms (the p95 latency): once started, what is
    loaded is frozen. FastAPI's own OpenTelemetry (which asks the global providers on every
    request) stays off unless a provider was set before the app was made."""
    pytest.importorskip("fastapi")
    from opentelemetry import trace
    from starlette.testclient import TestClient

    from bertkit.serve.app import Service, _telemetry, create_app

    service = Service(str(minilm_dir), ServeConfig(precision="fp32"))
    gc.unfreeze()
    try:
        with TestClient(create_app(service)) as http:
            assert gc.get_freeze_count() > 100_000
            answer = http.post("/v1/embeddings", json={"input": "x", "encoding_format": "float"})
            assert len(answer.json()["data"][0]["embedding"]) == 384
    finally:
        gc.unfreeze()
    assert _telemetry() == {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)  # one is set
    assert _telemetry() == {}
