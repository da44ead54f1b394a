"""`bertkit serve` against hostile clients, on loopback: headers and a body sent a byte at a
time, 1,000 idle connections, a 100 MB body, JSON nested 10,000 deep, invalid UTF-8 inside a
string, clients that go away while their inputs wait, and every connection held busy. Each
pattern is cut off by its limit, the server's memory stays bounded, and a well-behaved client's
median latency meanwhile stays within 2x of what it was alone."""

from __future__ import annotations

import json
import resource
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import Server

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # subprocesses

TIMEOUT = 2  # the server's --header-timeout and --read-timeout here, in seconds
HEADERS = b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.fixture(scope="module")
def server(topics_model):
    running = Server(topics_model, "--header-timeout", str(TIMEOUT), "--read-timeout",
                     str(TIMEOUT), "--max-inputs", "8", "--max-chars", "200")  # fmt: skip
    yield running
    running.stop()


def latencies(server: Server, n: int = 40) -> list[float]:
    """A well-behaved client: one request at a time on one keep-alive connection."""
    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            started = time.perf_counter()
            response = client.post(server.url + "/predict", json={"inputs": "goal match team"})
            times.append(time.perf_counter() - started)
            assert response.status_code == 200 and response.json()[0]["label"] == "sports"
    return statistics.median(times)


def within_twice(server: Server, alone: float, meanwhile: float) -> None:
    print(
        f"another client's median latency {alone * 1e3:.1f} ms alone, {meanwhile * 1e3:.1f} ms meanwhile"
    )
    assert meanwhile <= 2 * alone, f"{meanwhile * 1e3:.1f} ms meanwhile, {alone * 1e3:.1f} alone"


def connect(server: Server) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_server(sock: socket.socket, within: float) -> tuple[bool, bytes]:
    """Whether the server closes `sock` within `within` seconds, and what it sent first."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return True, got
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def trickle(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send `data` a byte every 0.25 s until it is sent, the server closes, or `stop`."""
    for byte in data:
        if stop.wait(0.25):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def test_headers_and_bodies_a_byte_at_a_time_are_cut_off(server):
    alone = latencies(server)
    stop = threading.Event()
    slow_headers = [connect(server) for _ in range(10)]
    slow_bodies = [connect(server) for _ in range(10)]
    for sock in slow_bodies:
        sock.sendall(HEADERS + b"content-length: 1000\r\n\r\n")
    senders = [threading.Thread(target=trickle, args=(s, HEADERS + b"content-length: 9\r\n", stop))
               for s in slow_headers] + [
        threading.Thread(target=trickle, args=(s, b'{"inputs": "' + b"x" * 900, stop))
        for s in slow_bodies]  # fmt: skip
    started = time.monotonic()
    for sender in senders:
        sender.start()
    try:
        meanwhile = latencies(server)
        for sock in slow_headers:  # closed without an answer: there was no request yet
            closed, sent = closed_by_server(sock, TIMEOUT + 3)
            assert closed and sent == b""
        for sock in slow_bodies:
            closed, sent = closed_by_server(sock, TIMEOUT + 3)
            assert closed and sent.startswith(b"HTTP/1.1 408"), sent[:200]
            assert b"connection: close" in sent.lower() and b"to arrive" in sent
        assert time.monotonic() - started < 2 * TIMEOUT + 4
    finally:
        stop.set()
        for sock in slow_headers + slow_bodies:
            sock.close()
    within_twice(server, alone, meanwhile)


