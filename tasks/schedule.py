"""Beat tasks: ``delivery.relay`` (publish due rows) and ``delivery.sweep`` (expired leases
and time-to-live)."""

from __future__ import annotations

from dataclasses import asdict

from delivery.pipeline.relay import relay_once
from delivery.pipeline.sweeper import sweep as sweep_once
from tasks.app import app, service
from tasks.deliver import publish

__all__ = ["relay", "sweep"]


@app.task(name="delivery.relay", ignore_result=True, acks_late=False)  # type: ignore[untyped-decorator]
def relay() -> int:
    svc = service()
    return relay_once(
        svc.engine, publish, batch=svc.settings.relay_batch, lease=svc.settings.dispatch_lease
    )


@app.task(name="delivery.sweep", ignore_result=True, acks_late=False)  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    return asdict(sweep_once(service().engine))
