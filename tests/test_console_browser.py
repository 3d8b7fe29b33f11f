"""The console in a real browser (Debian's chromium driven by playwright) against the whole
pipeline: log in, find a dead message by key, press redrive, confirm, and see it ``sent`` once
a real worker delivered it. Screenshots of the overview and of the message page are written
to ``test-output/`` (or ``$DELIVERY_TEST_OUTPUT``).

Skips without chromium or playwright on a developer's machine; fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import delivery
from delivery.core.models import Message
from delivery.runtime.db import make_sessionmaker
from delivery.testing.processes import ServiceProcess
from tests.conftest import IN_CI, RUN_DIR, free_port, wait_until
from tests.factories import add

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = Path(os.environ.get("DELIVERY_TEST_OUTPUT", ROOT / "test-output"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
USER, PASSWORD = "ops", "browser-test-password"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _need(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is missing (CI=true: the browser test is required)")
    pytest.skip(f"{what} is missing")


@pytest.fixture
def console_url(live: Engine) -> Iterator[str]:
    """``delivery console`` as a real process on a free port, on the suite's outbox."""
    port = free_port()
    env = dict(os.environ, DELIVERY_CONSOLE_AUTH=f"{USER}:{PASSWORD}")
    process = ServiceProcess(
        "console",
        [sys.executable, "-m", "delivery.cli", "console", "--port", str(port)],
        log=RUN_DIR / "console.log",
        ready="delivery console on",
        env=env,
        cwd=ROOT,
    ).start()
    yield f"http://127.0.0.1:{port}"
    process.stop()


def test_operator_redrives_a_dead_message_in_the_browser(console_url: str, live: Engine) -> None:
    """Log in, search the dead message's key, open it, press Redrive, confirm: the page then
    shows it sent (a real worker delivered it through the stub) and the redrive in its
    timeline; the overview and message page screenshots are written."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright (pip install playwright)")
    if not Path(CHROMIUM).exists():
        _need("chromium (apt-get install chromium)")
    sessions = make_sessionmaker(live)
    with sessions() as session:
        for i in range(6):
            delivery.enqueue(
                session,
                channel="sms",
                to=f"+1201555010{i}",
                payload={"body": f"hello {i}"},
                key=f"browser-warmup-{i}:otp",
            )
        session.commit()
        dead = add(session, "order-4242:receipt", "dead", last_error_code="503")
        dead_id = dead.id
    wait_until(lambda: _status(live, "browser-warmup-5:otp") == "sent", 60)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(
                http_credentials={"username": USER, "password": PASSWORD},
                viewport={"width": 1360, "height": 900},
            )
            page = context.new_page()
            page.goto(console_url + "/")
            page.get_by_role("heading", name="Overview").wait_for()
            page.screenshot(path=str(OUTPUT / "console-overview.png"), full_page=True)
            page.get_by_label("find by key").fill("order-4242:receipt")
            page.get_by_label("find by key").press("Enter")
            page.get_by_role("link", name="order-4242:receipt").click()
            page.get_by_role("link", name="Redrive").click()
            assert "same key" in page.locator(".explain").inner_text()
            page.get_by_role("button", name="Confirm: redrive").click()
            page.get_by_text("Redrive: done").wait_for()
            for _ in range(120):
                if page.locator("h1 .badge").inner_text() == "sent":
                    break
                page.wait_for_timeout(500)
                page.reload()
            assert page.locator("h1 .badge").inner_text() == "sent"
            assert "redrive by console:ops" in page.content()
            page.screenshot(path=str(OUTPUT / "console-message.png"), full_page=True)
        finally:
            browser.close()
    with Session(live) as session:
        message = session.get(Message, dead_id)
        assert message is not None and message.status == "sent"
        assert session.scalar(text("SELECT count(*) FROM delivery_audit")) == 1
    assert (OUTPUT / "console-overview.png").stat().st_size > 10_000
    assert (OUTPUT / "console-message.png").stat().st_size > 10_000


def _status(engine: Engine, key: str) -> str | None:
    with Session(engine) as session:
        return session.scalar(select(Message.status).where(Message.key == key))