def test_a_thousand_idle_connections(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 and (hard == resource.RLIM_INFINITY or hard >= 1200):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    alone = latencies(server)
    rss = server.rss_mb()
    idle = [connect(server) for _ in range(1000)]
    try:
        time.sleep(0.5)
        # the default cap is 1,000: each new connection beyond it closed the longest-idle one
        meanwhile = latencies(server)
        assert server.metric("bertkit_open_connections") == 1000
        assert closed_by_server(idle[0], 1) == (True, b"")  # the oldest made room
        grown = server.rss_mb() - rss
        print(f"1,000 idle connections: the server grew {grown:.1f} MB")
        assert grown < 40, f"the server grew {grown:.0f} MB holding 1,000 idle connections"
        time.sleep(TIMEOUT + 0.5)  # no request within the header deadline: all closed
        assert all(closed_by_server(sock, 2)[0] for sock in idle[1:])
        assert server.metric("bertkit_open_connections") <= 2
    finally:
        for sock in idle:
            sock.close()
    within_twice(server, alone, meanwhile)


def test_a_100_mb_body(server):
    alone = latencies(server)
    rss = server.rss_mb()
    declared = connect(server)  # says its size first: refused before a byte of it is read
    declared.sendall(HEADERS + b"content-length: 100000000\r\n\r\n")
    closed, sent = closed_by_server(declared, 5)
    assert closed and sent.startswith(b"HTTP/1.1 413") and b"100,000,000 bytes" in sent
    declared.close()
    stop, refused = threading.Event(), []

    def send_chunked() -> None:
        """100 MB in 64 kB chunks, no size given, at up to 16 MB/s, again and again. (The
        server's cost is small: 0.17 of a core at 58 MB/s; but on two cores anything beside
        the model's two threads delays them, and the test's own client shares the cores.)"""
        chunk = b"10000\r\n" + b"[" * (1 << 16) + b"\r\n"
        while not stop.is_set():
            with connect(server) as sock:
                sock.sendall(HEADERS + b"transfer-encoding: chunked\r\n\r\n")
                try:
                    for _ in range(1600):
                        sock.sendall(chunk)
                        time.sleep(0.004)
                except OSError:  # the server stopped reading and closed
                    pass
                refused.append(closed_by_server(sock, 5)[1])

    sender = threading.Thread(target=send_chunked)
    sender.start()
    try:
        meanwhile = latencies(server)
    finally:
        stop.set()
        sender.join(60)
    assert refused and all(r.startswith(b"HTTP/1.1 413") or r == b"" for r in refused)
    assert any(b"a body over" in r for r in refused)
    grown = server.rss_mb() - rss
    print(f"{len(refused)} bodies of 100 MB refused: the server grew {grown:.1f} MB")
    assert grown < 40, f"the server grew {grown:.0f} MB reading 100 MB bodies"
    within_twice(server, alone, meanwhile)


@pytest.mark.parametrize(
    "body, words",
    [
        (b'{"inputs": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nested too deeply"),
        (b'{"inputs": "caf\xe9 \xff\xfe"}', "not JSON"),
    ],
    ids=["nested-10000-deep", "invalid-utf8-in-a-string"],
)
def test_json_that_a_parser_chokes_on(server, body, words):
    response = httpx.post(server.url + "/predict", content=body, timeout=30,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 400 and words in response.json()["error"]
    assert server.post("/predict", {"inputs": "goal"}).status_code == 200


def test_clients_that_go_away_and_connections_all_busy(topics_model):
    """Inputs of a client that disconnected while they waited are never computed; with every
    connection busy a new one gets 503 at once, and the server serves again after."""
    server = Server(topics_model, "--max-wait-ms", "1500", "--max-batch-size", "64",
                    "--max-connections", "3", "--read-timeout", "3")  # fmt: skip
    try:
        server.post("/predict", {"inputs": "warm"})
        passes = server.metric("bertkit_forward_passes_total")
        body = b'{"inputs": ["goal", "match", "team"]}'
        gone = connect(server)
        gone.sendall(HEADERS + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)  # queued: the batch waits 1.5 s for more
        gone.close()
        time.sleep(2)
        assert server.metric('bertkit_cancelled_inputs_total{endpoint="/predict"}') == 3
        assert server.metric("bertkit_forward_passes_total") == passes
        assert server.metric('bertkit_requests_total{endpoint="/predict",code="499"}') == 1

        busy = [connect(server) for _ in range(3)]  # headers in, the body never comes
        for sock in busy:
            sock.sendall(HEADERS + b"content-length: 100\r\n\r\n")
        time.sleep(0.3)
        refused = connect(server)
        closed, sent = closed_by_server(refused, 2)
        assert closed and sent.startswith(b"HTTP/1.1 503") and b"in flight" in sent
        for sock in busy:
            assert closed_by_server(sock, 5)[1].startswith(b"HTTP/1.1 408")
            sock.close()
        assert server.post("/predict", {"inputs": "goal match"}).status_code == 200
    finally:
        server.stop()


def test_a_disconnect_storm(minilm_dir):
    """Forty clients each post 200 sentences and go away at once while a good client asks for
    one sentence every 20 ms: the model computes at most the part of a gone request that was
    in flight (parts of 8 here), never a whole one; the good client's median latency during
    the storm stays under 3x its latency alone plus 50 ms; the server's memory is back within
    10% after."""
    server = Server(minilm_dir, "--precision", "fp32", "--max-batch-size", "8",
                    "--max-queue", "10000")  # fmt: skip
    sentences = [f"sentence {n} of a storm that nobody waits for" for n in range(200)]
    storm = b'{"input": %s}' % json.dumps(sentences).encode()
    storm = HEADERS.replace(b"/predict", b"/v1/embeddings") + b"content-length: %d\r\n\r\n%s" % (
        len(storm), storm)  # fmt: skip
    samples: list[tuple[float, float]] = []

    def good(client: httpx.Client) -> None:
        started = time.perf_counter()
        answer = client.post(server.url + "/v1/embeddings", json={"input": "a good client"})
        assert answer.status_code == 200
        samples.append((started, time.perf_counter() - started))

    def sampled(seconds: float) -> None:  # a request every 20 ms, answered or not
        with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=32)) as client, \
                ThreadPoolExecutor(16) as pool:  # fmt: skip
            futures, begun = [], time.perf_counter()
            while time.perf_counter() < begun + seconds:
                futures.append(pool.submit(good, client))
                time.sleep(0.02)
            for future in futures:
                future.result()

    try:
        server.post("/v1/embeddings", {"input": ["warm up"] * 8})
        sampled(1.5)
        alone = statistics.median(s for _, s in samples)
        rss = server.rss_mb()
        computed = server.metric('bertkit_batch_size_sum{endpoint="/v1/embeddings"}')
        good_before = len(samples)
        storm_started = time.perf_counter()

        def vanish() -> None:
            sock = connect(server)
            sock.sendall(storm)
            sock.close()

        with ThreadPoolExecutor(8) as pool:
            during = pool.submit(sampled, 2.0)
            list(pool.map(lambda _: vanish(), range(40)))
            during.result()
        time.sleep(1)
        meanwhile = statistics.median(s for t, s in samples if t >= storm_started)
        storm_computed = (server.metric('bertkit_batch_size_sum{endpoint="/v1/embeddings"}')
                          - computed - (len(samples) - good_before))  # fmt: skip
        cancelled = server.metric('bertkit_cancelled_inputs_total{endpoint="/v1/embeddings"}')
        print(f"good client: {alone * 1e3:.1f} ms alone, {meanwhile * 1e3:.1f} ms during the "
              f"storm; storm inputs computed {storm_computed:.0f} of 8,000, dropped "
              f"{cancelled:.0f}; rss {rss:.0f} -> {server.rss_mb():.0f} MB")  # fmt: skip
        assert meanwhile < 3 * alone + 0.05
        # (before parts: one gone request ran whole, 200 inputs for nobody)
        assert storm_computed + cancelled == 8000 and storm_computed < 200
        assert server.rss_mb() <= 1.1 * rss
    finally:
        server.stop()


def test_a_co_located_clients_idle_pool_is_trimmed_only_while_the_cpus_are_busy(topics_model):
    """A client pool with more connections than it keeps busy: while nothing else works on the
    machine its connections are kept; beside a busy process (a client on the same cores) an
    answer closes its connection (`Connection: close`, counted in /metrics) and the client,
    opening another, gets every answer; `--keep-idle-connections` keeps them all."""
    import subprocess
    import sys

    def trimmed(server: Server) -> float:
        return server.metric("bertkit_trimmed_connections_total")

    def use_a_pool(server: Server, seconds: float) -> None:
        with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=8)) as client:

            def ask(_: int) -> int:
                return client.post(server.url + "/predict", json={"inputs": "goal"}).status_code

            with ThreadPoolExecutor(8) as pool:  # eight connections opened
                assert set(pool.map(ask, range(8))) == {200}
            until = time.monotonic() + seconds
            while time.monotonic() < until:  # then one request at a time: seven idle (and
                assert ask(0) == 200  # little CPU for this client: it is not what is busy)
                time.sleep(0.05)

    for flags, trims in (((), True), (("--keep-idle-connections",), False)):
        server = Server(topics_model, *flags)
        try:
            use_a_pool(server, 1.0)
            assert trimmed(server) == 0  # nothing else busy: keep-alive kept
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                use_a_pool(server, 3.0)  # the server sees the other process within a second
            finally:
                busy.kill()
                busy.wait()
            assert (trimmed(server) > 0) == trims, trimmed(server)
        finally:
            server.stop()


