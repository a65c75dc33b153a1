"""The demo page at `/`, end to end in headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import missing
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.server.app import create_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if not os.path.exists(CHROMIUM):
    missing("Debian's chromium is not installed (scripts/test.sh installs it)", module_level=True)


@pytest.fixture(scope="module")
def page(model, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with LiveServer(create_app(lambda: [EncoderEngine(model)])) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        tab = browser.new_page()
        tab.goto(live.url + "/")
        yield tab
        browser.close()


def test_choice_question_shows_bars_answer_confidence_and_time(page, tmp_path_factory):
    page.click("#ask")
    page.wait_for_selector("#answer")
    assert page.inner_text("#answer").startswith("Answer: ")
    assert "confidence" in page.inner_text("#answer")
    bars = page.query_selector_all(".bar")
    assert [b.query_selector(".name").inner_text() for b in bars] == ["billing", "sales", "support"]
    total = sum(float(b.query_selector(".pct").inner_text().rstrip("%")) for b in bars)
    assert abs(total - 100) < 0.5
    assert " ms round trip" in page.inner_text("#timing")
    page.screenshot(path=str(tmp_path_factory.mktemp("shot") / "demo.png"))


def test_score_and_yes_no(page):
    page.select_option("#qtype", "score")
    page.click("#ask")
    page.wait_for_selector("#answer")
    assert page.inner_text("#answer").startswith("Score: ")
    assert len(page.query_selector_all(".bar")) == 4
    page.select_option("#qtype", "noul")
    page.click("#ask")
    page.wait_for_function("(document.querySelector('#answer') || {innerText: ''}).innerText.includes('p(yes)')")
    assert len(page.query_selector_all(".bar")) == 2


def test_errors_are_shown(page):
    page.select_option("#qtype", "choice")
    page.fill("#options", "only one")
    page.click("#ask")
    page.wait_for_selector(".error")
    assert "at least 2 options" in page.inner_text(".error")
