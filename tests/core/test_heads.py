"""The task heads and their losses (bertkit.core.heads), against transformers where it has them."""

import pytest
import torch

from bertkit.core.heads import (
    MODEL_CLASSES,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from helpers import close, pair, tiny_bert_config


@torch.no_grad()
def test_pretraining_heads_and_losses_match_hf(tiny_config, tiny_batch):
    ours, hf = pair("BertForPreTraining", tiny_config)
    labels = torch.full_like(tiny_batch["input_ids"], -100)
    labels[0, 2], labels[1, 5], labels[2, 1] = 7, 9, 11
    nsp = torch.tensor([0, 1, 0])
    a = ours(**tiny_batch, labels=labels, next_sentence_label=nsp)
    b = hf(**tiny_batch, labels=labels, next_sentence_label=nsp)
    close(a.mlm_logits, b.prediction_logits)
    close(a.nsp_logits, b.seq_relationship_logits)
    close(a.loss, b.loss)
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight


@torch.no_grad()
def test_masked_positions_compute_logits_only_there(tiny_config, tiny_batch):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    full = model(**tiny_batch)
    positions = torch.tensor([[2, 4, 0], [5, 1, 0], [1, 3, 0]])  # last slot is padding
    labels = torch.tensor([[7, 8, -100], [9, 10, -100], [11, 12, -100]])
    sparse = model(**tiny_batch, masked_positions=positions, labels=labels)
    assert sparse.mlm_logits.shape == (3, 3, tiny_config.vocab_size)
    expected = torch.stack([full.mlm_logits[i, positions[i]] for i in range(3)])
    close(sparse.mlm_logits, expected)
    # the same loss as labels on the full sequence
    dense_labels = torch.full_like(tiny_batch["input_ids"], -100)
    for i in range(3):
        dense_labels[i, positions[i, :2]] = labels[i, :2]
    close(sparse.mlm_loss, model(**tiny_batch, labels=dense_labels).mlm_loss)
    # no labelled position: a zero loss, not NaN
    assert (
        model(**tiny_batch, labels=torch.full_like(labels, -100), masked_positions=positions).loss
        == 0
    )


@torch.no_grad()
def test_masked_lm_matches_hf(tiny_config, tiny_batch):
    ours, hf = pair("BertForMaskedLM", tiny_config)
    labels = torch.where(
        torch.rand(tiny_batch["input_ids"].shape) < 0.3, tiny_batch["input_ids"], -100
    )
    a = ours(**tiny_batch, labels=labels)
    b = hf(**tiny_batch, labels=labels)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


@pytest.mark.parametrize(
    "labels,problem",
    [(3, "single_label_classification"), (1, "regression"), (4, "multi_label_classification")],
)
@torch.no_grad()
def test_sequence_classification_matches_hf(tiny_config, tiny_batch, labels, problem):
    config = tiny_config.with_labels(labels)
    config.problem_type = problem
    ours, hf = pair("BertForSequenceClassification", config)
    if problem == "single_label_classification":
        target = torch.tensor([0, 2, 1])
    elif problem == "regression":
        target = torch.tensor([0.5, 3.2, 4.9])
    else:
        target = torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]])
    a = ours(**tiny_batch, labels=target)
    b = hf(**tiny_batch, labels=target)
    assert a.logits.shape == (3, labels)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


@torch.no_grad()
def test_token_classification_matches_hf(tiny_config, tiny_batch):
    config = tiny_config.with_labels(9)
    ours, hf = pair("BertForTokenClassification", config)
    labels = torch.randint(0, 9, tiny_batch["input_ids"].shape)
    labels[tiny_batch["attention_mask"] == 0] = -100
    a = ours(**tiny_batch, labels=labels)
    b = hf(**tiny_batch, labels=labels)
    assert a.logits.shape == (3, 11, 9)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


