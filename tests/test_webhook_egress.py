"""Webhooks never reach internal addresses unless allowlisted (G7, SSRF): checked on the address
actually connected to, refused before any connection, up front at ``enqueue`` when the URL
alone says so. No test here sends a packet to anything but 127.0.0.1: ``socket.connect`` is
replaced by a recorder that refuses, so even a guard that failed could not reach 10.0.0.1."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import delivery
from delivery.core.models import Message
from delivery.core.outcomes import Delivered, Permanent, Retryable
from delivery.errors import ConfigError, InvalidMessage
from delivery.providers import Envelope
from delivery.runtime.db import make_engine, upgrade
from tests.provider_stubs import QuietHTTPServer, WebhookReceiver, provider_from, settings_with

SECRET = "whsec_" + base64.b64encode(b"egress-test-signing-key-0123456789").decode()
PUBLIC = "93.184.215.14"  # never contacted: connect is replaced by a recorder below
PAYLOAD = {"event": "ping"}


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_SECRET", SECRET)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(SECRET) as server:
        yield server


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every socket.connect of this process, recorded and refused (nothing leaves the host)."""
    seen: list[Any] = []

    def record(self: socket.socket, address: Any) -> None:
        seen.append(address)
        raise ConnectionRefusedError("connect recorded by the test, not made")

    monkeypatch.setattr(socket.socket, "connect", record)
    return seen


def table(**extra: Any) -> dict[str, Any]:
    return {"kind": "webhook", "secret_env": "EGRESS_SECRET", **extra}


def send(url: str, **extra: Any) -> Any:
    provider = provider_from(table(**extra))
    try:
        return provider.send(Envelope("egress-1:ping", "webhook", url, PAYLOAD))
    finally:
        provider.close()


def port_of(receiver: WebhookReceiver) -> int:
    return int(receiver.url.rsplit(":", 1)[1])


INTERNAL = {
    "loopback": "http://127.0.0.1:{port}/hooks/a",
    "localhost": "http://localhost:{port}/hooks/a",
    "ipv6_loopback": "http://[::1]:{port}/hooks/a",
    "ipv4_mapped_loopback": "http://[::ffff:127.0.0.1]:{port}/hooks/a",
    "cloud_metadata": "http://169.254.169.254/latest/meta-data/",
    "private_10": "http://10.0.0.1/hooks/a",
    "private_192_168": "https://192.168.1.1/hooks/a",
    "cgnat": "http://100.64.0.1/hooks/a",
    "unspecified": "http://0.0.0.0:{port}/hooks/a",
    "multicast": "http://224.0.0.1/hooks/a",
    "reserved": "http://240.0.0.1/hooks/a",
    "6to4_loopback": "http://[2002:7f00:1::]/hooks/a",
    "nat64_metadata": "http://[64:ff9b::a9fe:a9fe]/hooks/a",
    "hex_encoded_loopback": "http://0x7f.1:{port}/hooks/a",
}


@pytest.mark.parametrize("url", INTERNAL.values(), ids=INTERNAL.keys())
def test_default_refuses_internal_addresses_without_connecting(
    receiver: WebhookReceiver, connects: list[Any], url: str
) -> None:
    """Under the default configuration each internal address (and a name resolving to one) is a
    permanent WEBHOOK_ADDRESS_BLOCKED outcome, and no connection was even attempted."""
    url = url.format(port=port_of(receiver))
    outcome = send(url)
    assert isinstance(outcome, Permanent), outcome
    assert outcome.code in ("WEBHOOK_ADDRESS_BLOCKED", "WEBHOOK_URL_REFUSED")
    if "0x7f" not in url:  # an encoded host is refused as a URL shape or once resolved
        assert outcome.code == "WEBHOOK_ADDRESS_BLOCKED"
    assert "allow_" in outcome.reason and url not in outcome.reason
    assert connects == []
    assert receiver.requests == []


