"""``/``: counts per status and provider, oldest pending, relay lag, breakers, charts of the
last hour and day, and what the last day's delivery receipts say per provider."""

from __future__ import annotations

import datetime as dt
import functools

from flask import Blueprint, render_template

from delivery import ops
from delivery.console.charts import line_chart
from delivery.console.context import db, state
from delivery.console.pages.breakers import read_breakers
from delivery.core.models import utcnow

__all__ = ["blueprint"]

blueprint = Blueprint("overview", __name__)

_WINDOWS = (("Last hour", 3600.0, 60.0), ("Last day", 86400.0, 900.0))


def chart_ttl(bucket: float) -> float:
    """How long a window's series is reused: half a bucket, at most a minute (the hour's
    per-minute charts are at most 30 s old, the day's at most 60 s)."""
    return min(bucket / 2.0, 60.0)


@blueprint.get("/")
def overview() -> str:
    session = db()
    charts = []
    for title, window, bucket in _WINDOWS:
        data = state().cache.get(
            ("series", window, bucket),
            chart_ttl(bucket),
            functools.partial(ops.series, session, window=window, bucket=bucket),
        )
        assert isinstance(data, ops.Series)
        per = "per minute" if bucket == 60 else f"per minute, {bucket / 60:.0f}-minute buckets"
        charts.append(
            {
                "title": title,
                "outcomes": line_chart(
                    f"sent / dead / unknown ({per})",
                    data.starts,
                    {"sent": data.sent, "dead": data.dead, "unknown": data.unknown},
                ),
                "errors": line_chart(
                    "provider error rate (share of send attempts)", data.starts, data.error_rate
                ),
                "latency": line_chart(
                    "commit -> accept latency (seconds)", data.starts, data.latency, unit=" s"
                ),
            }
        )
    settings = state().settings
    day = utcnow() - dt.timedelta(days=1)
    receipts = state().cache.get(
        ("receipts", 86400.0), 60.0, functools.partial(ops.receipt_rates, session, day)
    )
    breakers, breaker_problem = read_breakers(settings)
    if settings.redis_url is None:
        breaker_problem = "in-process (each worker keeps its own)"
    return render_template(
        "overview.html",
        stats=ops.stats(session),
        by_provider=ops.stats_by_provider(session),
        oldest=ops.oldest_pending_age(session),
        lag=ops.relay_lag(session),
        breakers=breakers,
        breaker_problem=breaker_problem,
        charts=charts,
        receipts=receipts,
    )
