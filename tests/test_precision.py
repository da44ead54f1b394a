"""Precision chosen by the hardware (issue 27 §1): `auto` is bf16 autocast only where a CPU
runs bf16 natively (AMX-BF16, AVX512-BF16), fp32 elsewhere, and says why in log.jsonl and
results.json; an explicit bf16 without native support warns; fp16 on a CPU is refused. The
CPU flags are faked both ways (BERTKIT_CPU_FLAGS), so this holds on any machine."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from bertkit.cli import main
from bertkit.precision import cpu_flags, native_bf16, resolve_precision

from helpers import topic_rows

AVX2 = {"sse4_2", "avx", "avx2", "fma"}


@pytest.mark.parametrize(
    "flags, name, why",
    [
        (AVX2, "fp32", "no native bf16"),
        (AVX2 | {"avx512f", "avx512_bf16"}, "bf16", "AVX512-BF16"),
        (AVX2 | {"avx512f", "amx_tile", "amx_bf16", "avx512_bf16"}, "bf16", "AMX-BF16"),
    ],
)
def test_auto_takes_bf16_only_where_the_cpu_has_it(flags, name, why):
    chosen = resolve_precision("auto", "cpu", flags=flags)
    assert chosen.name == name and why in chosen.reason
    assert chosen.dtype is (None if name == "fp32" else __import__("torch").bfloat16)


def test_explicit_bf16_without_native_warns_and_fp16_is_refused(caplog):
    with caplog.at_level(logging.WARNING, logger="bertkit.precision"):
        chosen = resolve_precision("bf16", "cpu", flags=AVX2)
    assert chosen.name == "bf16" and "emulated" in chosen.reason
    assert "20x" in caplog.text and "--precision auto chooses fp32 here" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit.precision"):
        resolve_precision("bf16", "cpu", flags=AVX2 | {"avx512_bf16"})
    assert not caplog.text  # native: no warning
    with pytest.raises(ValueError, match="fp16 on a CPU: refused"):
        resolve_precision("fp16", "cpu", flags=AVX2)
    assert resolve_precision("fp32", "cpu", flags=AVX2 | {"amx_bf16"}).name == "fp32"


def test_the_flags_come_from_the_environment_where_set(monkeypatch):
    monkeypatch.setenv("BERTKIT_CPU_FLAGS", "avx2 amx_bf16")
    assert cpu_flags() == {"avx2", "amx_bf16"} and native_bf16() == "AMX-BF16"
    monkeypatch.setenv("BERTKIT_CPU_FLAGS", "avx2")
    assert native_bf16() is None


@pytest.mark.parametrize("flags, compute", [("avx2 avx512_bf16", "bf16"), ("avx2", "fp32")])
def test_a_run_says_what_auto_chose_and_why(flags, compute, words_model, tmp_path, monkeypatch,
                                            capsys):  # fmt: skip
    monkeypatch.setenv("BERTKIT_CPU_FLAGS", flags)
    with open(tmp_path / "train.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows([[r["headline"], r["topic"]] for r in topic_rows(24)])
    out = tmp_path / "run"
    train = str(tmp_path / "train.csv")
    argv = ["finetune", "text-classification", "--model", str(words_model), "--train", train,
            "--validation", train, "--epochs", "1", "--batch-size", "8", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["precision"]["compute"] == compute
    assert ("AVX512-BF16" if compute == "bf16" else "no native bf16") in results["precision"]["why"]
    [run] = [e for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())
             if e["split"] == "run"]  # fmt: skip
    assert run["compute"] == compute and run["step"] == 0
    assert f"precision: {results['precision']['why']}" in capsys.readouterr().err
    assert main([*argv[:-2], "--out", str(tmp_path / "r16"), "--precision", "fp16"]) == 2
    assert "fp16 on a CPU: refused" in capsys.readouterr().err


def test_usable_cpus_follow_the_affinity_and_the_cgroup_quota(tmp_path):
    """The CPUs a process may use: its affinity, capped by its cgroup's quota (a container's
    --cpus), v2 and v1 (fake cgroup files); an unlimited quota or none leaves the affinity."""
    import os

    from bertkit._device import Cpus, usable_cpus

    affinity = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(v2)) == Cpus(affinity, "affinity", "the CPUs of this process's affinity")
    (v2 / "cpu.max").write_text("50000 100000\n")  # half a CPU: one thread
    cpus = usable_cpus(str(v2))
    assert cpus.count == 1 and (affinity == 1 or (cpus.source, cpus.why) == (
        "quota", "the cgroup's CPU quota (50000 us each 100000 us)"))  # fmt: skip
    (v2 / "cpu.max").write_text(f"{100000 * (affinity + 8)} 100000\n")  # more than the affinity
    assert usable_cpus(str(v2)).count == affinity
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(str(tmp_path / "v1")).count == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert usable_cpus(str(tmp_path / "v1")).count == affinity
    assert usable_cpus(str(tmp_path / "none")).count == affinity


def _packed_pair(dtype, bias=True, size_in=64, size_out=96):
    """A PackedLinear and a plain copy of it."""
    import torch

    from bertkit.precision import PackedLinear

    torch.manual_seed(0)
    plain = torch.nn.Linear(size_in, size_out, bias=bias).to(dtype)
    packed = torch.nn.Linear(size_in, size_out, bias=bias).to(dtype)
    packed.load_state_dict(plain.state_dict())
    return PackedLinear.pack(packed), plain


@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_bf16_layer_computes_f_linear_s_products_to_the_bit(bias):
    import torch

    packed, plain = _packed_pair(torch.bfloat16, bias)
    assert list(packed.state_dict()) == list(plain.state_dict())  # a Linear's state, no more
    for rows in (1, 7, 300):
        x = torch.randn(rows, 64)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(packed(x), plain(x))  # autocast's input cast, then the product
            assert torch.equal(packed(x.bfloat16()), plain(x.bfloat16()))
    x = torch.randn(3, 5, 64)  # (B, S, H): the rows' shape back; within a rounding of F.linear
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, theirs = packed(x), plain(x)
    assert out.shape == (3, 5, 96) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), theirs.float(), rtol=2**-7, atol=2**-7)


def test_a_packed_layer_serves_inference_alone_and_a_plain_linear_everywhere_else():
    """The packed copy answers only where nothing differentiates or traces and the weight is
    the one it was packed from: a zeroed packed copy shows which ran."""
    import torch

    packed, plain = _packed_pair(torch.float32)
    packed.packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(packed.weight), None)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), packed.bias.expand(4, -1))  # the packed copy ran
    with torch.no_grad():
        torch.testing.assert_close(packed(x), packed.bias.expand(4, -1))
    torch.testing.assert_close(packed(x), plain(x))  # a gradient wanted: the weight
    traced = torch.jit.trace(packed, x, check_trace=False)  # what an ONNX export runs
    with torch.inference_mode():
        torch.testing.assert_close(traced(x), plain(x))
        with torch.no_grad():
            packed.weight.mul_(2)  # changed after packing: the packed copy is stale
        torch.testing.assert_close(packed(x), x @ (2 * plain.weight).T + plain.bias)
        assert packed.activated(x, "gelu") is None  # and the caller applies its own


@pytest.mark.parametrize("name", sorted(__import__("bertkit.precision").precision
                                        .ONEDNN_ACTIVATIONS))  # fmt: skip
def test_an_activation_inside_the_product_is_the_one_named(name):
    """Each name's post-op is the activation `core.model.activation` gives: in fp32 within
    2e-6 (the erf GELU and the tanh one differ by up to 5e-4, so each is told from the other),
    in bf16 within a rounding."""
    import torch

    from bertkit.core.model import activation
    from bertkit.precision import activated

    act = activation(name)
    for dtype, tolerance in ((torch.float32, 2e-6), (torch.bfloat16, 2**-7)):
        packed, plain = _packed_pair(dtype)
        x = torch.randn(2, 9, 64) * 2
        with torch.inference_mode():
            fused = packed.activated(x.to(dtype), name)
            assert fused is not None and fused.shape == (2, 9, 96)
            exact = act(x.to(dtype).double() @ plain.weight.double().T + plain.bias.double())
            torch.testing.assert_close(fused.double(), exact, rtol=tolerance, atol=tolerance)
            torch.testing.assert_close(
                activated(plain, x.to(dtype), name, act), act(plain(x.to(dtype)))
            )
    tanh_gelu = activation("gelu_new")(torch.linspace(-4, 4, 801, dtype=torch.float64))
    assert (tanh_gelu - activation("gelu")(torch.linspace(-4, 4, 801, dtype=torch.float64))
            ).abs().max() > 1e-4  # fmt: skip


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_loaded_model_runs_packed_layers_and_keeps_its_state(mlm_dir, precision):
    """`load` packs every linear layer of an encoder opened on the CPU (not a tied decoder):
    its state dict as the folder's, its masked-LM logits as the same model unpacked gives."""
    import torch

    from bertkit.inference.loader import load
    from bertkit.precision import PackedLinear

    loaded = load(mlm_dir, device="cpu", precision=precision)
    net = loaded.model
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in linears if isinstance(m, PackedLinear)]
    tied = [m for m in linears if m.weight is net.bert.embeddings.word_embeddings.weight]
    assert tied and len(packed) == len(linears) - len(tied) > 6
    assert not any(isinstance(m, PackedLinear) for m in tied)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    assert {m.weight.dtype for m in packed} == {dtype} == {m.packed.dtype for m in packed}
    plain = type(net).from_pretrained(mlm_dir).eval()
    words = plain.bert.embeddings.word_embeddings.weight
    for m in plain.modules():
        if isinstance(m, torch.nn.Linear) and m.weight is not words:
            m.to(dtype)
    assert set(net.state_dict()) == set(plain.state_dict())
    ids = torch.randint(5, 100, (3, 11))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                enabled=dtype == torch.bfloat16):  # fmt: skip
        ours, theirs = (m(input_ids=ids).mlm_logits for m in (net, plain))
    tolerance = 1e-4 if precision == "fp32" else 0.1  # bf16: the GELU's rounding moves
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=tolerance)