@torch.no_grad()
def test_question_answering_matches_hf(tiny_config, tiny_batch):
    ours, hf = pair("BertForQuestionAnswering", tiny_config)
    start, end = torch.tensor([1, 3, 40]), torch.tensor([2, 5, 40])  # 40: outside, ignored
    a = ours(**tiny_batch, start_positions=start, end_positions=end)
    b = hf(**tiny_batch, start_positions=start, end_positions=end)
    close(a.start_logits, b.start_logits)
    close(a.end_logits, b.end_logits)
    # Our span loss leaves padded positions out of the softmax (transformers counts them):
    # the same loss on transformers' logits with padding masked, by hand ...
    pad = tiny_batch["attention_mask"] == 0
    ce = torch.nn.CrossEntropyLoss(ignore_index=11)
    masked = (
        ce(b.start_logits.masked_fill(pad, -1e4), start.clamp(0, 11))
        + ce(b.end_logits.masked_fill(pad, -1e4), end.clamp(0, 11))
    ) / 2
    close(a.loss, masked)
    assert pad.any() and abs(float(a.loss - b.loss)) > 1e-3  # (the batch has padding)
    # ... and transformers' own loss where nothing is padded.
    full = {k: v[:1, :9] for k, v in tiny_batch.items()}
    assert bool(full["attention_mask"].all())
    a = ours(**full, start_positions=start[:1], end_positions=end[:1])
    b = hf(**full, start_positions=start[:1], end_positions=end[:1])
    close(a.loss, b.loss)


@torch.no_grad()
def test_multiple_choice_matches_hf(tiny_config):
    ours, hf = pair("BertForMultipleChoice", tiny_config)
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "input_ids": torch.randint(5, 99, (2, 4, 9), generator=generator),
        "token_type_ids": torch.randint(0, 2, (2, 4, 9), generator=generator),
        "attention_mask": torch.ones(2, 4, 9, dtype=torch.long),
    }
    inputs["attention_mask"][1, :, 7:] = 0
    labels = torch.tensor([3, 1])
    a = ours(**inputs, labels=labels)
    b = hf(**inputs, labels=labels)
    assert a.logits.shape == (2, 4)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


# ----------------------------------------------------------------------------- shapes & sizes
@pytest.mark.parametrize("cls", [BertModel, *MODEL_CLASSES.values()], ids=lambda cls: cls.__name__)
def test_every_head_trains_a_step(cls, tiny_config, tiny_batch):
    torch.manual_seed(0)
    model = cls(tiny_config).train()
    if cls is BertForMultipleChoice:  # two choices a row
        tiny_batch = {k: v.unsqueeze(1).expand(-1, 2, -1) for k, v in tiny_batch.items()}
    out = model(**tiny_batch)
    assert not any(p.grad is not None for p in model.parameters())
    outputs = [out] if isinstance(out, torch.Tensor) else vars(out).values()
    sum(o.float().pow(2).mean() for o in outputs if isinstance(o, torch.Tensor)).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad), cls


@torch.no_grad()
def test_heads_skip_padding_only_where_it_cannot_be_seen(tiny_config, tiny_batch, monkeypatch):
    seen = []
    original = BertModel.forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("unpad", False))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BertModel, "forward", spy)
    positions = torch.tensor([[1, 2], [1, 3], [1, 2]])
    cases = [
        (BertForSequenceClassification, {}, True),
        (BertForSequenceClassification, {"output_hidden_states": True}, False),
        (BertForPreTraining, {"masked_positions": positions}, True),
        (BertForPreTraining, {}, False),  # logits at every position are returned
        (BertForTokenClassification, {}, False),
        (BertForQuestionAnswering, {}, False),
    ]
    for cls, extra, expected in cases:
        torch.manual_seed(0)
        model = cls(tiny_config).eval()
        seen.clear()
        model(**tiny_batch, **extra)
        assert seen == [expected], (cls, extra)
    model = BertForTokenClassification(tiny_config).train()
    seen.clear()
    model(**tiny_batch)
    assert seen == [True]  # training: the loss ignores padding


