"""`bertkit serve` against the client packages people already call, unmodified, over real HTTP
on loopback: the `openai` client's default embeddings call (base64), floats, `dimensions`,
token ids, `models.list()` and its typed errors; Hugging Face's `InferenceClient(model=URL)` for
feature extraction, sentence similarity, text classification, token classification and
fill-mask; and the rerank shape of Cohere and Jina. Each answer is checked against what
`SentenceTransformer(path)`, `Predictor` and `FillMask` give for the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.core.tokenizer import BertTokenizer
from bertkit.inference.fill_mask import FillMask
from bertkit.inference.predict import Predictor

from helpers import Server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
huggingface_hub = pytest.importorskip("huggingface_hub")

pytestmark = pytest.mark.slow  # subprocesses

KEY = "s3cret"
TEXTS = ["A man is eating food.", "Someone eats a meal.", "The sky is blue today."]


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    """all-MiniLM-L6-v2 served in fp32 (the comparisons are to fp32 references), with a key
    and a name of its own."""
    running = Server(minilm_dir, "--api-key", KEY, "--served-model-name", "minilm",
                     "--precision", "fp32")  # fmt: skip
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(minilm_dir):
    """What sentence-transformers gives for the same model folder (unit vectors: the folder
    declares its Normalize module)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def client(server: Server, key: str = KEY):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_openai_client_default_call_gives_sentence_transformers_vectors(encoder, reference):
    expected = reference.encode(TEXTS)
    # the call of every tutorial: the client asks for base64 and decodes it itself
    answer = client(encoder).embeddings.create(model="minilm", input=TEXTS)
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, expected, atol=2e-6)
    assert [d.index for d in answer.data] == [0, 1, 2] and answer.model == "minilm"
    pieces = sum(len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"])
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == pieces
    floats = client(encoder).embeddings.create(model="minilm", input=TEXTS,
                                               encoding_format="float")  # fmt: skip
    np.testing.assert_allclose([d.embedding for d in floats.data], expected, atol=2e-6)
    # dimensions: the first n coordinates of the full vector, at unit length again
    short = client(encoder).embeddings.create(model="minilm", input=TEXTS[0], dimensions=128)
    first = expected[0][:128] / np.linalg.norm(expected[0][:128])
    np.testing.assert_allclose(short.data[0].embedding, first, atol=2e-6)


def test_float_answers_are_the_base64_float32s_in_their_shortest_digits(encoder):
    """`encoding_format: "float"` writes each float32 in the fewest digits that read back as
    it (as OpenAI's own answers do): the numbers equal the default call's base64 float32s
    exactly, and none has more than 9 significant digits (a float64's repr took 17)."""
    import base64
    import re

    url, headers = encoder.url + "/v1/embeddings", {"Authorization": f"Bearer {KEY}"}
    floats = httpx.post(url, json={"input": TEXTS, "encoding_format": "float"}, headers=headers)
    packed = httpx.post(url, json={"input": TEXTS, "encoding_format": "base64"}, headers=headers)
    for got, raw in zip(floats.json()["data"], packed.json()["data"], strict=True):
        exact = np.frombuffer(base64.b64decode(raw["embedding"]), dtype="<f4")
        assert np.array_equal(np.array(got["embedding"], dtype=np.float32), exact)
    numbers = re.findall(rb"-?\d\.?\d*(?:e-?\d+)?", floats.content.split(b'"usage"')[0])
    digits = [len(n.lstrip(b"-").replace(b".", b"").split(b"e")[0].lstrip(b"0")) for n in numbers]
    assert len(numbers) > 3 * 384 and max(digits) <= 9


def test_openai_client_token_ids_as_input(encoder, reference, minilm_dir):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    ids = tokenizer(TEXTS[:2])["input_ids"]  # [CLS] ... [SEP], as the model's tokenizer writes
    expected = reference.encode(TEXTS[:2])
    several = client(encoder).embeddings.create(model="minilm", input=ids)
    np.testing.assert_allclose([d.embedding for d in several.data], expected, atol=2e-6)
    assert several.usage.prompt_tokens == sum(len(i) for i in ids)
    one = client(encoder).embeddings.create(model="minilm", input=ids[0])
    np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=2e-6)
    # tiktoken's ids of "Hello world" (what LangChain sends by default): the likely cause named
    with pytest.raises(openai.UnprocessableEntityError,
                       match=r"41917 is not in the model's vocabulary \(0 to 30521\): were these "
                       r"ids made by another model's tokenizer\?.*check_embedding_ctx_length=False"):  # fmt: skip
        client(encoder).embeddings.create(model="minilm", input=[[9906, 41917, 0]])


