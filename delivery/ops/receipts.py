"""What the receipts say, per provider, over a recent window: how many messages they moved to
``delivered`` and to ``undelivered``, the delivery rate (delivered / both), and the receipt
lag, from the provider's accept (``sent_at``) to the delivered receipt's arrival, p50 and p95
over at most ``sample`` of the most recent ones. Read through ``ix_delivery_receipts_received_at``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from delivery.core.models import Message, Receipt
from delivery.ops.series import percentile

__all__ = ["ReceiptRates", "receipt_rates"]


@dataclass(frozen=True, slots=True)
class ReceiptRates:
    provider: str
    delivered: int
    undelivered: int
    lag_p50: float | None  # seconds, accept -> delivered receipt
    lag_p95: float | None

    @property
    def rate(self) -> float | None:
        """delivered / (delivered + undelivered), None without either."""
        both = self.delivered + self.undelivered
        return self.delivered / both if both else None


def receipt_rates(
    session: Session, since: dt.datetime, *, sample: int = 20000
) -> list[ReceiptRates]:
    """Per provider, what the receipts received since ``since`` moved (module docstring)."""
    moved = (Receipt.received_at >= since, Receipt.effect == "moved")
    counts = session.execute(
        select(Receipt.provider, Receipt.status, func.count())
        .where(*moved, Receipt.status.in_(("delivered", "undelivered")))
        .group_by(Receipt.provider, Receipt.status)
    ).all()
    lags: dict[str, list[float]] = {}
    for provider, received, sent in session.execute(
        select(Receipt.provider, Receipt.received_at, Message.sent_at)
        .join(Message, Message.id == Receipt.message_id)
        .where(*moved, Receipt.status == "delivered", Message.sent_at.is_not(None))
        .order_by(Receipt.received_at.desc())
        .limit(sample)
    ):
        if sent is not None:
            lags.setdefault(provider, []).append(max(0.0, (received - sent).total_seconds()))
    found: dict[str, dict[str, int]] = {}
    for provider, status, n in counts:
        found.setdefault(provider, {})[status] = int(n)
    return [
        ReceiptRates(
            provider,
            by.get("delivered", 0),
            by.get("undelivered", 0),
            percentile(lags.get(provider, []), 50),
            percentile(lags.get(provider, []), 95),
        )
        for provider, by in sorted(found.items())
    ]
