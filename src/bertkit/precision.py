"""The compute precision of a run, chosen by the hardware: `--precision auto` takes bf16
autocast where the device runs bf16 natively (a GPU that supports it; a CPU with AMX-BF16 or
AVX512-BF16) and fp32 elsewhere, and says why. An explicit bf16 on a CPU without native bf16
runs (it is emulated) with a warning: reported about 20x slower than fp32 on an AVX2-only AMD
EPYC (25 s a step against 1.26 s). fp16 on a CPU is refused (no CPU kernels are faster for it, and its loss scaling is for
GPUs).

The CPU's flags come from /proc/cpuinfo, or from `BERTKIT_CPU_FLAGS` (space-separated) where
set: for a container that misreports them, or to ask what a run would choose elsewhere (the
tests pin it, so what they check does not depend on the machine that runs them).

>>> resolve_precision("auto", "cpu", flags={"avx2"}).name
'fp32'
>>> resolve_precision("auto", "cpu", flags={"avx2", "avx512_bf16"}).reason
'bf16 autocast: this CPU has AVX512-BF16'
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertkit.settings import PRECISIONS

log = logging.getLogger(__name__)

# the CPU flags that make bf16 matrix products native, best first, with their names
NATIVE_BF16 = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


@dataclass(frozen=True)
class Precision:
    name: str  # fp32, bf16 or fp16
    reason: str  # why, in words a log line can carry

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None: no autocast, fp32)."""
        return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    def as_dict(self) -> dict[str, str]:
        return {"compute": self.name, "why": self.reason}


@functools.lru_cache(maxsize=1)
def _cpuinfo_flags() -> frozenset[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return frozenset()
    for line in cpuinfo.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, ARM
            return frozenset(value.split())
    return frozenset()


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (`BERTKIT_CPU_FLAGS` where set)."""
    given = os.environ.get("BERTKIT_CPU_FLAGS")
    if given is not None:
        return frozenset(given.split())
    return _cpuinfo_flags()


def native_bf16(flags: set[str] | frozenset[str] | None = None) -> str | None:
    """The name of what makes bf16 native on this CPU (AMX-BF16, AVX512-BF16), or None."""
    flags = cpu_flags() if flags is None else flags
    return next((name for flag, name in NATIVE_BF16.items() if flag in flags), None)


def resolve_precision(
    requested: str,
    device: str | torch.device,
    *,
    backend: str = "torch",
    flags: set[str] | frozenset[str] | None = None,
) -> Precision:
    """What `requested` (auto, fp32, bf16, fp16) means on `device`: the precision and why.
    Raises ValueError for fp16 on a CPU, and for anything but auto/fp32 on the onnx backend
    (an export runs as it was exported); warns for bf16 on a CPU without native bf16."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if backend == "onnx":
        if requested not in ("auto", "fp32"):
            raise ValueError(f"precision {requested}: an ONNX export runs as it was exported")
        return Precision("fp32", "ONNX Runtime runs the export as it was exported")
    kind = torch.device(device).type
    if kind == "cuda":
        if requested != "auto":
            return Precision(requested, f"{requested}: asked for")
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", "bf16 autocast: this GPU supports it")
        return Precision("fp32", "fp32: this GPU has no bf16")
    native = native_bf16(flags)
    if requested == "fp16":
        raise ValueError(
            "fp16 on a CPU: refused (CPU kernels are not faster in fp16 and its loss scaling "
            "is for GPUs); use --precision bf16"
            + (f" (native here: {native})" if native else " on a CPU with AVX512-BF16 or AMX")
            + " or fp32"
        )
    if requested == "auto":
        if native:
            return Precision("bf16", f"bf16 autocast: this CPU has {native}")
        return Precision("fp32", "fp32: this CPU has no native bf16 (AVX512-BF16 or AMX-BF16)")
    if requested == "bf16" and not native:
        log.warning(
            "--precision bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX-BF16): it is "
            "emulated, expect it many times slower than fp32 (about 20x reported on an "
            "AVX2-only AMD EPYC); --precision auto chooses fp32 here"
        )
        return Precision(
            "bf16", "bf16: asked for; emulated on this CPU (no AVX512-BF16 or AMX-BF16)"
        )
    return Precision(
        requested, f"{requested}: asked for" + (f" ({native} on this CPU)" if native else "")
    )


def cast_for_inference(model: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """The linear layers made ready for inference. Under bf16 or fp16 autocast, their weights
    in the compute dtype once, instead of autocast casting them on every call (autocast keeps
    no cast between calls when nothing is being trained: one short sentence through a served
    all-MiniLM-L6-v2 took 19 ms with them and 8.5 ms without on a Xeon with AMX, 2 threads).
    What runs is the same: autocast rounds these weights to the same dtype, and the layers it
    keeps in fp32 (LayerNorm, softmax, the embeddings) keep their fp32 weights. A layer whose
    weight is also an embedding's (a tied MLM decoder) is left as it is. On the CPU, in fp32
    or bf16, each layer is then a `PackedLinear` (its weight also in oneDNN's layout). For
    inference only (no master weights are kept)."""
    dtype = precision.dtype
    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or id(module.weight) in tied:
            continue
        if dtype is not None:
            module.to(dtype)
        if dtype in (None, torch.bfloat16) and module.weight.device.type == "cpu" and _can_pack():
            PackedLinear.pack(module)
    return model


@functools.cache
def _can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_reorder_linear_weight")  # fmt: skip


# the activations `core.model.activation` names that oneDNN applies inside its product (a
# post-op on the fp32 sums, before they are rounded): its attribute and algorithm for each
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"), **dict.fromkeys(("gelu_new", "gelu_pytorch_tanh", "gelu_fast"),
                                              ("gelu", "tanh")),
    "relu": ("relu", ""), "silu": ("swish", ""), "swish": ("swish", ""), "tanh": ("tanh", ""),
}  # fmt: skip