def test_fused_vocab_cross_entropy_equals_the_plain_softmax_and_its_gradients():
    from bertkit.core.losses import fused_vocab_cross_entropy

    generator = torch.Generator().manual_seed(0)
    states = torch.randn(150, 16, generator=generator, requires_grad=True)
    weight = torch.randn(300, 16, generator=generator, requires_grad=True)
    bias = torch.randn(300, generator=generator, requires_grad=True)
    labels = torch.randint(0, 300, (150,), generator=generator)
    logits = torch.nn.functional.linear(states, weight, bias)
    plain = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    expected = torch.autograd.grad(2.5 * plain, (states, weight, bias))
    total, correct = fused_vocab_cross_entropy(states, weight, bias, labels, chunk=64)
    got = torch.autograd.grad(2.5 * total, (states, weight, bias))
    torch.testing.assert_close(total, plain.detach(), rtol=1e-6, atol=1e-4)
    assert int(correct) == int((logits.argmax(-1) == labels).sum())
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # evaluation: the same figures, no gradient work
        again, hits = fused_vocab_cross_entropy(states, weight, bias, labels)
    assert torch.allclose(again, total.detach()) and int(hits) == int(correct)


def test_fused_vocab_cross_entropy_under_autocast_is_autocast_s_arithmetic():
    """Under CPU bf16 autocast the fused loop gives what autocast's linear + fp32 cross-entropy
    give (bf16 products, fp32 softmax), gradients included; fp32 states under autocast (what
    CUDA's layer norm hands over) once reached the fp32 loop, whose products came out bf16
    into fp32 buffers: "Expected out tensor to have dtype BFloat16" at the first LTR step on an
    H100. Under CUDA autocast it is the plain path."""
    from bertkit.core.losses import fused_vocab_cross_entropy

    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(90, 16, generator=generator, requires_grad=True)
    bias = torch.randn(90, generator=generator, requires_grad=True)
    labels = torch.randint(0, 90, (70,), generator=generator)
    for dtype in (torch.float32, torch.bfloat16):
        states = torch.randn(70, 16, generator=generator).to(dtype).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = torch.nn.functional.linear(states, weight, bias).float()
            plain = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
            total, correct = fused_vocab_cross_entropy(states, weight, bias, labels, chunk=32)
        assert total.dtype == torch.float32
        torch.testing.assert_close(total, plain, rtol=1e-5, atol=1e-4)
        assert int(correct) == int((logits.argmax(-1) == labels).sum())
        expected = torch.autograd.grad(3.0 * plain, (states, weight, bias))
        got = torch.autograd.grad(3.0 * total, (states, weight, bias))
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_fused_vocab_cross_entropy_makes_the_bf16_weight_gradient_one_product_a_group(
    monkeypatch,
):
    """Under bf16 the weight's gradient is one product over a group of chunks (a bf16 (V, H)
    product added into fp32 converts the whole matrix: once a group, not once a chunk). Within a
    group it is autocast's own product to fp32's rounding; across groups, the groups' products
    summed, whatever the last group's size."""
    import itertools

    from bertkit.core import losses

    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(90, 16, generator=generator, requires_grad=True)
    bias = torch.zeros(90, requires_grad=True)
    states = torch.randn(150, 16, generator=generator).bfloat16().requires_grad_()
    labels = torch.randint(0, 90, (150,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(states, weight, bias).float()
        plain = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    [autocast] = torch.autograd.grad(plain, (weight,))
    probabilities = torch.softmax(logits, -1)
    probabilities[torch.arange(150), labels] -= 1.0
    softmax_grad = probabilities.bfloat16()
    for group, bounds in ((1024, [0, 150]), (64, [0, 64, 128, 150])):
        monkeypatch.setattr(losses, "GRADIENT_GROUP_ROWS", group)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            total, _ = losses.fused_vocab_cross_entropy(states, weight, bias, labels, chunk=32)
        [got] = torch.autograd.grad(total, (weight,))
        by_hand = sum(
            (softmax_grad[a:b].t() @ states[a:b]).float() for a, b in itertools.pairwise(bounds)
        )
        torch.testing.assert_close(got, by_hand, rtol=1e-6, atol=1e-6)  # (bf16's step: 4e-3)
        if group == 1024:  # one group: autocast's one product
            torch.testing.assert_close(got, autocast, rtol=1e-5, atol=1e-5)


def test_fused_mlm_step_equals_the_logits_path():
    """A pre-training step through `fused_mlm=True` gives the loss and every gradient of the
    plain path (logits, F.cross_entropy)."""

    config = tiny_bert_config(
        97,
        num_attention_heads=2,
        intermediate_size=48,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 97, (4, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0
    positions = torch.randint(1, 9, (4, 3), generator=generator)
    labels = torch.randint(5, 97, (4, 3), generator=generator)
    labels[1, 2] = -100
    for cls in (BertForPreTraining, BertForMaskedLM):
        torch.manual_seed(0)
        model = cls(config).train()
        plain = model(ids, attention_mask=mask, masked_positions=positions, labels=labels)
        plain.loss.backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        fused = model(
            ids, attention_mask=mask, masked_positions=positions, labels=labels, fused_mlm=True
        )
        fused.loss.backward()
        torch.testing.assert_close(fused.loss, plain.loss, rtol=1e-6, atol=1e-6)
        logits = plain.mlm_logits if cls is BertForPreTraining else plain.logits
        valid = labels != -100
        assert int(fused.mlm_correct) == int(((logits.argmax(-1) == labels) & valid).sum())
        for name, parameter in model.named_parameters():
            if name in expected:
                torch.testing.assert_close(parameter.grad, expected[name], rtol=1e-4, atol=1e-6)


def test_each_loss_is_one_definition_the_mean_is_the_sum_over_its_units():
    from bertkit.core.losses import sequence_loss, span_loss, token_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 5, generator=g)
    labels = torch.randint(0, 5, (4, 7), generator=g)
    labels[0, 3:] = -100
    units = (labels != -100).sum()
    close(token_loss(logits, labels, reduction="sum") / units, token_loss(logits, labels))
    assert float(token_loss(logits, torch.full_like(labels, -100))) == 0.0  # not NaN
    rows = torch.randn(4, 3, generator=g)
    classes = torch.tensor([0, 2, 1, 1])
    problem = "single_label_classification"
    close(
        sequence_loss(rows, classes, problem, reduction="sum") / 4,
        sequence_loss(rows, classes, problem),
    )
    close(
        sequence_loss(rows[:, :1], rows[:, 1], "regression"),
        ((rows[:, 0] - rows[:, 1]) ** 2).mean(),
    )
    start, end = torch.tensor([1, 2, 0, 6]), torch.tensor([2, 5, 0, 6])
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[2, 4:] = 0
    args = (logits[..., 0], logits[..., 1], start, end, mask)
    close(span_loss(*args, reduction="sum") / 4, span_loss(*args))
    # padding is out of the softmax: changing a padded logit changes nothing
    moved = logits[..., 0].clone()
    moved[2, 5] = 50.0
    close(span_loss(moved, *args[1:]), span_loss(*args))
    with pytest.raises(ValueError, match="reduction"):
        token_loss(logits, labels, reduction="none")


def _outputs(out):
    return [t for t in vars(out).values() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize(
    "head, decoder",
    [(BertForPreTraining, False), (BertForPreTraining, True), (BertForMaskedLM, False),
     (BertForSequenceClassification, False), (BertForTokenClassification, False),
     (BertForQuestionAnswering, False), (BertForMultipleChoice, False)],
)  # fmt: skip
def test_host_layouts_are_the_forwards_own(tiny_config, tiny_batch, head, decoder, autocast):
    """What the training loop works out on the host (`host_layouts`, then `layouts=`) is what
    the forward would work out on the device: the same outputs, dropout on, in fp32 and under
    CPU bf16 autocast (rows rounded up to 64); a padded-only (ONNX) model ignores reads."""
    tiny_config.is_decoder = decoder
    batch = dict(tiny_batch)
    if head is BertForMultipleChoice:
        batch = {k: torch.stack([v, v.roll(1, 0)], 1) for k, v in batch.items()}  # 2 choices
    if head in (BertForPreTraining, BertForMaskedLM):
        batch["masked_positions"] = torch.tensor([[2, 4, 0], [5, 1, 0], [1, 3, 0]])
    for padded_only in (False, True):
        torch.manual_seed(0)
        model = head(tiny_config).train()
        model.padded_only = model.bert.padded_only = padded_only
        runs = []
        for planned in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                extra = {"layouts": model.host_layouts(batch, "cpu")} if planned else {}
                torch.manual_seed(1)
                runs.append(_outputs(model(**batch, **extra)))
        assert runs[1] and all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    # a batch without padding: attention takes no mask (left to right, the causal one)
    model.padded_only = model.bert.padded_only = False
    full = {k: v[:1, :1] if head is BertForMultipleChoice else v[:1] for k, v in batch.items()}
    assert model.host_layouts(full, "cpu").masked == decoder
    assert model.host_layouts(batch, "cpu").masked


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize(
    "head", [BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering]
)
def test_one_layout_structure_answers_as_the_default(tiny_config, tiny_batch, head, autocast):
    """What a compiled model runs (`one_layout_structure`: rows always gathered, the mask always
    passed, rows rounding N up to 64 under CPU autocast placed past the grid) gives the default
    path's outputs, with and without padding, and every batch's layouts have one structure."""
    torch.manual_seed(0)
    model = head(tiny_config).eval()
    full = {k: v[:1, :5] for k, v in tiny_batch.items()}  # no padding
    assert bool(full["attention_mask"].all()) and not bool(tiny_batch["attention_mask"].all())
    for batch in (tiny_batch, full):
        runs, shapes = [], []
        for one in (False, True):
            model.bert.one_layout_structure = one
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                layouts = model.host_layouts(batch, "cpu")
                runs.append(_outputs(model(**batch, layouts=layouts)))
            rows, read = layouts.rows, layouts.read
            shapes.append((rows.index is None, rows.added is None, rows.spare, layouts.masked,
                           read is None or read[1].spare))  # fmt: skip
        for a, b in zip(*runs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if not autocast else 1e-2)
        # a classifier reads [CLS] alone: unpadded; per-position heads run the padded grid
        unpadded = (False, True, 63 if autocast else 0, True, 0)
        one = unpadded if head is BertForSequenceClassification else (True, True, 0, True, True)
        assert shapes[1] == one, shapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # fused loop, plain path
def test_the_vocabulary_softmax_skips_unlabelled_rows_without_selecting_them(dtype):
    """Rows labelled IGNORE_INDEX (the padding slots of masked_positions) add nothing to the
    sum, the hits or the gradients, on the fused loop (CPU) and on the plain path (CUDA's, which
    keeps every row so that the GPU need not report how many are labelled)."""
    from bertkit.core.losses import IGNORE_INDEX, fused_vocab_cross_entropy

    generator = torch.Generator().manual_seed(3)
    states = torch.randn(40, 16, generator=generator, dtype=dtype, requires_grad=True)
    weight = torch.randn(50, 16, generator=generator, dtype=dtype, requires_grad=True)
    bias = torch.randn(50, generator=generator, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 50, (40,), generator=generator)
    labels[::3] = IGNORE_INDEX
    keep = labels != IGNORE_INDEX
    logits = torch.nn.functional.linear(states[keep], weight, bias)
    plain = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum")
    expected = torch.autograd.grad(plain, (states, weight, bias))
    total, correct = fused_vocab_cross_entropy(states, weight, bias, labels)
    torch.testing.assert_close(total.double(), plain.detach().double(), rtol=1e-6, atol=1e-4)
    assert int(correct) == int((logits.argmax(-1) == labels[keep]).sum())
    for a, b in zip(torch.autograd.grad(total, (states, weight, bias)), expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
