"""The HTTP API (FastAPI on uvicorn, the `bertkit[serve]` extra) over a `ServedModel`.

    bertkit serve runs/sst2 --port 8080
    curl -s localhost:8080/predict -H 'content-type: application/json' \\
         -d '{"inputs": ["a gripping film", "a dull one"]}'

Routes: POST /predict, /embed, /v1/embeddings (OpenAI's shape), /embed_sparse (SPLADE), /rerank (a cross-encoder,
text-embeddings-inference's shape), /v1/rerank (Cohere's and Jina's), /similarity, /fill-mask
(what the model answers; others 404 with the reason), and / and /invocations (the model's own
route, in the shapes Hugging Face's InferenceClient parses: `clients`); GET /v1/models, /health
(200 when loaded and warm, 503 while shutting down), /info, /metrics (Prometheus text), /docs
and /openapi.json. With `--api-key` (or BERTKIT_API_KEY) every route but /health wants
`Authorization: Bearer KEY` (401 without). Bad requests get a JSON `{"error", "error_type"}`
(on the /v1/ routes OpenAI's `{"error": {"message", "type", "code"}}`, which its client
raises as its own exceptions): 400 for a body that is not JSON, 413 for more inputs or longer texts than the
limits (over the model's length on the embedding routes, unless `"truncate": true`), 422 for
JSON that is not what the endpoint takes, 503 with `Retry-After` when the queue is full or the
server is shutting down. SIGTERM: stop accepting, answer what is queued, exit.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hmac
import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from bertkit._device import thread_policy
from bertkit.errors import InputError
from bertkit.serve.batcher import BatchStats, DynamicBatcher, QueueFull, Stopped
from bertkit.serve.clients import openai_error
from bertkit.serve.config import ServeConfig
from bertkit.serve.connections import GuardedHTTP, descriptors_for, trims_idle_connections
from bertkit.serve.cores import CoreShare
from bertkit.serve.engine import ServedModel
from bertkit.serve.metrics import Metrics
from bertkit.serve.routes import ENDPOINTS, ROUTES, Route
from bertkit.settings import from_values, values

log = logging.getLogger("bertkit.serve")


class JSONResponse(Response):
    """JSON written by orjson: embeddings as float32 arrays, each number in the fewest digits
    that read back as the same float32 (4.9 KB for a 384-dimension vector where Python's json
    wrote 8.6 KB, in 7 us where it took 163: docs/results/serve#one-sentence)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


API_KEY_ENV = "BERTKIT_API_KEY"  # the key, where --api-key is not given


class Service:
    """A loaded model with its batchers, metrics and state (ready, draining)."""

    def __init__(self, model_path: str, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        # a body's bytes: each character at most 6 (a JSON escape), and 1 MiB for the rest;
        # bodies being read hold at most 4 such at once, across all requests
        self.body_limit = config.max_inputs * config.max_chars * 6 + (1 << 20)
        self.reading = _Budget(4 * self.body_limit)
        # Every model call, the warm-up included, on the one inference thread: a second thread
        # running torch ops would keep a second OpenMP team, whose workers spin on the cores
        # the first needs (measured: a Predictor call 6.0 -> 7.2 ms on 2 cores).
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="bertkit-model")
        self.model = self.executor.submit(self._load, model_path).result()
        self.metrics.forward_passes = 0  # the warm-up is not served traffic
        self.batchers: dict[str, DynamicBatcher] = {}
        self.draining = False
        self.in_flight = 0  # requests being answered (each holds its connection busy)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _load(self, path: str) -> ServedModel:
        self.cores = _threads(self.config)  # this thread's OpenMP team (the model runs here)
        model = ServedModel(path, self.config, on_forward=self.metrics.forward)
        model.warm()
        return model

    def _run(self, endpoint: str, items: list[Any]) -> list[Any]:
        """A batch on the inference thread, with as many threads as the CPUs others leave
        free (`cores.CoreShare`; a fixed count stays as set)."""
        import torch

        threads = self.cores.threads()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return self.model.run(endpoint, items)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for endpoint, ok in self.model.endpoints.items():
            if ok:
                self.batchers[endpoint] = DynamicBatcher(
                    functools.partial(self._run, endpoint),
                    self.executor,
                    self.config,
                    on_batch=functools.partial(self._batched, endpoint),
                )
                self.batchers[endpoint].start()

    def _batched(self, endpoint: str, stats: BatchStats) -> None:
        self.metrics.batch(f"/{endpoint}", stats.inputs, stats.seconds, stats.waited)

    def drain(self) -> None:
        """Shutting down: refuse new work, run what waits at once."""
        self.draining = True
        for batcher in self.batchers.values():
            batcher.flush()

    async def stop(self) -> None:
        self.draining = True
        await asyncio.gather(*(b.stop() for b in self.batchers.values()))
        self.executor.shutdown(wait=True)
        self.model.close()

    @property
    def ready(self) -> bool:
        return bool(self.batchers) and not self.draining


def create_app(service: Service) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        # What is loaded by now (torch, the model, the app: ~10^6 objects) lives as long as the
        # process: out of the collector's sight. Requests in flight survive young collections,
        # so full ones came every 0.7 s at 64 clients, each stopping both threads for 75-150 ms
        # (the p95 latency: docs/results/serve#one-sentence); frozen, a full one walks only
        # what serving made.
        gc.collect()
        gc.freeze()
        yield
        await service.stop()

    app = FastAPI(
        title="bertkit",
        summary=f"{service.model.source}: " + ", ".join(service.model.info()["endpoints"]),
        lifespan=lifespan,
        default_response_class=JSONResponse,
        **_telemetry(),
    )
    answer = functools.partial(_answer, service)
    for endpoint, route in ROUTES.items():
        app.add_api_route(
            f"/{endpoint}",
            _route(answer, endpoint),
            methods=["POST"],
            summary=route.summary,
            openapi_extra={"requestBody": _request_schema(route)},
            responses=_RESPONSES,
        )
    for path in ("/", "/invocations"):  # as text-embeddings-inference answers them
        app.add_api_route(path, _route(answer, ""), methods=["POST"], responses=_RESPONSES,
                          summary="the model's own route, in Hugging Face's shapes "
                          "(InferenceClient(model=URL))")  # fmt: skip
    _add_models_routes(app, service)
    _add_status_routes(app, service)
    routes = {f"/{endpoint}": endpoint for endpoint in ENDPOINTS}
    app.add_middleware(_ModelRoutes, routes=routes | {"/": "", "/invocations": ""}, answer=answer)
    key = service.config.api_key or os.environ.get(API_KEY_ENV) or None
    if key is not None:  # (added last: it runs first)
        app.add_middleware(_RequireKey, key=key)
    return app


class _ModelRoutes:
    """A POST to a model's route goes straight to its answer, past FastAPI's routing,
    dependency solving and exception layers, which took a quarter of the event loop's time per
    request (0.21 -> 0.15 ms CPU, docs/results/serve#one-sentence); the routes stay declared
    to FastAPI for /docs and answer the same. Everything else goes on to FastAPI."""

    def __init__(self, app, routes: dict[str, str], answer) -> None:
        self.app, self.routes, self.answer = app, routes, answer

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.routes.get(scope["path"])
            if endpoint is not None:
                response = await self.answer(endpoint, Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry off unless a provider is set when the app is made (as
    `opentelemetry-instrument bertkit serve` sets them): FastAPI 0.16x asks the global
    providers on every request, which read the environment each time (17% of the event
    loop's time at 64 clients, docs/results/serve#one-sentence). Older FastAPI has none."""
    import inspect

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    try:
        from opentelemetry import _logs, metrics, trace
    except ImportError:  # (FastAPI's telemetry needs it; without it there is nothing to turn off)
        return {}

    providers = (trace.get_tracer_provider(), metrics.get_meter_provider(),
                 _logs.get_logger_provider())  # fmt: skip
    # the API's placeholders until a provider is set (the ones FastAPI itself waits on)
    if any(not type(p).__name__.lstrip("_").startswith("Proxy") for p in providers):
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def _error(status: int, message: str, headers: dict[str, str] | None = None,
           read: bool = True, endpoint: str = "") -> Response:  # fmt: skip
    if status == 503:
        headers = {"Retry-After": "1", **(headers or {})}
    if not read:  # the rest of the body is not read: the connection must close
        headers = {**(headers or {}), "Connection": "close"}
    return JSONResponse(_error_body(endpoint, status, message), status, headers=headers)


async def _read_json(service: Service, request: Request) -> Any:
    """The request's body as JSON, read within the server's limits: its size, the bytes all
    bodies being read may hold, the time it may take."""
    limit = service.body_limit
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InputError(f"a body of {int(declared):,} bytes; the most is {limit:,}", 413)
    body = bytearray()

    async def collect() -> None:
        async for chunk in request.stream():
            if not service.reading.take(len(chunk)):
                raise InputError(
                    f"{service.reading.held:,} bytes of other bodies are being read (the "
                    f"server holds {service.reading.total:,} at once); retry later",
                    503,
                )
            body.extend(chunk)
            if len(body) > limit:
                raise InputError(f"a body over {limit:,} bytes", 413)

    try:
        await asyncio.wait_for(collect(), service.config.read_timeout)
    except asyncio.TimeoutError:
        raise InputError(
            f"the body took over {service.config.read_timeout:g} s to arrive", 408
        ) from None
    finally:
        service.reading.give(len(body))
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise _Malformed(f"the body is not JSON: {err}") from None
    except RecursionError:
        raise _Malformed("the body is not JSON this server reads: nested too deeply") from None


async def _answer(service: Service, route: str, request: Request) -> Response:
    """`route`'s answer to `request`; route "" (POST / and /invocations) runs the model's
    own route for the body (`ServedModel.route`)."""
    started = time.perf_counter()
    service.in_flight += 1
    try:
        response = await _respond(service, route, request, started)
    finally:
        service.in_flight -= 1
    if not service.config.keep_idle_connections and trims_idle_connections(
        GuardedHTTP.open, service.in_flight, service.cores.others
    ):
        response.headers["connection"] = "close"
        service.metrics.trimmed += 1
    return response


async def _respond(service: Service, route: str, request: Request, started: float) -> Response:
    """The answer, its request counted in /metrics."""
    inputs, read, endpoint = 0, False, route

    fail = functools.partial(_error, endpoint=route)  # in the route's own error shape

    try:
        if service.draining:
            response = fail(503, "the server is shutting down", {"Retry-After": "5"})
        elif route and route not in service.batchers:
            response = fail(404, service.model.missing(route))
        else:
            body = await _read_json(service, request)
            read = True
            style = None
            if not route:
                endpoint, body, style = service.model.route(body)
                if endpoint not in service.batchers:
                    raise InputError(service.model.missing(endpoint), 404)
            items = service.model.parse(endpoint, body, service.config)
            inputs = len(items)
            results = await _unless_gone(request, service.batchers[endpoint].submit(items))
            if results is _GONE:  # nobody reads this answer; the code says why in /metrics
                response = fail(499, "the client went away before its answer")
            else:
                response = JSONResponse(service.model.shape(endpoint, items, results, style))
    except _Malformed as err:
        response = fail(400, str(err))
    except InputError as err:
        response = fail(err.status, str(err), read=read)
    except QueueFull as err:
        response = fail(503, str(err), {"Retry-After": str(err.retry_after)})
    except Stopped as err:
        response = fail(503, str(err), {"Retry-After": "5"})
    except ValueError as err:  # what the model refused (e.g. a text over its length)
        response = fail(422, str(err))
    except RecursionError:
        response = fail(422, '"inputs" nested too deeply')
    except Exception as err:  # never a traceback to the client, never a dead server
        log.exception("/%s failed", endpoint)
        response = fail(500, f"internal error ({type(err).__name__}); see the server log")
    service.metrics.request(
        f"/{endpoint}", response.status_code, time.perf_counter() - started, inputs
    )
    return response


def _add_models_routes(app: FastAPI, service: Service) -> None:
    """OpenAI's /v1/models: the served model, by the name it is served under."""
    created = int(time.time())

    def listed() -> dict[str, Any]:
        return {"id": service.model.name, "object": "model", "created": created,
                "owned_by": "bertkit"}  # fmt: skip

    @app.get("/v1/models", summary="OpenAI's model list: the served model")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [listed()]}

    @app.get("/v1/models/{name:path}", summary="OpenAI's model: the served model by its name")
    async def model(name: str) -> Response:
        if name != service.model.name:
            return _error(404, f"no model {name!r}: this server serves {service.model.name!r}",
                          endpoint="v1/models")  # fmt: skip
        return JSONResponse(listed())


def _add_status_routes(app: FastAPI, service: Service) -> None:
    """/health, /info and /metrics."""

    @app.get("/health", summary="200 when the model is loaded and warm, 503 when shutting down")
    async def health() -> Response:
        if service.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "draining" if service.draining else "loading"}, 503)

    @app.get("/info", summary="the model, its task, labels and endpoints, the server's limits")
    async def info() -> dict[str, Any]:
        settings = values(service.config)  # by name, as the flags are
        if settings.get("api_key"):  # never the key itself
            settings["api_key"] = "(set)"
        return service.model.info() | {"settings": settings, "threads": service.cores.info()}

    @app.get("/metrics", summary="Prometheus text: requests, latency, batch sizes, queue depth")
    async def metrics() -> Response:
        depth = {f"/{e}": b.waiting for e, b in service.batchers.items()}
        return PlainTextResponse(
            service.metrics.render(
                depth,
                service.ready,
                cancelled={f"/{e}": b.cancelled for e, b in service.batchers.items()},
                connections=GuardedHTTP.open,
            ),
            media_type="text/plain; version=0.0.4",
        )