class PackedLinear(torch.nn.Linear):
    """A linear layer for CPU inference (fp32 or bf16) whose weight is also held in oneDNN's
    blocked layout (`packed`, as inductor's freezing holds it), so no call reorders it or goes
    to another library's kernel. In bf16 the products are `F.linear`'s on rows to the bit; in fp32
    their sums come in another order than MKL's (all-MiniLM-L6-v2's layers on unit-scale inputs:
    within 1.1e-6 of each layer's largest output, 1.3e-5 at most). Timed alone on
    an AMD EPYC Zen 4, 2 threads, 384 into 1,536: bf16 0.73, 0.93, 0.95 and 0.84 of
    `F.linear`'s time at 32, 200, 640 and 2,000 rows; fp32 0.83 at 640 rows, 0.56 at 10; one
    row of 384 into 384 in fp32 costs twice as long (37 against 18 us: oneDNN's fixed cost).
    all-MiniLM-L6-v2's `Embedder` on SST-2 ran 1.08-1.13x faster in bf16 and 1.18x in fp32
    there (docs/results/embeddings); on a Zen 5 the bf16 weight packed by hand had gained
    nothing. `activated` puts the activation after the product into the same call. The packed
    copy serves where nothing traces or differentiates: no gradient, not compiling or tracing
    (ONNX export), the input in the weight's dtype or autocast to it, the weight unchanged since
    it was packed; elsewhere the layer is a plain `nn.Linear` on `weight` (its state dict too).
    It costs one more copy of the weight."""

    packed: torch.Tensor
    packed_version: int

    @classmethod
    def pack(cls, layer: torch.nn.Linear) -> PackedLinear:
        """`layer` itself, turned into a PackedLinear of its current weight."""
        layer.__class__ = cls
        packed: Any = layer
        packed.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None)
        packed.packed_version = layer.weight._version
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._runs(x):
            return super().forward(x)
        return self._product(x, "none", "")

    def activated(self, x: torch.Tensor, name: str) -> torch.Tensor | None:
        """act(x W^T + b) in one oneDNN call, for an activation `ONEDNN_ACTIVATIONS` names;
        None where it would not run so (the caller then applies its own)."""
        if name not in ONEDNN_ACTIVATIONS or not self._runs(x):
            return None
        return self._product(x, *ONEDNN_ACTIVATIONS[name])

    def _runs(self, x: torch.Tensor) -> bool:
        # (asked on every call: the cheapest questions first)
        if torch.is_grad_enabled() or x.device.type != "cpu":
            return False
        weight = self.weight
        if weight._version != self.packed_version or weight.dtype != self.packed.dtype:
            return False  # changed since it was packed
        if x.dtype != weight.dtype and not (
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == weight.dtype
        ):
            return False
        return not torch.jit.is_tracing() and not torch.compiler.is_compiling()

    def _product(self, x: torch.Tensor, attr: str, algorithm: str) -> torch.Tensor:
        rows = x.to(self.weight.dtype).reshape(-1, x.shape[-1])
        scalars: list[Any] = [None] if attr == "gelu" else []
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, attr, scalars,
                                                 algorithm)  # fmt: skip
        return out.view(*x.shape[:-1], out.shape[-1])


def activated(layer: torch.nn.Module, x: torch.Tensor, name: str, act: Any) -> torch.Tensor:
    """act(layer(x)), `act` the activation named `name`: in one call where `layer` is packed
    and runs so (`PackedLinear.activated`), else the two."""
    if isinstance(layer, PackedLinear):
        fused = layer.activated(x, name)
        if fused is not None:
            return fused
    return act(layer(x))


def inference_compile(choice: str, backend: str) -> bool:
    """Whether predict or serve compiles its model (`--compile off|on`): a clear error for any
    other value, and for `on` with a backend other than torch, before anything is loaded."""
    if choice not in ("off", "on"):
        raise ValueError(f"compile must be off or on, not {choice!r}")
    if choice == "on" and backend != "torch":
        raise ValueError("--compile on compiles the torch backend; not with --backend onnx")
    return choice == "on"


def compile_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """`model` compiled for inference (`--compile on` of predict and serve): inductor with
    every size symbolic from the first call (`dynamic=True`: unpadded batches change their
    token count from call to call, and one graph takes them all) and the weights frozen as
    constants, and the casts, LayerNorms and activations between the matrix products fused.
    Give the forward its layouts computed on the host (`_Head.host_layouts`,
    `BertModel.layouts`): counting the real tokens inside it would break the graph; every
    batch's layouts then have one structure (`BertModel.one_layout_structure`). A batch of
    one is compiled for once more (its size is special to the compiler); the server warms
    both at start-up. For inference only: the weights are read once, when it first
    compiles."""
    for module in model.modules():
        if hasattr(module, "one_layout_structure"):  # every BertModel within
            setattr(module, "one_layout_structure", True)  # noqa: B010
    compiled: Any = torch.compile(model, dynamic=True, options={"freezing": True})
    return compiled  # an OptimizedModule: a Module delegating to `model`
