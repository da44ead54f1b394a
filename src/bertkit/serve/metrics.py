"""The server's counters in Prometheus' text format (no client library needed for these few).

>>> m = Metrics()
>>> m.request("/predict", 200, 0.004, inputs=2)
>>> m.batch("/predict", inputs=2, seconds=0.003)
>>> text = m.render({"/predict": 0})
>>> 'bertkit_requests_total{endpoint="/predict",code="200"} 1' in text
True
>>> 'bertkit_request_duration_seconds_bucket{endpoint="/predict",le="0.005"} 1' in text
True
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out = [
            f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {n}'
            for bound, n in zip(self.buckets, self.counts, strict=True)
        ]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.6f}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class Metrics:
    """Requests by endpoint and status (499: the client went away before its answer), their
    latency, inputs, batches (size, time) and forward passes. Updated from the event loop and
    the inference thread, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.inputs: dict[str, int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = defaultdict(lambda: _Histogram(LATENCY_BUCKETS))
        self.batch_size: dict[str, _Histogram] = defaultdict(lambda: _Histogram(BATCH_BUCKETS))
        self.batch_seconds: dict[str, _Histogram] = defaultdict(lambda: _Histogram(LATENCY_BUCKETS))
        self.batch_wait: dict[str, _Histogram] = defaultdict(lambda: _Histogram(LATENCY_BUCKETS))
        self.forward_passes = 0
        self.trimmed = 0  # answers sent with Connection: close (connections.trims_idle_connections)

    def request(self, endpoint: str, code: int, seconds: float, inputs: int = 0) -> None:
        with self._lock:
            self.requests[endpoint, code] += 1
            self.inputs[endpoint] += inputs
            self.latency[endpoint].observe(seconds)

    def batch(self, endpoint: str, inputs: int, seconds: float, waited: float = 0.0) -> None:
        with self._lock:
            self.batch_size[endpoint].observe(inputs)
            self.batch_seconds[endpoint].observe(seconds)
            self.batch_wait[endpoint].observe(waited)

    def forward(self) -> None:
        with self._lock:
            self.forward_passes += 1

    def render(self, queue_depth: dict[str, int], ready: bool = True, *,
               cancelled: dict[str, int] | None = None, connections: int = 0) -> str:  # fmt: skip
        with self._lock:
            requests = [
                (f'endpoint="{e}",code="{c}"', n) for (e, c), n in sorted(self.requests.items())
            ]
            families: list[tuple[str, str, str, list[tuple[str, Any]]]] = [
                ("requests_total", "counter", "Requests answered, by endpoint and HTTP status.",
                 requests),
                ("inputs_total", "counter", "Inputs (texts, pairs, questions) answered.",
                 _by_endpoint(self.inputs)),
                ("request_duration_seconds", "histogram", "Time from request to response.",
                 _by_endpoint(self.latency)),
                ("batch_size", "histogram", "Inputs per model call (dynamic batching).",
                 _by_endpoint(self.batch_size)),
                ("batch_duration_seconds", "histogram", "Time of one batch on the model.",
                 _by_endpoint(self.batch_seconds)),
                ("batch_wait_seconds", "histogram",
                 "Time a batch's oldest input waited in the queue before the batch ran.",
                 _by_endpoint(self.batch_wait)),
                ("forward_passes_total", "counter", "Forward passes of the model.",
                 [("", self.forward_passes)]),
                ("queue_depth", "gauge", "Inputs waiting for the model, by endpoint.",
                 _by_endpoint(queue_depth)),
                ("cancelled_inputs_total", "counter",
                 "Inputs left uncomputed because their client went away while they waited.",
                 _by_endpoint(cancelled or {})),
                ("open_connections", "gauge", "HTTP connections open now.",
                 [("", connections)]),
                ("trimmed_connections_total", "counter",
                 "Connections closed after an answer: a co-located client holding more idle "
                 "keep-alive connections than it keeps busy.", [("", self.trimmed)]),
                ("ready", "gauge", "1 when the model is loaded and warm and not shutting down.",
                 [("", int(ready))]),
            ]  # fmt: skip
            out: list[str] = []
            for short, kind, help, series in families:
                name = f"bertkit_{short}"
                out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
                for labels, value in series:
                    if isinstance(value, _Histogram):
                        out += value.lines(name, labels)
                    else:
                        out.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
        return "\n".join(out) + "\n"


def _by_endpoint(values: dict) -> list[tuple[str, Any]]:
    return [(f'endpoint="{endpoint}"', value) for endpoint, value in sorted(values.items())]