def test_dns_rebinding_connects_only_to_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch, connects: list[Any]
) -> None:
    """A name that answers a public address first and 127.0.0.1 afterwards is resolved once per
    connection and the socket goes to the checked public answer, never to 127.0.0.1; the next
    connection resolves again, gets 127.0.0.1 and is refused without connecting."""
    lookups: list[str] = []
    real = socket.getaddrinfo

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.example.com":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        address = PUBLIC if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    first = send("http://rebind.example.com:8080/hooks/a")
    assert lookups == ["rebind.example.com"]
    assert connects == [(PUBLIC, 8080)]
    assert isinstance(first, Retryable) and first.code == "NETWORK_ConnectError"
    assert PUBLIC not in first.reason and "rebind.example.com" not in first.reason  # no recipient
    second = send("http://rebind.example.com:8080/hooks/a")
    assert len(lookups) == 2
    assert connects == [(PUBLIC, 8080)]  # 127.0.0.1 never connected to
    assert isinstance(second, Permanent) and second.code == "WEBHOOK_ADDRESS_BLOCKED"


def test_a_name_resolving_to_public_and_internal_addresses_is_refused_whole(
    monkeypatch: pytest.MonkeyPatch, connects: list[Any]
) -> None:
    """An answer mixing a public address and 127.0.0.1 (the shape of a rebinding attack) is
    refused whole, before any connection, even to the public address."""

    def mixed(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    outcome = send("https://mixed.example.com/hooks/a")
    assert isinstance(outcome, Permanent) and outcome.code == "WEBHOOK_ADDRESS_BLOCKED"
    assert "rebinding" in outcome.reason and "mixed.example.com" not in outcome.reason
    assert connects == []


def test_allow_networks_admits_exactly_the_listed_receivers(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """allow_networks = ["127.0.0.1/32"] delivers to the loopback receiver and still refuses
    every other internal address (without connecting)."""
    allowed = {"allow_networks": ["127.0.0.1/32"]}
    assert send(receiver.url + "/hooks/a", **allowed) == Delivered(None, 204)
    assert receiver.verified == [True]
    seen: list[Any] = []

    def record(self: socket.socket, address: Any) -> None:
        seen.append(address)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket.socket, "connect", record)
    for url in ("http://10.0.0.1/h", "http://169.254.169.254/", "http://[::1]:9/h"):
        outcome = send(url, **allowed)
        assert isinstance(outcome, Permanent) and outcome.code == "WEBHOOK_ADDRESS_BLOCKED"
    assert seen == []


def test_allow_hosts_admits_an_internal_receiver_by_name(receiver: WebhookReceiver) -> None:
    """allow_hosts = ["localhost"] delivers to http://localhost:PORT (its addresses are not
    checked), while 127.0.0.1 by address stays refused."""
    port = port_of(receiver)
    outcome = send(f"http://localhost:{port}/hooks/a", allow_hosts=["localhost"])
    assert outcome == Delivered(None, 204)
    refused = send(f"http://127.0.0.1:{port}/hooks/a", allow_hosts=["localhost"])
    assert isinstance(refused, Permanent) and refused.code == "WEBHOOK_ADDRESS_BLOCKED"
    assert receiver.verified == [True]


def test_https_only_refuses_plain_http_without_connecting(
    receiver: WebhookReceiver, connects: list[Any]
) -> None:
    """With https_only = true an http:// URL is a permanent WEBHOOK_URL_REFUSED, unsent, even
    to an allowlisted receiver."""
    outcome = send(receiver.url + "/hooks/a", https_only=True, allow_networks=["127.0.0.1/32"])
    assert isinstance(outcome, Permanent) and outcome.code == "WEBHOOK_URL_REFUSED"
    assert "https" in outcome.reason
    assert connects == [] and receiver.requests == []


BAD_CONFIG = [
    ({"allow_networks": ["10.0.0.0/33"]}, "providers.p.allow_networks"),
    ({"allow_networks": "10.0.0.0/8"}, "providers.p.allow_networks"),
    ({"allow_networks": [8]}, "providers.p.allow_networks"),
    ({"allow_networks": ["64:ff9b::/96"]}, "providers.p.allow_networks"),
    ({"allow_hosts": ["127.0.0.1"]}, "providers.p.allow_hosts"),
    ({"allow_hosts": ["bad host"]}, "providers.p.allow_hosts"),
    ({"https_only": "yes"}, "providers.p.https_only"),
]


@pytest.mark.parametrize(("extra", "key"), BAD_CONFIG)
def test_a_wrong_allowlist_is_a_config_error_naming_the_key(
    extra: dict[str, Any], key: str
) -> None:
    """A malformed allowlist or https_only fails when settings load, naming its dotted key (an
    allowed network inside a translation prefix such as NAT64 would admit all of IPv4)."""
    with pytest.raises(ConfigError) as err:
        settings_with({"p": table(**extra)})
    assert err.value.key == key


def webhook_settings(**extra: Any) -> Any:
    return settings_with({"hooks": table(**extra)}, {"webhook": {"provider": "hooks"}})


REFUSED_AT_ENQUEUE = [
    "http://127.0.0.1:8080/h",
    "http://[::1]/h",
    "http://[::ffff:127.0.0.1]/h",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/h",
    "http://2130706433/h",
    "http://localhost:8080/h",
    "http://api.localhost/h",
]


@pytest.mark.parametrize("url", REFUSED_AT_ENQUEUE)
def test_enqueue_refuses_what_the_url_alone_shows_and_writes_nothing(
    tmp_path: Path, url: str
) -> None:
    """A literal internal address or a localhost name is refused by enqueue (InvalidMessage
    naming `to`, without echoing the URL) and no row is written; a public name is accepted."""
    engine = make_engine(f"sqlite:///{tmp_path}/outbox.sqlite3")
    upgrade(engine)
    settings = webhook_settings()
    try:
        with Session(engine) as session:
            with pytest.raises(InvalidMessage) as err:
                delivery.enqueue(
                    session, channel="webhook", to=url, payload=PAYLOAD, settings=settings
                )
            assert err.value.field == "to" and url not in str(err.value)
            assert session.scalar(select(func.count()).select_from(Message)) == 0
            message = delivery.enqueue(
                session,
                channel="webhook",
                to="https://hooks.example.com/h",
                payload=PAYLOAD,
                settings=settings,
            )
            assert message.recipient == "https://hooks.example.com/h"
    finally:
        engine.dispose()


def test_enqueue_honours_the_allowlist_and_https_only() -> None:
    """allow_networks lets enqueue accept a listed literal address; https_only refuses http."""
    from delivery.providers.registry import adapter_for

    allowed = webhook_settings(allow_networks=["10.1.0.0/16"]).providers["hooks"]
    adapter_for("webhook").check_recipient(allowed, "http://10.1.2.3/h")
    with pytest.raises(InvalidMessage):
        adapter_for("webhook").check_recipient(allowed, "http://10.2.0.1/h")
    strict = webhook_settings(https_only=True).providers["hooks"]
    adapter_for("webhook").check_recipient(strict, "https://hooks.example.com/h")
    with pytest.raises(InvalidMessage) as err:
        adapter_for("webhook").check_recipient(strict, "http://hooks.example.com/h")
    assert err.value.field == "to" and "https" in err.value.problem


@pytest.fixture
def tls_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An https receiver on 127.0.0.1 with a certificate for ``hooks.test`` from a test CA that
    the client trusts (SSL_CERT_FILE); it records the SNI names it is offered."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler

    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("hooks.test").configure_cert(context)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment]
    posts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            posts.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = QuietHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], names, posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_tls_verifies_the_host_name_on_the_pinned_connection(
    tls_receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over https the guarded connection, pinned to the checked address (127.0.0.1,
    allowlisted), still offers the host name as SNI and verifies the certificate against it: a
    name the certificate covers is delivered, a name it does not cover is refused unsent."""
    port, names, posts = tls_receiver
    real = socket.getaddrinfo

    def hosts(host: Any, p: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("hooks.test", "other.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))]
        return real(host, p, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hosts)
    allowed = {"allow_networks": ["127.0.0.1/32"]}
    assert send(f"https://hooks.test:{port}/hooks/a", **allowed) == Delivered(None, 204)
    assert names == ["hooks.test"] and posts == ["/hooks/a"]
    wrong = send(f"https://other.test:{port}/hooks/b", **allowed)
    assert isinstance(wrong, Retryable) and wrong.code == "NETWORK_ConnectError"
    assert "certificate" in wrong.reason.lower()
    assert posts == ["/hooks/a"]
