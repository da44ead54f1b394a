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
