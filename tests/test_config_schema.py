"""The config file's schema (``delivery.config.schema``) and ``delivery config``: every number
is finite, errors name the key the user wrote, the JSON Schema describes the files we ship and
the example file loads. Pure unit tests and the real CLI; no services."""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from delivery.cli import main
from delivery.config.loading import settings_from_mapping
from delivery.config.schema import json_schema
from delivery.config.settings import CHANNELS, Backoff, Settings, Timeouts
from delivery.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json_schema()


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def example() -> dict[str, Any]:
    result = run("config", "example")
    assert result.exit_code == 0, result.output
    return tomllib.loads(result.output)


def load(data: Mapping[str, Any]) -> Settings:
    return settings_from_mapping(data, database_url="sqlite://", broker_url="x", redis_url=None)


def numeric_keys(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every number or integer the schema allows, as (path, JSON type); ``*`` stands for a
    table's own name (``providers.*.timeouts.read``)."""
    if "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rpartition("/")[2]]
    for option in node.get("anyOf", []):
        yield from numeric_keys(option, path)
    if node.get("type") in ("number", "integer"):
        yield path, node["type"]
    for key, child in node.get("properties", {}).items():
        yield from numeric_keys(child, (*path, key))
    if isinstance(node.get("additionalProperties"), dict):
        yield from numeric_keys(node["additionalProperties"], (*path, "*"))


def placed(base: dict[str, Any], path: tuple[str, ...], value: float) -> Iterator[tuple[str, Any]]:
    """``base`` with ``value`` at ``path``, once for each name ``*`` takes in ``base``."""
    if "*" in path:
        at = path.index("*")
        table: dict[str, Any] = base
        for part in path[:at]:
            table = table.get(part, {})
        for name in table:
            yield from placed(base, (*path[:at], name, *path[at + 1 :]), value)
        return
    data = copy.deepcopy(base)
    table = data
    for part in path[:-1]:
        table = table.setdefault(part, {})
    table[path[-1]] = value
    yield ".".join(path), data


KEYS = sorted(set(numeric_keys(SCHEMA)))


def test_the_schema_lists_the_numbers_of_every_table() -> None:
    """The walk below reaches every kind of table (so the NaN test covers them): [delivery],
    [timeouts], a provider's breaker and its adapter's own keys, a channel, a type's backoff."""
    paths = {".".join(path) for path, _ in KEYS}
    assert {
        "delivery.send_lease",
        "timeouts.read",
        "backoff.cap",
        "providers.*.timeouts.read",
        "providers.*.breaker.failure_rate",
        "providers.*.rate_limit",
        "providers.*.lookup_window",
        "channels.sms.max_attempts",
        "types.*.ttl",
        "types.*.backoff.base",
    } <= paths
    assert len(paths) >= 38  # 11 + 2 + 4 + 14 + 3 + 4 today
    assert set(SCHEMA["$defs"]["Channels"]["properties"]) == set(CHANNELS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize(("path", "kind"), [pytest.param(*k, id=".".join(k[0])) for k in KEYS])
def test_nan_and_infinities_are_refused_naming_the_key(
    path: tuple[str, ...], kind: str, value: float
) -> None:
    """NaN, inf and -inf in any number of the file (the list comes from the schema) are
    refused naming the dotted key the user wrote: a number as not finite, an integer as not an
    integer. Where a key belongs to one adapter only (``lookup_window``: twilio) the other
    providers refuse it as unknown, still naming it; at least one must find it not finite."""
    wrong = {"number": "must be a finite number", "integer": "must be an integer"}[kind]
    problems = []
    for key, data in placed(example(), path, value):
        with pytest.raises(ConfigError) as caught:
            load(data)
        assert caught.value.key == key and "\n" not in str(caught.value)
        problems.append(caught.value.problem)
    assert wrong in problems, problems
    assert all(p == wrong or p.startswith("unknown key") for p in problems), problems


def test_nan_in_a_file_is_refused_by_config_check(tmp_path: Path) -> None:
    """``read = nan`` written in TOML (the case that used to load) fails ``config check`` with
    one line naming ``timeouts.read``, exit 2; ``inf`` the same, not ``delivery.send_lease``."""
    path = tmp_path / "delivery.toml"
    for value in ("nan", "inf", "-inf"):
        path.write_text(f"[timeouts]\nread = {value}\n")
        result = run("config", "check", str(path), env={"DELIVERY_CONFIG": ""})
        assert result.exit_code == 2
        assert result.output == "error: config timeouts.read: must be a finite number\n"


def test_schema_is_a_json_schema_the_shipped_files_satisfy() -> None:
    """``delivery config schema`` prints a valid JSON Schema that deploy/delivery.toml and the
    example satisfy, and that refuses an unknown key and an unknown policy (so it checks)."""
    result = run("config", "schema")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    deploy = tomllib.loads((ROOT / "deploy" / "delivery.toml").read_text())
    for document in (deploy, example()):
        assert list(validator.iter_errors(document)) == []
    assert not validator.is_valid({**deploy, "delivery": {"max_atempts": 3}})
    assert not validator.is_valid({"channels": {"sms": {"provider": "s", "on_unknown": "retyr"}}})
    assert not validator.is_valid({"timeouts": {"read": -1}})


def test_example_passes_config_check(tmp_path: Path) -> None:
    """``delivery config example`` is a file ``delivery config check`` accepts, with the three
    channels and the three message types, whose [delivery], [backoff] and [timeouts] values are
    today's defaults (it says so)."""
    text = run("config", "example").output
    path = tmp_path / "delivery.toml"
    path.write_text(text)
    result = run("config", "check", str(path))
    assert (result.exit_code, result.output) == (0, "ok\n")
    settings = load(tomllib.loads(text))
    assert set(settings.channels) == {"sms", "email", "webhook"}
    assert set(settings.types) == {"otp", "receipt", "marketing"}
    defaults = Settings(database_url="sqlite://", broker_url="x")
    for key, value in tomllib.loads(text)["delivery"].items():
        assert getattr(defaults, key) == value, key
    assert Backoff(**tomllib.loads(text)["backoff"]) == Backoff()
    assert Timeouts(**tomllib.loads(text)["timeouts"]) == Timeouts()


def test_config_check_names_an_environment_variable() -> None:
    """``config check`` checks the environment too: a database URL without a broker is one
    line naming DELIVERY_BROKER_URL, exit 2."""
    env = {"DELIVERY_DATABASE_URL": "sqlite:///x.db", "DELIVERY_BROKER_URL": ""}
    result = run("config", "check", env=env)
    assert result.exit_code == 2
    assert result.output.startswith("error: config DELIVERY_BROKER_URL: is not set while")
    assert result.output.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[timeouts]\nread = 100\n", "timeouts.read"),
        (
            '[providers.s]\nkind = "http"\nbase_url = "http://x"\n[providers.s.timeouts]\n'
            "read = 100\n",
            "providers.s.timeouts.read",
        ),
        ("[delivery]\nsend_lease = 20\n[timeouts]\nread = 30\n", "delivery.send_lease"),
        (
            '[timeouts]\nread = 100\n[providers.s]\nkind = "http"\nbase_url = "http://x"\n'
            "[providers.s.timeouts]\nconnect = 1\n",
            "timeouts.read",
        ),
        ("[delivery]\nrelay_interval = 5\n", "delivery.relay_interval"),
        ("[backoff]\nbase = 500\n", "backoff.base"),
        ("[delivery]\nsend_lease = 30\nhold_lease = 40\n", "delivery.hold_lease"),
    ],
)
def test_a_check_across_keys_names_the_key_the_user_set(text: str, key: str) -> None:
    """A check across keys names a key the file sets, never a default it did not write:
    ``read = 100`` alone names timeouts.read (not send_lease), ``relay_interval = 5`` alone
    names relay_interval (not dispatch_lease), ``base = 500`` alone names base (not cap)."""
    with pytest.raises(ConfigError) as caught:
        load(tomllib.loads(text))
    assert caught.value.key == key


def test_options_given_as_any_mapping_load_like_a_file() -> None:
    """``DELIVERY_OPTIONS`` from a framework's settings may nest any mapping (not only dicts):
    it is checked as the same TOML tables would be."""
    from types import MappingProxyType as Frozen

    provider = Frozen({"kind": "http", "base_url": "http://x/", "timeouts": Frozen({"read": 2})})
    settings = load(Frozen({"providers": Frozen({"p": provider})}))
    assert settings.providers["p"].base_url == "http://x"
    assert settings.providers["p"].timeouts.read == 2.0
