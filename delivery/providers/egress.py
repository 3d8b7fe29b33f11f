"""Where a webhook may connect: the address guard of the ``webhook`` kind (SSRF). What it
refuses, and why ``ssrfguard`` does the work: docs/providers.md, "Webhooks: signatures and
where they may go". This module only turns our settings into its policy (``Egress``) and its
refusals into our words (``blocked``, ``scrub``): a refusal names the refused block, never the
host or address.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from ssrfguard import DEFAULT_DENIED, BlockedAddressError, BlockedURLError, Policy, SSRFGuardError
from ssrfguard.httpx import SafeTransport

from delivery.core.outcomes import Permanent
from delivery.errors import ConfigError

__all__ = ["BLOCKED", "REFUSED", "Egress", "GuardError", "blocked", "scrub"]

BLOCKED = "WEBHOOK_ADDRESS_BLOCKED"
REFUSED = "WEBHOOK_URL_REFUSED"
GuardError = SSRFGuardError  # what the transport raises instead of connecting

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_ANY_PORT = frozenset(range(1, 65536))  # the address is the guard; receivers use any port
_EVERYWHERE = ("0.0.0.0/0", "::/0")
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOST_PATTERN = re.compile(rf"^(\*\.)?({_LABEL}\.)*{_LABEL}$")
_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


@dataclass(frozen=True, slots=True)
class Egress:
    """A webhook provider's reach: refused addresses unless allowlisted; https only or not."""

    allow_hosts: tuple[str, ...] = ()
    allow_networks: tuple[IPNetwork, ...] = ()
    https_only: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Egress:
        """Read ``allow_hosts``, ``allow_networks`` and ``https_only`` from a provider's own
        keys; ``ConfigError(key, problem)`` for a wrong one."""
        hosts = tuple(_host(item, i) for i, item in enumerate(_list(options, "allow_hosts")))
        networks = tuple(
            _network(item, i) for i, item in enumerate(_list(options, "allow_networks"))
        )
        egress = cls(hosts, networks, bool(options.get("https_only", False)))
        try:
            egress.policy()
        except ValueError as exc:  # e.g. an allowed network inside a translation prefix
            raise ConfigError("allow_networks", str(exc)) from None
        return egress

    def trusts(self, host: str) -> bool:
        """Whether ``host`` is on ``allow_hosts`` (its addresses are then not checked)."""
        host = host.lower().rstrip(".")
        return any(
            host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
            for pattern in self.allow_hosts
        )

    def policy(self) -> Policy:
        """The ``ssrfguard`` policy for hosts that are not on ``allow_hosts``."""
        return _policy(self.allow_networks, self.https_only)

    def refusal(self, url: str) -> str | None:
        """Why ``url`` can never be sent to, as far as that is known without DNS; else None.

        Refused here: a scheme other than https under ``https_only``, a host that is a literal
        address the policy refuses (``127.0.0.1``, ``[::ffff:127.0.0.1]``, ``2130706433``),
        ``localhost`` and ``*.localhost`` (RFC 6761: always loopback) unless loopback is
        allowlisted. The text never repeats the URL.
        """
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        if self.https_only and parts.scheme.lower() != "https":
            return "must be an https URL (the provider has https_only = true)"
        if self.trusts(host):
            return None
        if host == "localhost" or host.endswith(".localhost"):
            policy = self.policy()
            if not any(policy.permits_address(address) for address in _LOOPBACK):
                return "names localhost, which is always loopback; " + _HINT
            return None
        try:
            self.policy().check_url(url)
        except BlockedURLError as exc:
            return _describe(exc, host)
        return None

    def transport(self) -> httpx.BaseTransport:
        """An httpx transport that resolves once, checks every answer and connects to a
        checked one; hosts on ``allow_hosts`` go through one that permits every address."""
        return _Guarded(self)