class _RequireKey:
    """With a key, every route but /health wants `Authorization: Bearer KEY` (401 otherwise).
    Plain ASGI, not Starlette's BaseHTTPMiddleware, which hides a client's going away from the
    route (the route watches for it to drop the client's queued inputs)."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), self.key):
                body = _error_body(scope["path"].lstrip("/"), 401,
                                   "a key is required: Authorization: Bearer KEY")  # fmt: skip
                response = JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_KINDS = {400: "malformed", 401: "unauthorized", 404: "unavailable", 408: "timeout",
          413: "too_large", 422: "validation", 499: "cancelled", 503: "overloaded"}  # fmt: skip


def _error_body(endpoint: str, status: int, message: str) -> dict[str, Any]:
    """An error's JSON: OpenAI's error object on the /v1/ routes (its clients raise it as
    their own exceptions), else {"error", "error_type"}."""
    kind = _KINDS.get(status, "internal")
    if endpoint.startswith("v1/"):
        return openai_error(status, message, "invalid_api_key" if status == 401 else kind)
    return {"error": message, "error_type": kind}


class _Malformed(ValueError):
    pass


_GONE = object()


async def _unless_gone(request: Request, work) -> Any:
    """`work`'s result, or _GONE (and `work` cancelled) if the client disconnects first. The
    body is read by now, so the next ASGI message is the disconnect (or nothing, until the
    response is sent)."""
    work = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work.done():
        return work.result()
    work.cancel()
    return _GONE


class _Budget:
    """Bytes of request bodies held at once, across requests: a bound on what bodies cost in
    memory however many clients send at a time."""

    def __init__(self, total: int) -> None:
        self.total, self.held = total, 0

    def take(self, n: int) -> bool:
        if self.held + n > self.total:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


def _route(answer, endpoint: str):
    async def route(request: Request):
        return await answer(endpoint, request)

    route.__name__ = endpoint.replace("-", "_").replace("/", "_") or "root"
    return route


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body is not JSON"},
    404: {"description": "this model does not answer this endpoint"},
    413: {"description": "more inputs or longer texts than the server takes"},
    422: {"description": "JSON that is not what the endpoint takes"},
    503: {"description": "the queue is full (see Retry-After) or the server is shutting down"},
}


def _request_schema(route: Route) -> dict[str, Any]:
    properties, required = route.schema()
    schema = {"type": "object", "required": required, "properties": properties}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


# --------------------------------------------------------------------------- running it
_ENV = "BERTKIT_SERVE"  # the settings, for each worker process uvicorn starts


def serve(model: str | os.PathLike, config: ServeConfig | None = None, *,
          access_log: bool = False) -> None:  # fmt: skip
    """Load `model`, warm it, and serve it until SIGTERM or Ctrl-C."""
    config = config or ServeConfig()
    # oneDNN keeps a compiled kernel per matrix shape, up to 1,024 of them. In fp32, unpadded
    # batches bring a new row count almost every time, so a busy server's memory grew by 160 MB
    # over its first 40,000 requests before the cache was full (each kernel holds its own copy
    # of a weight matrix, so even 64 grew 130 MB); 8 holds it flat, at the same speed. Under
    # bf16 autocast rows are rounded up to 64 (unpad.row_multiple), so the shapes are few: the
    # full cache levelled off 80 MB above 8's and took a quarter less time (48.9 s against
    # 64.9 for 1,500 batches on a Xeon with AMX, 2 threads; why evicted bf16 kernels cost that
    # much to make again was not profiled; docs/results/serve). Read when oneDNN first runs, so
    # before the model does; a value in the environment wins.

    from bertkit._device import default_device
    from bertkit.precision import resolve_precision

    compute = resolve_precision(
        config.runtime.precision,
        default_device(config.runtime.device),
        backend=config.runtime.backend,
    )
    if compute.name == "fp32":
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")
    common: dict[str, Any] = dict(host=config.host, port=config.port, log_level="warning",
                  access_log=access_log, timeout_graceful_shutdown=60, http=GuardedHTTP,
                  ws="none")  # fmt: skip
    if config.workers > 1:  # each process loads the model itself (uvicorn's factory mode)
        os.environ[_ENV] = json.dumps({"model": str(model), "config": values(config)})
        print(_banner(str(model), config, None), file=sys.stderr, flush=True)
        uvicorn.run(f"{__name__}:_app_from_env", factory=True, workers=config.workers, **common)
        return
    _guard(config)
    service = Service(str(model), config)

    class Server(uvicorn.Server):
        """uvicorn's server, which also tells the service it is draining on SIGTERM/SIGINT
        (from the signal handler: the flag at once, the batchers through the event loop)."""

        def handle_exit(self, sig: int, frame) -> None:
            service.draining = True
            if service.loop is not None:
                service.loop.call_soon_threadsafe(service.drain)
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(create_app(service), **common))
    print(_banner(str(model), config, service), file=sys.stderr, flush=True)
    server.run()


def _threads(config: ServeConfig) -> CoreShare:
    """Set this thread's torch threads and say how they are chosen (`_device.thread_policy`):
    `--threads` or OMP_NUM_THREADS as given; the usable CPUs shared among the workers; else
    one worker on torch adapts the count to what other processes leave free (workers of one
    server would count each other as others, and an ONNX session's threads are fixed when it
    opens)."""
    import torch

    threads = thread_policy(config.threads, workers=config.workers)
    fixed: tuple[int, str] | None = None
    if threads.source != "cpus":
        fixed = (threads.count, threads.why)
    elif config.runtime.backend != "torch":
        fixed = (threads.cpus.count, f"the {config.runtime.backend} backend")
    cores = CoreShare(threads.cpus, fixed=fixed)
    torch.set_num_threads(cores.threads())
    return cores


def _guard(config: ServeConfig) -> None:
    """This process's connection limits (what its open-file limit allows)."""
    GuardedHTTP.configure(config.header_timeout, descriptors_for(config.max_connections))


