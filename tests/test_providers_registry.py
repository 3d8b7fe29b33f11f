"""Finding adapters by kind (registry, entry point, dotted path), their own config keys and
default policies, and the custom adapter example of docs/providers.md, run as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from delivery.config.settings import ProviderConfig
from delivery.core.outcomes import Delivered, LookupFailed, Permanent, Retryable
from delivery.core.policies import UnknownPolicy
from delivery.errors import ConfigError
from delivery.providers import REGISTRY, Envelope, TwilioProvider, build_provider
from tests.provider_stubs import Reply, StubServer, settings_with

PROVIDERS_DOC = Path(__file__).resolve().parents[1] / "docs" / "providers.md"
TWILIO = {
    "kind": "twilio",
    "account_sid": "AC0123456789abcdef0123456789abcdef",
    "auth_token_env": "TEST_TWILIO_TOKEN",
    "from_number": "+15005550006",
}


def documented_example() -> tuple[str, dict[str, Any]]:
    """The Python and TOML blocks of the "Your own adapter" section of docs/providers.md."""
    text = PROVIDERS_DOC.read_text()
    section = text.split("\n## Your own adapter\n", 1)[1].split("\n## ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    assert python and toml, "docs/providers.md's adapter section lost its example"
    return python.group(1), tomllib.loads(toml.group(1))


def config_error(providers: dict[str, Any], channels: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        settings_with(providers, channels)
    return err.value.key


def test_readme_custom_adapter_works_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented adapter module, loaded by the dotted path in its TOML, gets its own key
    from config.options, sends with our key and bearer secret, and maps answers to outcomes."""
    code, data = documented_example()
    (tmp_path / "acme_sms.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACME_API_KEY", "acme-secret")
    with StubServer() as stub:
        table = {**data["providers"]["acme"], "base_url": stub.url}
        settings = settings_with({"acme": table}, {"sms": {"provider": "acme"}})
        config = settings.providers["acme"]
        assert config.kind == "acme_sms:AcmeSms" and config.options == {"sender": "ACME"}
        assert settings.channels["sms"].on_unknown is UnknownPolicy.RETRY
        stub.push(
            Reply(201, {"ok": True}, headers={"Acme-Ref": "acme-1"}),
            Reply(503, body="busy", headers={"Retry-After": "2"}),
            Reply(400, body="bad number"),
        )
        provider = build_provider(config)
        envelope = Envelope("otp-7", "sms", "+12015550123", {"body": "code 1"})
        outcomes = [provider.send(envelope) for _ in range(3)]
        lookup = provider.lookup(envelope)
        provider.close()
        request = stub.sent()[0]
    assert outcomes == [
        Delivered("acme-1", 201),
        Retryable("HTTP_503", "busy", 503, 2.0),
        Permanent("HTTP_400", "bad number", 400),
    ]
    assert isinstance(lookup, LookupFailed)
    assert request.path == "/sms" and request.headers["x-request-id"] == "otp-7"
    assert request.headers["authorization"] == "Bearer acme-secret"
    assert request.json() == {"to": "+12015550123", "from": "ACME", "text": "code 1"}


