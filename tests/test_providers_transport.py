"""The adapters' client (``PooledClient``, one ``httpx.Client`` each), against real sockets:
keep-alive and its limits, every way an exchange can fail classified by phase (not sent, or
unknown), bounded answers, no cookies or redirects, TLS, a proxy from the environment, and the
request itself: what a plain ``httpx.Client`` with the same settings sends. The server side is
a scripted socket server per test."""

from __future__ import annotations

import base64
import contextlib
import gzip
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import Delivered, Found, Permanent, Retryable, Unknown
from delivery.providers.base import Envelope
from delivery.providers.client import BODY_LIMIT, USER_AGENT, PooledClient
from delivery.providers.http import HttpProvider
from delivery.providers.twilio import TwilioProvider
from delivery.providers.webhook import WebhookProvider

ENVELOPE = Envelope("k-1", "sms", "+12015550123", {"body": "hi"})
CREATED = (
    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
    b'{"id": "msg_1"}'
)


def read_request(conn: socket.socket) -> bytes:
    """One request's bytes (head and a Content-Length body), b"" if the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


class Server:
    """Accepts on a free port and runs ``serve(conn, n)`` for the n-th connection (0-based) in
    its own thread; counts connections and keeps every request it read."""

    def __init__(self, serve: Callable[[Server, socket.socket, int], None], backlog: int = 16):
        self.serve = serve
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.requests: list[bytes] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> Server:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self.threads.append(thread)
        return self

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            n, self.accepted = self.accepted, self.accepted + 1
            thread = threading.Thread(target=self._run, args=(conn, n), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, conn: socket.socket, n: int) -> None:
        with conn, contextlib.suppress(OSError):
            self.serve(self, conn, n)

    def read(self, conn: socket.socket) -> bytes:
        request = read_request(conn)
        if request:
            self.requests.append(request)
        return request

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(fn: Callable[[Server, socket.socket, int], None], **kw: int) -> Server:
        servers.append(Server(fn, **kw).start())
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def provider(port: int, scheme: str = "http", **timeouts: float) -> HttpProvider:
    t = Timeouts(**{"connect": 1.0, "write": 1.0, "read": 1.0, "pool": 1.0, **timeouts})
    return HttpProvider(ProviderConfig("p", "http", f"{scheme}://127.0.0.1:{port}", t))


def keep_answering(answer: bytes) -> Callable[[Server, socket.socket, int], None]:
    def fn(server: Server, conn: socket.socket, n: int) -> None:
        while server.read(conn):
            conn.sendall(answer)

    return fn


def test_the_default_transport_keeps_one_connection(serve: Callable[..., Server]) -> None:
    server = serve(keep_answering(CREATED))
    p = provider(server.port)
    outcomes = [p.send(ENVELOPE) for _ in range(50)]
    p.close()
    assert outcomes == [Delivered("msg_1", 201)] * 50
    assert server.accepted == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/messages HTTP/1.1\r\n")
    for header in (b"Host: 127.0.0.1", b"Idempotency-Key: k-1", b"User-Agent: delivery/"):
        assert header in first
    assert first.endswith(b'{"to":"+12015550123","body":"hi"}')


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'6\r\n{"id":\r\n9\r\n "msg_1"}\r\n0\r\n\r\n',
        b"HTTP/1.1 201 Created\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s",
    ],
    ids=["chunked", "gzip"],
)
def test_framed_and_encoded_bodies_are_read_and_the_connection_kept(
    serve: Callable[..., Server], answer: bytes
) -> None:
    if b"%d" in answer:
        body = gzip.compress(b'{"id": "msg_1"}')
        answer = answer.replace(b"%d", str(len(body)).encode()).replace(b"%s", body)
    server = serve(keep_answering(answer))
    p = provider(server.port)
    assert [p.send(ENVELOPE) for _ in range(3)] == [Delivered("msg_1", 201)] * 3
    p.close()
    assert server.accepted == 1


def test_a_connection_either_side_closes_is_not_reused(serve: Callable[..., Server]) -> None:
    """``Connection: close`` from the server, and a kept-alive connection the server closed
    while idle: the next send opens a new one and succeeds (nothing is resent on a
    connection that failed after the request was written)."""

    def fn(server: Server, conn: socket.socket, n: int) -> None:
        server.read(conn)
        if n == 0:
            conn.sendall(CREATED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        else:
            conn.sendall(CREATED)  # keep-alive, then closed while idle

    server = serve(fn)
    p = provider(server.port)
    assert p.send(ENVELOPE) == Delivered("msg_1", 201)
    assert p.send(ENVELOPE) == Delivered("msg_1", 201)
    time.sleep(0.2)  # the server thread has closed the second connection by now
    assert p.send(ENVELOPE) == Delivered("msg_1", 201)
    p.close()
    assert server.accepted == 3 and len(server.requests) == 3


def test_an_answer_read_only_in_part_closes_its_connection(serve: Callable[..., Server]) -> None:
    big = b"x" * (BODY_LIMIT * 8)
    head = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(big)
    server = serve(keep_answering(head + big))
    p = provider(server.port)
    outcomes = [p.send(ENVELOPE) for _ in range(2)]
    p.close()
    assert all(isinstance(o, Retryable) and o.code == "HTTP_500" for o in outcomes)
    assert server.accepted == 2


def test_a_refused_connect_is_not_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome = provider(port).send(ENVELOPE)
    assert isinstance(outcome, Retryable) and outcome.code == "NETWORK_ConnectError"


def test_a_connect_that_is_never_accepted_times_out_as_not_sent() -> None:
    """A listener whose backlog is full drops the SYN: ``ConnectTimeout``, not sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue; the next connect hangs
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fillers.append(f)
        time.sleep(0.1)
        started = time.monotonic()
        outcome = provider(port, connect=0.5).send(ENVELOPE)
        assert time.monotonic() - started < 3
        assert isinstance(outcome, Retryable) and outcome.code == "NETWORK_ConnectTimeout"
    finally:
        for f in fillers:
            f.close()
        listener.close()