def test_openai_client_lists_the_model_and_raises_its_own_errors(encoder):
    assert [m.id for m in client(encoder).models.list()] == ["minilm"]
    assert client(encoder).models.retrieve("minilm").owned_by == "bertkit"
    with pytest.raises(openai.NotFoundError, match="serves 'minilm'"):
        client(encoder).models.retrieve("gpt-4")
    with pytest.raises(openai.AuthenticationError, match="Bearer KEY"):
        client(encoder, key="wrong").embeddings.create(model="minilm", input="x")
    with pytest.raises(openai.UnprocessableEntityError, match='"dimensions" must be'):
        client(encoder).embeddings.create(model="minilm", input="x", dimensions=1000)
    refused = httpx.post(encoder.url + "/v1/embeddings", json={"input": 7},
                         headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    error = refused.json()["error"]
    assert refused.status_code == 422 and error["type"] == "invalid_request_error"
    assert error["code"] == "validation" and '"input" must be' in error["message"]


def hf(server: Server, path: str = ""):
    return huggingface_hub.InferenceClient(model=server.url + path, token=KEY)


@pytest.mark.parametrize("path", ["", "/invocations"])
def test_hugging_face_client_feature_extraction_and_similarity(encoder, reference, path):
    vectors = hf(encoder, path).feature_extraction(TEXTS[0])
    assert vectors.shape == (1, 384)
    np.testing.assert_allclose(vectors[0], reference.encode(TEXTS[0]), atol=2e-6)
    scores = hf(encoder, path).sentence_similarity(TEXTS[0], TEXTS[1:])
    expected = reference.similarity(reference.encode(TEXTS[:1]), reference.encode(TEXTS[1:]))
    np.testing.assert_allclose(scores, expected[0].numpy(), atol=1e-5)
    assert scores[0] > scores[1]  # eating and eating, against the sky


def test_hugging_face_client_text_classification(topics_model):
    with Server(topics_model, "--api-key", KEY) as server:
        text = "stocks market profit bank"
        [expected] = Predictor(topics_model)([text])
        answer = hf(server).text_classification(text)
        assert [a.label for a in answer] == sorted(
            expected["probabilities"], key=lambda label: -expected["probabilities"][label]
        )
        assert answer[0].label == expected["label"] == "business"
        for a in answer:
            assert a.score == pytest.approx(expected["probabilities"][a.label], abs=1e-5)
        assert len(hf(server).text_classification(text, top_k=1)) == 1


def test_hugging_face_client_token_classification(tagger):
    with Server(tagger) as server:
        text = "ann visits paris, eats sushi and pizza"
        [expected] = Predictor(tagger)([text])
        assert expected["entities"], "the tagger found no entity to compare"
        answer = huggingface_hub.InferenceClient(model=server.url).token_classification(text)
        assert [(a.entity_group, a.word, a.start, a.end) for a in answer] == [
            (e["type"], e["text"], e["start"], e["end"]) for e in expected["entities"]
        ]
        assert {a.word for a in answer} >= {"paris", "sushi"}
        for a, e in zip(answer, expected["entities"], strict=True):
            assert a.word == text[a.start : a.end] and a.score == pytest.approx(e["score"])


def test_hugging_face_client_on_models_transformers_saved(tagger, words_model, tmp_path):
    """A tagger and a reader as transformers saves them (no task record: the tagger bertkit
    fine-tuned with its record removed, a reader with transformers' own random head):
    InferenceClient's token_classification gets `pipeline("ner", aggregation_strategy=
    "simple")`'s entities, and question_answering the reader's answer; a parameter the server
    does not answer by is refused by name."""
    import shutil

    import transformers

    folder = tmp_path / "tagger"
    shutil.copytree(tagger, folder)
    (folder / "bertkit_task.json").unlink()
    reader = tmp_path / "reader"
    shutil.copytree(words_model, reader)
    torch.manual_seed(0)
    transformers.AutoModelForQuestionAnswering.from_pretrained(words_model).save_pretrained(reader)
    text = "ann visits paris, eats sushi and pizza"
    pipe = transformers.pipeline("ner", model=str(folder), aggregation_strategy="simple")
    expected = pipe(text)
    assert expected, "the tagger found no entity to compare"
    with Server(folder, "--precision", "fp32") as server:
        answer = huggingface_hub.InferenceClient(model=server.url).token_classification(text)
        assert [(a.entity_group, a.start, a.end) for a in answer] == \
            [(e["entity_group"], e["start"], e["end"]) for e in expected]  # fmt: skip
        for a, e in zip(answer, expected, strict=True):
            assert a.word == text[a.start : a.end] and a.score == pytest.approx(
                e["score"], abs=1e-5
            )
        with pytest.raises(huggingface_hub.errors.HfHubHTTPError, match="aggregation-strategy"):
            huggingface_hub.InferenceClient(model=server.url).token_classification(
                text, aggregation_strategy="max"
            )
    question, context = "who visits paris?", "ann visits paris and eats sushi with bob ."
    [own] = Predictor(reader, precision="fp32")([{"question": question, "context": context}])
    with Server(reader, "--precision", "fp32") as server:
        answer = huggingface_hub.InferenceClient(model=server.url).question_answering(
            question=question, context=context
        )
        assert (answer.answer, answer.start, answer.end) == (
            own["answer"],
            own["start"],
            own["end"],
        )
        assert answer.score == pytest.approx(own["score"], abs=1e-6) and answer.answer


def test_hugging_face_client_fill_mask(mlm_dir):
    with Server(mlm_dir) as server:
        text = "the cat sat on the [MASK] ."
        [[expected]] = FillMask(mlm_dir)([text], top=3)
        answer = huggingface_hub.InferenceClient(model=server.url).fill_mask(text, top_k=3)
        assert [a.token for a in answer] == expected["ids"]
        assert [a.token_str for a in answer] == expected["tokens"]
        for a, token, p in zip(answer, expected["tokens"], expected["probabilities"], strict=True):
            assert a.sequence == text.replace("[MASK]", token.removeprefix("##"))
            assert a.score == pytest.approx(p, abs=1e-6)
        assert len(huggingface_hub.InferenceClient(model=server.url).fill_mask(text)) == 5


def test_rerank_in_cohere_and_jina_shape(words_model, tmp_path):
    """A cross-encoder (a pair classifier whose labels are 0/1) answers /v1/rerank as Cohere
    and Jina do, and POST / with text-embeddings-inference's rerank body."""
    from bertkit.finetuning.train import FinetuneConfig, build_model, save_finetuned
    from bertkit.tasks import get_task

    task = get_task("mrpc")
    save_finetuned(build_model(task, words_model, seed=3), BertTokenizer.from_pretrained(
        words_model), tmp_path, task, FinetuneConfig(max_seq_length=32))  # fmt: skip
    query, documents = "goal match team", ["stocks bank shares", "coach league score", "chip"]
    expected = Predictor(tmp_path).rerank(query, documents)
    with Server(tmp_path) as server:
        body = {"model": "x", "query": query, "documents": documents}
        answer = server.post("/v1/rerank", body).json()
        assert [r["index"] for r in answer["results"]] == [e["index"] for e in expected]
        for r, e in zip(answer["results"], expected, strict=True):
            assert r["relevance_score"] == pytest.approx(e["score"], abs=1e-6)
            assert "document" not in r
        top = server.post("/v1/rerank", body | {"top_n": 2, "return_documents": True}).json()
        assert [r["document"]["text"] for r in top["results"]] == [
            documents[e["index"]] for e in expected[:2]]  # fmt: skip
        objects = body | {"documents": [{"text": d} for d in documents]}
        assert server.post("/v1/rerank", objects).json() == answer
        refused = server.post("/v1/rerank", {"query": query, "documents": []})
        assert refused.status_code == 422 and '"documents"' in refused.json()["error"]["message"]
        tei = server.post("/", {"query": query, "texts": documents}).json()
        assert [r["index"] for r in tei] == [e["index"] for e in expected]


def test_a_trained_sentence_embedding_folder_served_gives_sentence_transformers_vectors(
    words_model, tmp_path
):
    """What `finetune sentence-embedding` writes, served: the openai client's vectors are the
    ones SentenceTransformer(folder) gives, and `dimensions` their first n coordinates at unit
    length again."""
    from sentence_transformers import SentenceTransformer

    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    from helpers import synonym_pairs, write_rows

    train = write_rows(tmp_path / "train.csv", synonym_pairs(100, seed=0))
    data = DataConfig(train=str(train), validation=str(train), text_column="anchor",
                      text_pair_column="positive")  # fmt: skip
    finetune("sentence-embedding", words_model, data, tmp_path / "emb",
             FinetuneConfig(epochs=2, batch_size=16, learning_rate=1e-3, max_seq_length=16,
                            progress=False))  # fmt: skip
    texts = ["after coach", "the robot eats sushi", "a"]
    expected = SentenceTransformer(str(tmp_path / "emb"), device="cpu").encode(texts)
    with Server(tmp_path / "emb", "--precision", "fp32") as server:
        served = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        answer = served.embeddings.create(model="emb", input=texts)
        np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=2e-6)
        assert answer.model == "emb"
        short = served.embeddings.create(model="emb", input=texts, dimensions=8)
        first = expected[:, :8] / np.linalg.norm(expected[:, :8], axis=1, keepdims=True)
        np.testing.assert_allclose([d.embedding for d in short.data], first, atol=2e-6)