def send_until_cut(sock: socket.socket, data: bytes, chunk: int = 1 << 16) -> int:
    """Send `data` a chunk at a time until it is sent or the server stops reading; the bytes
    sent."""
    sent = 0
    try:
        while sent < len(data):
            sock.sendall(data[sent : sent + chunk])
            sent += chunk
    except OSError:  # the server answered and closed
        pass
    return min(sent, len(data))


def answer_to(sock: socket.socket) -> bytes:
    """What the server sent before it closed (b"" if the close was a reset first)."""
    try:
        return closed_by_server(sock, 5)[1]
    except OSError:
        return b""


@pytest.mark.parametrize(
    "head, status, words",
    [
        (
            HEADERS + b"x-big: " + b"a" * 9000 + b"\r\n\r\n",
            431,
            b"a header of 9,005 bytes (its name and value)",
        ),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", 414, b"a request line over"),
        (
            HEADERS + b"".join(b"x-%d: 1\r\n" % n for n in range(101)) + b"\r\n",
            431,
            b"more than 100 headers",
        ),
        (
            HEADERS + b"".join(b"x-%d: %s\r\n" % (n, b"a" * 8000) for n in range(5)),
            431,
            b"a request head over 32,768 bytes",
        ),
    ],
    ids=["header-line-9kb", "request-line-9kb", "101-headers", "head-40kb-unfinished"],
)
def test_heads_over_their_limits_are_refused(server, head, status, words):
    with connect(server) as sock:
        sock.sendall(head)
        answer = answer_to(sock)
    assert answer.startswith(b"HTTP/1.1 %d" % status) and words in answer, answer[:300]
    assert b"connection: close" in answer.lower()
    assert server.post("/predict", {"inputs": "goal"}).status_code == 200


