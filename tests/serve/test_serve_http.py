"""`bertkit serve` as users meet it (issue 26): a server started in a subprocess on a tiny
fine-tuned model, talked to over real HTTP: every endpoint, label names, concurrent requests
answered right in fewer forward passes, every bad request with its status and no dead server,
a full queue, and SIGTERM with requests in flight."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import Server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # subprocesses


@pytest.fixture(scope="module")
def server(topics_model):
    running = Server(topics_model, "--max-wait-ms", "20", "--max-inputs", "8",
                     "--max-chars", "200")  # fmt: skip
    yield running
    running.stop()


def test_predict_embed_and_label_names(server):
    one = server.post("/predict", {"inputs": "stocks market profit bank"})
    assert one.status_code == 200 and one.headers["content-type"] == "application/json"
    [answer] = one.json()
    assert answer["label"] == "business" and set(answer["probabilities"]) == {
        "business", "sports", "tech"}  # fmt: skip
    several = server.post("/predict", {"inputs": ["goal match team coach", "chip cloud phone"]})
    assert [a["label"] for a in several.json()] == ["sports", "tech"]
    vectors = server.post("/embed", {"inputs": ["goal match", "chip"]}).json()
    assert len(vectors) == 2 and len(vectors[0]) == 32
    assert sum(v * v for v in vectors[0]) == pytest.approx(1, abs=1e-4)
    missing = server.post("/fill-mask", {"inputs": "a [MASK]"})
    assert missing.status_code == 404 and "no masked-LM head" in missing.json()["error"]


def test_operations_endpoints(server):
    assert server.post("/predict", {"inputs": "goal"}).status_code == 200  # some traffic
    assert httpx.get(server.url + "/health").json() == {"status": "ready"}
    info = httpx.get(server.url + "/info").json()
    assert info["labels"] == ["business", "sports", "tech"]
    assert info["endpoints"] == ["/predict", "/embed", "/v1/embeddings", "/embed_all",
                                 "/similarity"]  # fmt: skip
    assert info["settings"]["max_inputs"] == 8 and info["rerank_label"] is None
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/predict", "/embed", "/fill-mask", "/health", "/metrics"} <= set(spec["paths"])
    body = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["required"] == ["inputs"]
    from bertkit.serve.routes import ROUTES

    for name, route in ROUTES.items():  # each route's documentation is its handler's own
        post = spec["paths"][f"/{name}"]["post"]
        schema = post["requestBody"]["content"]["application/json"]["schema"]
        assert post["summary"] == route.summary
        assert (schema["properties"], schema["required"]) == route.schema()
    assert httpx.get(server.url + "/docs").status_code == 200
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("bertkit_requests_total", "bertkit_request_duration_seconds_bucket",
                 "bertkit_batch_size_bucket", "bertkit_queue_depth", "bertkit_ready 1"):  # fmt: skip
        assert name in metrics.text


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server):
    texts = ["stocks market profit", "goal match team", "chip cloud robot", "bank shares trade"]
    alone = {t: server.post("/predict", {"inputs": t}).json()[0] for t in texts}
    requests = [texts[i % len(texts)] for i in range(24)]
    before = server.metric("bertkit_forward_passes_total")
    start = threading.Barrier(len(requests))

    def send(text):
        start.wait()
        return text, server.post("/predict", {"inputs": text})

    with ThreadPoolExecutor(len(requests)) as pool:
        answered = list(pool.map(send, requests))
    passes = server.metric("bertkit_forward_passes_total") - before
    for text, response in answered:
        assert response.status_code == 200
        [answer] = response.json()
        assert answer["label"] == alone[text]["label"]
        assert answer["score"] == pytest.approx(alone[text]["score"], abs=1e-4)
    assert passes < len(requests) / 2, f"{passes:.0f} forward passes for {len(requests)} requests"


@pytest.mark.parametrize(
    "send, status, words",
    [
        (dict(content=b'{"inputs": "x"'), 400, "not JSON"),
        (dict(content=b"\xff\xfe"), 400, "not JSON"),
        (dict(json={"inputs": ["a"] * 9}), 413, "9 inputs in one request"),
        (dict(json={"inputs": "w" * 201}), 413, "201 characters"),
        (dict(content=b"x" * (9 << 20)), 413, "bytes"),
        (dict(json={"text": "x"}), 422, "unknown field 'text'"),
        (dict(json={"inputs": [["a", "b"]]}), 422, "inputs[0]"),
        (dict(json={"inputs": None}), 422, '"inputs" must be'),
        (dict(json=["x"]), 422, "JSON object"),
        (dict(content=b"[" * 100_000), 400, "nested too deeply"),
        (dict(content=b'{"inputs": ' + b"[" * 900 + b"]" * 900 + b"}"), 422, "inputs"),
    ],
)
def test_bad_requests_get_a_status_and_a_message(server, send, status, words):
    response = httpx.post(server.url + "/predict", timeout=30, **send)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert "Traceback" not in response.text


def test_routes_and_methods_it_lacks_and_the_server_lives_on(server):
    assert httpx.get(server.url + "/predict").status_code == 405
    assert httpx.post(server.url + "/nothing", json={}).status_code == 404
    assert server.post("/predict", {"inputs": "goal"}).status_code == 200


def test_a_full_queue_answers_503_with_retry_after(topics_model):
    server = Server(topics_model, "--max-queue", "2", "--max-wait-ms", "1500",
                    "--max-batch-size", "64")  # fmt: skip
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(server.post, "/predict", {"inputs": ["goal", "bank"]})
            deadline = time.monotonic() + 10
            while server.metric('bertkit_queue_depth{endpoint="/predict"}') < 2:
                assert time.monotonic() < deadline, "the first request never queued"
                time.sleep(0.02)
            refused = server.post("/predict", {"inputs": "chip"})
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert "retry later" in refused.json()["error"]
            assert first.result().status_code == 200
    finally:
        server.stop()


def test_sigterm_answers_every_request_in_flight_then_exits(topics_model):
    server = Server(topics_model, "--max-wait-ms", "3000", "--max-batch-size", "64")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(server.post, "/predict", {"inputs": f"goal {n}"}) for n in range(6)]
        deadline = time.monotonic() + 10
        while server.metric('bertkit_queue_depth{endpoint="/predict"}') < 6:
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.02)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200] * 6
    assert all(a.json()[0]["label"] in ("business", "sports", "tech") for a in answers)
    assert time.monotonic() - sent < 2.5, "the queued batch waited out --max-wait-ms"
    # uvicorn raises the signal again once it has shut down, so the exit status says what
    # stopped the server (143 in a shell), as for any process SIGTERM ends
    assert server.process.wait(timeout=30) == -signal.SIGTERM
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/health", timeout=2)
    output = server.stop()
    assert "Traceback" not in output, output


def test_fill_mask_over_http(mlm_dir):
    server = Server(mlm_dir)
    try:
        response = server.post("/fill-mask", {"inputs": ["the [MASK] sat .", "a [MASK]"],
                                              "top": 2})  # fmt: skip
        assert response.status_code == 200
        first, second = response.json()
        assert len(first) == 1 and len(first[0]["tokens"]) == 2
        assert first[0]["probabilities"][0] >= first[0]["probabilities"][1]
        assert server.post("/fill-mask", {"inputs": "no mask"}).status_code == 422
        assert server.post("/predict", {"inputs": "x"}).status_code == 404
        assert json.loads(httpx.get(server.url + "/info").text)["endpoints"] == [
            "/embed", "/v1/embeddings", "/embed_sparse", "/embed_all", "/similarity",
            "/fill-mask"]  # fmt: skip
    finally:
        server.stop()


def test_two_worker_processes_answer_and_stop(topics_model):
    server = Server(topics_model, "--workers", "2")
    try:
        answers = [server.post("/predict", {"inputs": "goal match team"}) for _ in range(4)]
        assert all(a.status_code == 200 and a.json()[0]["label"] == "sports" for a in answers)
        assert "2 workers" in server.read_output().splitlines()[0]
    finally:
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)


def test_rerank_openai_embeddings_truncation_and_a_key(words_model, tmp_path_factory):
    """A cross-encoder (pairs of headlines, 1 = the same topic) served with --api-key: /rerank
    scores each text by the model's probability of "1" for the pair (Predictor's, computed
    here), best first; /v1/embeddings answers in OpenAI's shape; a text over the model's length
    is a 413 unless "truncate"; every route but /health wants the key."""
    import csv

    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    from helpers import OWN_QUICK, topic_rows

    root = tmp_path_factory.mktemp("rerank")
    rows, others = topic_rows(200, seed=4), topic_rows(200, seed=5)
    for name, part in (("train", slice(0, 160)), ("dev", slice(160, 200))):
        with open(root / f"{name}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["query", "text", "relevant"])
            for a, b in zip(rows[part], others[part], strict=True):
                writer.writerow([a["headline"], b["headline"], int(a["topic"] == b["topic"])])
    data = DataConfig(train=str(root / "train.csv"), validation=str(root / "dev.csv"),
                      text_column="query", text_pair_column="text", label_column="relevant")  # fmt: skip
    finetune("text-classification", words_model, data, root / "model",
             FinetuneConfig(**OWN_QUICK | {"epochs": 2, "max_seq_length": 32}))  # fmt: skip
    from bertkit.inference.predict import Predictor

    texts = ["stocks bank shares", "coach league score", "chip phone cloud"]
    expected = [a["probabilities"]["1"] for a in
                Predictor(root / "model")([("goal match team", t) for t in texts])]  # fmt: skip
    server = Server(root / "model", "--api-key", "s3cret", "--max-inputs", "50")
    try:
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.get(server.url + "/health").status_code == 200  # open
        body = {"query": "goal match team", "texts": texts, "return_text": True}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            refused = server.post("/rerank", body, headers=headers)
            assert refused.status_code == 401 and refused.json()["error_type"] == "unauthorized"
        assert httpx.get(server.url + "/info").status_code == 401
        ranked = server.post("/rerank", body, headers=key).json()
        assert [r["index"] for r in ranked] == sorted(range(3), key=lambda i: -expected[i])
        for r in ranked:
            assert r["score"] == pytest.approx(expected[r["index"]], abs=1e-5)
            assert r["text"] == texts[r["index"]]
        assert server.post("/rerank", {"query": "x", "texts": []}, headers=key).status_code == 422
        many = server.post("/rerank", {"query": "x", "texts": ["a"] * 10_000}, headers=key)
        assert many.status_code == 413 and "10000 texts" in many.json()["error"]
        info = httpx.get(server.url + "/info", headers=key).json()
        assert info["rerank_label"] == "1" and info["settings"]["api_key"] == "(set)"
        openai = server.post("/v1/embeddings", {"input": ["goal match", "chip"], "dimensions": 8},
                             headers=key).json()  # fmt: skip
        assert openai["object"] == "list" and [d["index"] for d in openai["data"]] == [0, 1]
        assert len(openai["data"][0]["embedding"]) == 8
        assert sum(v * v for v in openai["data"][0]["embedding"]) == pytest.approx(1, abs=1e-4)
        assert openai["usage"] == {"prompt_tokens": 7, "total_tokens": 7}  # 2 + 2 pieces, 3 [..]
        long = " ".join(["goal"] * 40)  # 42 pieces; the model reads 32
        for route, payload in (("/embed", {"inputs": long}), ("/v1/embeddings", {"input": long})):
            cut = server.post(route, payload, headers=key)
            error = cut.json()["error"]  # OpenAI's error object on its route
            message = error["message"] if route.startswith("/v1/") else error
            assert cut.status_code == 413 and "42 pieces; the model reads 32" in message
            assert server.post(route, payload | {"truncate": True}, headers=key).status_code == 200
    finally:
        server.stop()