def test_a_full_pool_waits_then_is_not_sent(serve: Callable[..., Server]) -> None:
    """With every connection of the provider's pool busy, a send waits the pool timeout and
    is not sent; the busy connection goes back to the pool when its answer is read."""
    release = threading.Event()

    def slow(server: Server, conn: socket.socket, n: int) -> None:
        while server.read(conn):
            release.wait(5)
            conn.sendall(CREATED)

    server = serve(slow)
    config = ProviderConfig(
        "p", "http", f"http://127.0.0.1:{server.port}", Timeouts(read=5, pool=0.3)
    )
    client = PooledClient(config, base_url=config.base_url, limits=httpx.Limits(max_connections=1))
    first: list[int] = []
    holder = threading.Thread(
        target=lambda: first.append(client._exchange("POST", "/v1/messages").status_code)
    )
    holder.start()
    time.sleep(0.2)
    outcome = client._post(lambda r: Delivered("x", 201), "/v1/messages")
    assert isinstance(outcome, Retryable) and outcome.code == "NETWORK_PoolTimeout", outcome
    release.set()
    holder.join(5)
    assert first == [201]
    assert client._exchange("POST", "/v1/messages").status_code == 201
    client.close()
    assert server.accepted == 1 and len(server.requests) == 2


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        ("silent", "NETWORK_ReadTimeout"),
        ("close", "NETWORK_RemoteProtocolError"),
        ("garbage", "NETWORK_RemoteProtocolError"),
        ("short", "NETWORK_RemoteProtocolError"),
    ],
)
def test_after_the_request_is_written_every_failure_is_unknown(
    serve: Callable[..., Server], behaviour: str, code: str
) -> None:
    def fn(server: Server, conn: socket.socket, n: int) -> None:
        server.read(conn)
        if behaviour == "silent":
            server.stop.wait(3)
        elif behaviour == "garbage":
            conn.sendall(b"HELLO THERE\r\n\r\n")
        elif behaviour == "short":
            conn.sendall(CREATED[:-5])
            conn.shutdown(socket.SHUT_WR)

    server = serve(fn)
    outcome = provider(server.port, read=0.5).send(ENVELOPE)
    assert isinstance(outcome, Unknown) and outcome.code == code, outcome
    assert len(server.requests) == 1