def test_a_16_mb_header_line_is_cut_off_at_once(server):
    with connect(server) as sock:
        sent = send_until_cut(sock, HEADERS + b"x-big: " + b"a" * (16 << 20))
        answer = answer_to(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]
    # what the kernel's buffers take besides the 32 KiB the server read
    assert sent < 8 << 20, f"{sent:,} bytes of one header line were taken"


def test_unfinished_heads_on_many_connections_hold_bounded_memory(server):
    """200 connections each sending 1 MB of a header that never ends (before: the server held
    200 MB, and kept it after they closed), then 300 each holding 30 KB, under the head limit
    (9 MB together: beyond the 8 MiB all heads may hold, connections are refused with 503)."""
    alone = latencies(server)
    rss = server.rss_mb()
    socks = [connect(server) for _ in range(200)]
    try:
        with ThreadPoolExecutor(8) as pool:
            sent = list(pool.map(lambda s: send_until_cut(s, HEADERS + b"x-a: " + b"a" * (1 << 20)),
                                 socks))  # fmt: skip
            answers = list(pool.map(answer_to, socks))
    finally:
        for sock in socks:
            sock.close()
    assert all(a == b"" or a.startswith(b"HTTP/1.1 431") for a in answers)
    assert sum(a.startswith(b"HTTP/1.1 431") for a in answers) >= 100, "few were answered"
    held = [connect(server) for _ in range(300)]
    try:
        for sock in held:
            sock.sendall(HEADERS + b"x-a: " + b"a" * 30_000)
        time.sleep(1)
        meanwhile = latencies(server)
        refused = [answer_to(s) for s in held[-40:]]
        assert any(r.startswith(b"HTTP/1.1 503") and b"unfinished request heads" in r
                   for r in refused), refused[:2]  # fmt: skip
        grown = server.rss_mb() - rss
        print(
            f"heads on 500 connections: sent {sum(sent) / 1e6:.0f} MB, server grew {grown:.1f} MB"
        )
        assert grown < 40, f"the server grew {grown:.0f} MB holding unfinished heads"
    finally:
        for sock in held:
            sock.close()
    within_twice(server, alone, meanwhile)