def test_entry_point_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind named by an installed distribution's entry point in group delivery.providers
    resolves to that adapter."""
    code, _ = documented_example()
    (tmp_path / "acme_plugin.py").write_text(code)
    info = tmp_path / "acme_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[delivery.providers]\nacme-ep = acme_plugin:AcmeSms\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = {"kind": "acme-ep", "base_url": "http://127.0.0.1:9", "sender": "X"}
    config = settings_with({"acme": table}).providers["acme"]
    provider = build_provider(config)
    provider.close()
    assert type(provider).__module__ == "acme_plugin" and config.options == {"sender": "X"}


def test_registry_entries_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter an app puts in REGISTRY is used for its kind."""

    class Echo:
        def __init__(self, config: ProviderConfig) -> None:
            self.name = config.name

        def send(self, envelope: Envelope) -> Delivered:
            return Delivered(envelope.key)

        def lookup(self, envelope: Envelope) -> LookupFailed:
            return LookupFailed("NO_LOOKUP", "none")

        def close(self) -> None:
            pass

    monkeypatch.setitem(REGISTRY, "echo", Echo)
    config = settings_with({"e": {"kind": "echo", "base_url": "http://127.0.0.1:9"}}).providers["e"]
    assert build_provider(config).send(Envelope("k", "sms", "+1", {})) == Delivered("k")


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("carrier-pigeon", "no adapter for kind 'carrier-pigeon'"),
        ("no_such_module_xyz:Adapter", "cannot load adapter"),
        ("json:NoSuchClass", "cannot load adapter"),
        ("json:__doc__", "is not a class or callable"),
    ],
)
def test_unknown_or_unimportable_kind_names_the_key(kind: str, problem: str) -> None:
    """A kind that is not registered, not an entry point and not an importable callable is a
    ConfigError naming providers.X.kind."""
    with pytest.raises(ConfigError) as err:
        settings_with({"x": {"kind": kind, "base_url": "http://127.0.0.1:9"}})
    assert err.value.key == "providers.x.kind"
    assert problem in err.value.problem


def test_adapter_keys_become_options_and_others_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys an adapter declares land in config.options (type-checked); an undeclared key, a
    wrong type or an adapter's own check fails naming the dotted key."""
    config = settings_with({"t": TWILIO | {"lookup_window": 600}}).providers["t"]
    assert dict(config.options) == {
        "account_sid": "AC0123456789abcdef0123456789abcdef",
        "auth_token_env": "TEST_TWILIO_TOKEN",
        "from_number": "+15005550006",
        "lookup_window": 600.0,
    }
    assert config.base_url == TwilioProvider.default_base_url == "https://api.twilio.com"
    assert config_error({"t": TWILIO | {"bogus": 1}}) == "providers.t.bogus"
    assert config_error({"t": TWILIO | {"lookup_window": "soon"}}) == "providers.t.lookup_window"
    assert config_error({"t": TWILIO | {"account_sid": ""}}) == "providers.t.account_sid"
    assert config_error({"t": {k: v for k, v in TWILIO.items() if k != "account_sid"}}) == (
        "providers.t.account_sid"
    )
    assert (
        config_error({"t": TWILIO | {"messaging_service_sid": "MG1"}}) == "providers.t.from_number"
    )
    assert config_error({"t": TWILIO | {"base_url": "ftp://x"}}) == "providers.t.base_url"
    assert config_error({"t": {"kind": "http"}}) == "providers.t.base_url"
    assert config_error({"t": {"kind": "http", "base_url": "http://x", "secret_env": "X"}}) == (
        "providers.t.secret_env"
    )


def test_channels_take_their_providers_default_policy() -> None:
    """A channel without on_unknown gets its provider kind's default (twilio: lookup, pigeon and
    webhook: retry); an explicit on_unknown wins."""
    providers = {
        "sms": TWILIO,
        "mail": {"kind": "pigeon", "base_url": "http://127.0.0.1:9", "api_key_env": "K"},
        "hooks": {"kind": "webhook", "secret_env": "S"},
    }
    settings = settings_with(
        providers,
        {
            "sms": {"provider": "sms"},
            "email": {"provider": "mail"},
            "webhook": {"provider": "hooks"},
        },
    )
    policies = {name: c.on_unknown for name, c in settings.channels.items()}
    assert policies == {
        "sms": UnknownPolicy.LOOKUP,
        "email": UnknownPolicy.RETRY,
        "webhook": UnknownPolicy.RETRY,
    }
    explicit = settings_with(providers, {"sms": {"provider": "sms", "on_unknown": "give_up"}})
    assert explicit.channels["sms"].on_unknown is UnknownPolicy.GIVE_UP
    assert config_error(providers, {"webhook": {"provider": "hooks", "on_unknown": "lookup"}}) == (
        "channels.webhook.on_unknown"
    )
