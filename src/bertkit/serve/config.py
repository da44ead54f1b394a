"""The settings of `bertkit serve` (its flags are built from these fields)."""

from __future__ import annotations

from dataclasses import dataclass

from bertkit.settings import (
    RuntimeConfig,
    Settings,
    flat_names,
    nested,
    quantize_setting,
    setting,
)
from bertkit.tasks.saved import HeadConfig


@flat_names
@dataclass
class ServeConfig(Settings):
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = setting(8080, "port to listen on", check="non-negative")
    runtime: RuntimeConfig = nested(
        RuntimeConfig,
        helps={"backend": "onnx: ONNX Runtime (a checkpoint is exported at start-up)"},
    )
    quantize: str | None = quantize_setting("int8: dynamic int8 weights (with --backend onnx)")
    max_batch_size: int = setting(32, "most inputs in one model call", check="positive")
    max_wait_ms: float = setting(
        0.0,
        "how long a batch may wait for more inputs when the model is free (0: run at once; "
        "inputs arriving while a batch runs make the next one)",
        check="non-negative",
    )
    max_queue: int = setting(1024, "most inputs waiting; beyond it 503 with Retry-After",
                             check="positive")  # fmt: skip
    max_inputs: int = setting(256, "most inputs in one request (413 beyond)", check="positive")
    max_chars: int = setting(20_000, "longest text in characters (413 beyond)", check="positive")
    max_connections: int = setting(
        1000,
        "most open connections per worker; beyond it the longest-idle one is closed (raised "
        "towards the process's open-file limit, or lowered to fit it)",
        check="positive",
    )
    keep_idle_connections: bool = setting(
        False,
        "never close a keep-alive connection after an answer (default: closed while another "
        "process keeps this machine's CPUs busy and more than two connections idle: a "
        "co-located client's pool, which then costs it far less)",
    )
    header_timeout: float = setting(
        10.0, "seconds a connection has for each request's headers (then closed)",
        check="positive",
    )  # fmt: skip
    read_timeout: float = setting(
        30.0, "seconds a request has to send its body (then 408)", check="positive"
    )
    workers: int = setting(1, "server processes, each with its own copy of the model",
                           check="positive")  # fmt: skip
    threads: int | None = setting(
        None,
        "torch threads per worker (default: the CPUs this process may use, by its affinity and "
        "cgroup quota, shared among the workers; one torch worker then computes each batch "
        "with those other processes leave free)",
        check="positive",
    )
    api_key: str | None = setting(
        None,
        "require Authorization: Bearer KEY on every route but /health (default: the "
        "BERTKIT_API_KEY environment variable; unset: open, as on localhost)",
    )
    heads: HeadConfig = nested(HeadConfig)
    served_model_name: str | None = setting(
        None,
        "the model's name in /v1/models and the OpenAI-style answers (default: a Hub name as "
        "given, else the folder's name)",
    )