class _Guarded(httpx.BaseTransport):
    """Sends each request through the strict transport, or the open one for trusted hosts."""

    def __init__(self, egress: Egress) -> None:
        self._egress = egress
        self._strict = SafeTransport(policy=egress.policy())
        self._open = (
            SafeTransport(policy=_policy(_EVERYWHERE, egress.https_only))
            if egress.allow_hosts
            else None
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.raw_host.decode("ascii")
        if self._open is not None and self._egress.trusts(host):
            return self._open.handle_request(request)
        return self._strict.handle_request(request)

    def close(self) -> None:
        self._strict.close()
        if self._open is not None:
            self._open.close()


def blocked(exc: SSRFGuardError, host: str) -> Permanent:
    """A refusal of the guard as a permanent outcome; the reason names no host or address."""
    address_level = isinstance(exc, BlockedAddressError) or isinstance(
        exc.__cause__, BlockedAddressError
    )
    return Permanent(BLOCKED if address_level else REFUSED, _describe(exc, host))


_HINT = "allowlist an internal receiver with allow_hosts or allow_networks"
_ADDRESS = re.compile(r"\[[0-9A-Fa-f:.]+\](:\d+)?|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b")


def scrub(text: str, host: str) -> str:
    """``text`` without the receiver's host or any IP address (the guard's connection errors
    list the addresses it tried): what is stored of a network error names no recipient."""
    if host:
        text = text.replace(host, "the receiver")
    return _ADDRESS.sub("(address)", text)


def _describe(exc: SSRFGuardError, host: str) -> str:
    """The refusal in our words: the refused block (name, network, RFC), not the address."""
    address = exc if isinstance(exc, BlockedAddressError) else exc.__cause__
    if isinstance(address, BlockedAddressError):
        try:
            verdict = DEFAULT_DENIED.classify(address.address)
        except ValueError:  # a name: several answers were refused
            if "both permitted and denied" in address.reason:
                return (
                    "the receiver's name resolves to both public and refused addresses "
                    "(the signature of DNS rebinding), so it is refused whole"
                )
            return "every address the receiver's name resolves to is refused; " + _HINT
        block = verdict.block
        what = f"{block.name} ({block.network}, {block.rfc})" if block else "a refused block"
        via = " inside " + verdict.chain[0][0].name if verdict.chain else ""
        return f"the receiver's address is in {what}{via}; {_HINT}"
    if isinstance(exc, BlockedURLError):
        reason = exc.reason
        if host:
            reason = reason.replace(repr(host), "the host").replace(host, "the host")
        return f"the URL is refused: {reason}"
    return "refused by the webhook address guard"


@functools.lru_cache(maxsize=64)
def _policy(networks: tuple[IPNetwork | str, ...], https_only: bool) -> Policy:
    return Policy(
        allowed_schemes=frozenset({"https"} if https_only else {"http", "https"}),
        allowed_networks=tuple(ipaddress.ip_network(n) for n in networks),
        allowed_ports=_ANY_PORT,
        max_redirects=0,  # never followed: a 3xx is the receiver's final answer
    )


def _list(options: Mapping[str, Any], key: str) -> list[Any]:
    value = options.get(key, [])
    if not isinstance(value, list | tuple):
        raise ConfigError(key, "must be a list of strings")
    return list(value)


def _host(item: Any, index: int) -> str:
    if not isinstance(item, str):
        raise ConfigError("allow_hosts", f"item {index} must be a string")
    host = item.strip().lower().rstrip(".")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        raise ConfigError("allow_hosts", f"item {index} is an address: list it in allow_networks")
    if not _HOST_PATTERN.match(host):
        raise ConfigError(
            "allow_hosts",
            f"item {index} ({item!r}) is not a host name or '*.suffix' (ASCII; punycode for IDN)",
        )
    return host


def _network(item: Any, index: int) -> IPNetwork:
    if not isinstance(item, str):
        raise ConfigError("allow_networks", f"item {index} must be a string")
    try:
        return ipaddress.ip_network(item.strip())
    except ValueError as exc:
        raise ConfigError(
            "allow_networks", f"item {index} ({item!r}) is not a network such as 10.0.0.0/8: {exc}"
        ) from None
