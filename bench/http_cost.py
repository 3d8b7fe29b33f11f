"""HTTP cost: CPU of this process per POST to the stub, by the way the request is sent.

- ``httpx``: ``httpx.Client.post`` on httpx's default transport, the body read whole and its
  JSON parsed (what the Celery-alone task does);
- ``adapter``: ``HttpProvider.send``, the shipped path: the provider's ``httpx.Client``
  (``PooledClient._exchange``: ``build_request`` then ``send(stream=True)``), the body read
  raw within the limit and the deadline, the outcome classified;
- ``transport``: the floor on that transport: an ``httpx.Request`` built per POST (JSON body,
  the timeout extension) handed to ``httpx.HTTPTransport.handle_request``, the body read whole
  and its JSON parsed: what is left when every layer of ours and of the Client is gone.

Sequential, one keep-alive connection each, in blocks of 500 interleaved for ``--rounds``
rounds (the first dropped); the figure is the median ms of CPU (user + system, so the
kernel's loopback work is in it) per request. The stub is its own process.

    python -m bench.http_cost [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import httpx

from bench.common import STUB_URL, median, report, row, session
from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import Delivered
from delivery.providers.base import Envelope
from delivery.providers.client import timeout
from delivery.providers.http import HttpProvider

BLOCK = 500


def _ways() -> dict[str, Callable[[int], object]]:
    config = ProviderConfig("stub", "http", STUB_URL, Timeouts())
    plain = httpx.Client(base_url=STUB_URL, headers={"User-Agent": "celery-alone/0.1"})
    adapter = HttpProvider(config)
    bare = httpx.HTTPTransport()
    url = httpx.URL(f"{STUB_URL}/v1/messages")
    timeouts = timeout(config.timeouts).as_dict()
    run = f"{os.getpid()}-{time.time_ns()}"

    def envelope(way: str, i: int) -> Envelope:
        return Envelope(f"{way}-{run}-{i}", "sms", "+12015550123", {"body": f"code {i}"})

    def post_plain(i: int) -> object:
        key = f"httpx-{run}-{i}"
        body = {"to": "+12015550123", "body": f"code {i}"}
        r = plain.post("/v1/messages", json=body, headers={"Idempotency-Key": key})
        return Delivered(r.json()["id"], r.status_code) if r.status_code == 201 else r

    def post_bare(i: int) -> object:
        key = f"transport-{run}-{i}"
        body = json.dumps({"to": "+12015550123", "body": f"code {i}"}, separators=(",", ":"))
        request = httpx.Request(
            "POST",
            url,
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
            content=body.encode(),
            extensions={"timeout": dict(timeouts)},
        )
        r = bare.handle_request(request)
        try:
            content = r.read()
        finally:
            r.close()
        return Delivered(json.loads(content)["id"], r.status_code) if r.status_code == 201 else r

    return {
        "httpx": post_plain,
        "adapter": lambda i: adapter.send(envelope("adapter", i)),
        "transport": post_bare,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    with session() as procs:
        procs.stub()
        ways = _ways()
        samples: dict[str, list[float]] = {name: [] for name in ways}
        n = 0
        for round_ in range(args.rounds + 1):
            for name, send in ways.items():
                started = time.process_time()
                for _ in range(BLOCK):
                    outcome = send(n)
                    n += 1
                    if not isinstance(outcome, Delivered):
                        raise SystemExit(f"{name}: {outcome!r}")
                if round_:  # the first round warms connections and caches
                    samples[name].append((time.process_time() - started) / BLOCK * 1000)
    ms = {name: round(median(values), 4) for name, values in samples.items()}
    load_after = os.getloadavg()
    figures = {
        "rounds": args.rounds,
        "block": BLOCK,
        "ms": ms,
        "samples": samples,
        "load": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in load_after],
    }
    where = f"load {' '.join(f'{x:.2f}' for x in load)}"
    rows = [
        row(
            "CPU per POST: the adapter's path vs httpx.Client.post, both on httpx's transport",
            ms["adapter"] / ms["httpx"],
            "(cost)",
            None,
            f"{ms['adapter']:.3f} ms; {where}",
            f"httpx.Client.post {ms['httpx']:.3f} ms",
        ),
        row(
            "CPU per POST: the adapter's path vs the bare transport (the floor)",
            ms["adapter"] / ms["transport"],
            "(cost)",
            None,
            f"{ms['adapter']:.3f} ms; {where}",
            f"httpx.HTTPTransport.handle_request {ms['transport']:.3f} ms",
        ),
    ]
    report("http_cost", figures, rows)


if __name__ == "__main__":
    main()