@pytest.mark.parametrize("bad", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\0b"])
def test_a_header_with_cr_lf_or_nul_is_refused_before_anything_is_written(
    serve: Callable[..., Server], bad: str
) -> None:
    server = serve(keep_answering(CREATED))
    p = provider(server.port)
    outcome = p._post(lambda r: Delivered("x", 201), "/v1/messages", headers={"X-Tag": bad})
    p.close()
    assert isinstance(outcome, Permanent) and outcome.code == "CLIENT_LocalProtocolError"
    time.sleep(0.1)
    assert server.requests == []


def test_https_verifies_the_certificate_and_host_name(
    serve: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)

    def fn(server: Server, conn: socket.socket, n: int) -> None:
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            return
        with tls:
            while server.read(tls):
                tls.sendall(CREATED)

    server = serve(fn)
    untrusted = provider(server.port, "https").send(ENVELOPE)
    assert isinstance(untrusted, Retryable) and untrusted.code == "NETWORK_ConnectError"
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    p = provider(server.port, "https")
    assert [p.send(ENVELOPE) for _ in range(3)] == [Delivered("msg_1", 201)] * 3
    p.close()
    assert len(server.requests) == 3 and server.accepted == 2  # one refused, one kept


def test_a_proxy_in_the_environment_is_honoured(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``HTTP_PROXY`` set the adapter's client sends through httpx's proxy transport,
    which asks the proxy for the absolute URL; the rest of the path is the same."""
    proxy = serve(keep_answering(CREATED))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    p = HttpProvider(ProviderConfig("p", "http", "http://provider.invalid:8080", Timeouts()))
    assert p.send(ENVELOPE) == Delivered("msg_1", 201)
    p.close()
    assert proxy.requests[0].startswith(b"POST http://provider.invalid:8080/v1/messages HTTP/1.1")


def test_a_webhook_connects_directly_whatever_the_proxy(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A webhook goes through its address guard, never the environment's proxy (the guard
    checks the address it connects to)."""
    proxy = serve(keep_answering(CREATED))
    receiver = serve(keep_answering(b"HTTP/1.1 204 No Content\r\n\r\n"))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("T_HOOK", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    options = {"secret_env": "T_HOOK", "allow_networks": ["127.0.0.0/8"]}
    hooks = WebhookProvider(ProviderConfig("h", "webhook", "", Timeouts(), options=options))
    envelope = Envelope("k-1", "webhook", f"http://127.0.0.1:{receiver.port}/h", {"e": 1})
    assert hooks.send(envelope) == Delivered(None, 204)
    hooks.close()
    assert len(receiver.requests) == 1 and proxy.requests == []


def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_no_proxy_goes_direct_and_the_proxy_is_chosen_when_the_adapter_is_built(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NO_PROXY`` naming the provider's host sends directly (``proxy_bypass``); the
    environment is read once, when the adapter is built: an adapter built with a proxy keeps
    it after the variable is gone, one built before it was set never uses it."""
    proxy = serve(keep_answering(CREATED))
    direct = serve(keep_answering(CREATED))
    _no_proxy_env(monkeypatch)
    before = provider(direct.port)
    monkeypatch.setenv("HTTP_PROXY", f"127.0.0.1:{proxy.port}")  # no scheme: http://
    monkeypatch.setenv("NO_PROXY", "example.com, 127.0.0.1")
    bypassed = provider(direct.port)
    monkeypatch.delenv("NO_PROXY")
    proxied = provider(direct.port)
    monkeypatch.delenv("HTTP_PROXY")
    for p in (before, bypassed, proxied):
        assert p.send(ENVELOPE) == Delivered("msg_1", 201)
        p.close()
    assert len(direct.requests) == 2
    assert [r.split(b"\r\n")[0] for r in proxy.requests] == [
        f"POST http://127.0.0.1:{direct.port}/v1/messages HTTP/1.1".encode()
    ]


def _head(request: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    head, _, body = request.partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    pairs = [tuple(f.split(b": ", 1)) for f in fields]
    return line, sorted((k.lower(), v) for k, v in pairs), body  # type: ignore[misc]


def test_the_request_is_what_httpx_client_would_send(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send and a lookup carry what a plain ``httpx.Client`` built from the same settings
    carries: the URL under a base URL with a path, the headers (httpx's
    defaults, ours, the credentials, the key; one of each), the compact JSON body and its
    length; the lookup's query."""
    server = serve(keep_answering(CREATED))
    monkeypatch.setenv("T_KEY", "s3cr3t")
    base = f"http://127.0.0.1:{server.port}/api"
    config = ProviderConfig("p", "http", base, Timeouts(), api_key_env="T_KEY")
    p = HttpProvider(config)
    envelope = Envelope("k-1", "sms", "+12015550123", {"body": "héllo", "n": [1, 2.5, None]})
    assert p.send(envelope) == Delivered("msg_1", 201)
    assert isinstance(p.lookup(envelope), Found)
    p.close()
    client = httpx.Client(
        base_url=base,
        headers={
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "gzip, deflate",
            "Authorization": "Bearer s3cr3t",
        },
    )
    expected = [
        client.build_request(
            "POST",
            "/v1/messages",
            json={"to": envelope.to, **envelope.payload},
            headers={"Idempotency-Key": "k-1"},
        ),
        client.build_request("GET", "/v1/messages", params={"idempotency_key": "k-1"}),
    ]
    client.close()
    assert len(server.requests) == 2
    for sent, built in zip(server.requests, expected, strict=True):
        line, headers, body = _head(sent)
        target = built.url.raw_path
        assert line == built.method.encode() + b" " + target + b" HTTP/1.1"
        assert headers == sorted((k.lower(), v) for k, v in built.headers.raw)
        assert body == built.read()
    assert server.requests[0].split(b"\r\n")[0] == b"POST /api/v1/messages HTTP/1.1"


def test_an_adapters_header_replaces_the_default_and_a_form_is_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twilio's ``Accept: application/json`` replaces httpx's ``*/*`` (one ``Accept``), its
    basic credentials and form body go as the Client sent them."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"sid": "SM1"})

    monkeypatch.setenv("T_TOKEN", "tok")
    sid = "AC" + "0" * 32
    options = {"account_sid": sid, "auth_token_env": "T_TOKEN", "from_number": "+15005550006"}
    config = ProviderConfig("t", "twilio", "https://api.example", Timeouts(), options=options)
    p = TwilioProvider(config, httpx.MockTransport(answer))
    assert p.send(Envelope("k", "sms", "+12015550123", {"body": "a b&c"})) == Delivered("SM1", 201)
    p.close()
    [request] = seen
    assert request.headers.get_list("accept") == ["application/json"]
    assert (
        request.headers["authorization"]
        == "Basic " + base64.b64encode(f"{sid}:tok".encode()).decode()
    )
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.content == b"To=%2B12015550123&From=%2B15005550006&Body=a+b%26c"
    assert request.headers["content-length"] == str(len(request.content))


def test_the_timeouts_travel_in_the_request_and_the_body_reads_get_what_is_left() -> None:
    """Each phase's timeout is in the request's ``timeout`` extension (as httpx's Client puts
    it, and httpcore reads it); once the headers are in, the read timeout of the body is cut
    to what is left of the exchange's deadline."""
    seen: list[dict[str, float]] = []
    live: list[dict[str, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        live.append(request.extensions["timeout"])
        time.sleep(0.5)
        return httpx.Response(201, content=iter([b'{"id": "msg_1"}']))

    t = Timeouts(connect=0.1, read=5.0, write=0.2, pool=0.3)  # the deadline: 5.6 s
    config = ProviderConfig("p", "http", "http://127.0.0.1:9", t)
    p = HttpProvider(config, httpx.MockTransport(answer))
    assert p.send(ENVELOPE) == Delivered("msg_1", 201)
    assert seen == [{"connect": 0.1, "read": 5.0, "write": 0.2, "pool": 0.3}]
    assert 4.0 < live[0]["read"] < 5.15  # 5.6 s less the 0.5 s the headers took
    p.send(ENVELOPE)
    assert seen[1] == seen[0]  # each request has its own


def test_a_transport_error_carries_its_request() -> None:
    """As ``httpx.Client`` raises them: the error's ``request`` is the one that failed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = provider(port)
    with pytest.raises(httpx.ConnectError) as caught:
        p._exchange("GET", "/v1/messages", params={"idempotency_key": "k-1"})
    assert str(caught.value.request.url) == (
        f"http://127.0.0.1:{port}/v1/messages?idempotency_key=k-1"
    )


def test_an_answer_open_while_the_client_closes_ends_and_closes_its_connection(
    serve: Callable[..., Server],
) -> None:
    """``close`` while a send is still reading its answer: that send ends within its read
    timeout as unknown, and its connection is closed, not kept."""
    ended = threading.Event()

    def fn(server: Server, conn: socket.socket, n: int) -> None:
        server.read(conn)
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{")
        while conn.recv(1):
            pass  # until the client closes it
        ended.set()

    server = serve(fn)
    p = provider(server.port, read=1)
    got: list[object] = []
    sending = threading.Thread(target=lambda: got.append(p.send(ENVELOPE)))
    sending.start()
    time.sleep(0.3)
    p.close()
    sending.join(5)
    assert len(got) == 1 and isinstance(got[0], Unknown), got
    assert ended.wait(5)


def test_cookies_are_not_kept_and_redirects_not_followed(serve: Callable[..., Server]) -> None:
    """A provider's ``Set-Cookie`` is never sent back, and a 3xx is its final answer."""
    moved = (
        b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nSet-Cookie: s=1; Path=/\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    server = serve(keep_answering(moved))
    p = provider(server.port)
    outcomes = [p.send(ENVELOPE) for _ in range(2)]
    p.close()
    assert all(isinstance(o, Permanent) and o.code == "HTTP_302" for o in outcomes), outcomes
    assert len(server.requests) == 2
    assert all(b"/elsewhere" not in r and b"cookie:" not in r.lower() for r in server.requests)


def test_a_gzip_bomb_on_the_wire_inflates_no_further_than_the_limit(
    serve: Callable[..., Server],
) -> None:
    """A 64 MB gzip bomb (64 KB sent) is decoded up to the limit only; the connection, read
    in part, is not reused."""
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
    head = b"HTTP/1.1 400 Bad\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    server = serve(keep_answering(head + bomb))
    p = provider(server.port)
    started = time.monotonic()
    outcomes = [p.send(ENVELOPE) for _ in range(2)]
    p.close()
    assert time.monotonic() - started < 5
    assert all(isinstance(o, Permanent) and o.code == "HTTP_400" for o in outcomes), outcomes
    assert server.accepted == 2


def test_a_connection_on_a_descriptor_above_1024_is_reused(
    serve: Callable[..., Server],
) -> None:
    """A busy worker holds many descriptors: the idle check before reuse works on a socket
    numbered above 1024 (``select.select`` cannot), so keep-alive still holds."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the descriptor limit is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    server = serve(keep_answering(CREATED))
    held = [socket.socket() for _ in range(1100)]  # the client's socket comes after these
    try:
        p = provider(server.port)
        assert [p.send(ENVELOPE) for _ in range(3)] == [Delivered("msg_1", 201)] * 3
        p.close()
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert server.accepted == 1