def _app_from_env():
    settings = json.loads(os.environ[_ENV])
    config = from_values(ServeConfig, settings["config"])
    _guard(config)
    return create_app(Service(settings["model"], config))


def _threads_line(threads: dict[str, Any]) -> str:
    line = f"{threads['now']} thread{'s' * (threads['now'] != 1)} of {threads['usable']} usable CPUs ({threads['why']})"
    return line + (", fewer while other processes keep them busy" if threads["adaptive"] else "")


def _banner(model: str, config: ServeConfig, service: Service | None) -> str:
    what = ", ".join(service.model.info()["endpoints"]) if service else f"{config.workers} workers"
    return (
        f"bertkit serve: {model} ({what}; {config.runtime.backend}"
        f"{' ' + config.quantize if config.quantize else ''}"
        f"{'; ' + service.model.precision.reason if service else ''}"
        f"{'; ' + _threads_line(service.cores.info()) if service else ''}) on "
        f"http://{config.host}:{config.port} (docs: /docs)"
        + (
            f"; at most {GuardedHTTP.max_connections} connections (the open-file limit)"
            if GuardedHTTP.max_connections < config.max_connections
            else ""
        )
        + (
            "; no --api-key: anyone who reaches the port can use it"
            if not (config.api_key or os.environ.get(API_KEY_ENV))
            and config.host not in ("127.0.0.1", "localhost", "::1")
            else ""
        )
    )
