"""The status page (`GET /ui`, docs/operations.md "Status page") in a real browser.

Headless Chromium (Debian's `chromium`; `make test` installs it) loads the page from a live
scout daemon; the test reads, over Chromium's DevTools protocol, the DOM the page's scripts
rendered, which is what a person would see: scout's row says `ready`, and a request made during the test shows up
in the recent requests and in the live events (from `/logz/stream`). A screenshot is saved under
the test's temp dir.
"""

from __future__ import annotations

import asyncio
import base64
import json
import queue
import shutil
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest
from scout_daemon import start_scout

INSTALL = ("headless Chromium is needed for the status-page test and was not found on PATH. "
           "Install Debian's package: `sudo apt-get install -y chromium` (as root: `apt-get install -y "
           "chromium`; `make test` does this when it can). Without root, install any Chromium or Chrome build "
           "and put its binary on PATH as `chromium`.")
RENDER_DEADLINE_S = 60.0   # bound on waiting until the page shows what the daemon already knows
BROWSER_DEADLINE_S = 60.0  # bound on Chromium starting and answering one DevTools command


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(INSTALL, pytrace=False)


class Browser:
    """Headless Chromium driven over its DevTools protocol (a WebSocket; aiohttp's client), so
    the page runs in real time with its polling and its event stream, as it does for a person."""

    def __init__(self, profile: Path) -> None:
        self.process = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                                         "--no-first-run", "--hide-scrollbars", "--window-size=1280,900",
                                         f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.endpoint: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            browser_ws = self.endpoint.get(timeout=BROWSER_DEADLINE_S)
        except queue.Empty:
            self.close()
            raise AssertionError("Chromium did not start: " + "".join(self.lines)[-4000:]) from None
        self.http = "http://" + browser_ws.split("/")[2]

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            if line.startswith("DevTools listening on "):
                self.endpoint.put(line.split()[-1])

    async def page(self, session: aiohttp.ClientSession):
        async with session.get(self.http + "/json/list") as response:
            targets = await response.json()
        [target] = [t for t in targets if t["type"] == "page"]
        return await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=BROWSER_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class DevTools:
    """One page's DevTools session: `call(method, **params)` returns the command's result."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        async with asyncio.timeout(BROWSER_DEADLINE_S):
            while True:
                message = json.loads((await self.ws.receive()).data)
                if message.get("id") == self.next_id:
                    assert "error" not in message, message
                    return message["result"]


async def load_and_wait(browser: Browser, url: str, shown, screenshot: Path) -> "Page":
    """Open `url`, read the rendered DOM until `shown(page)` (or the deadline), save a screenshot."""
    async with aiohttp.ClientSession() as session:
        tools = DevTools(await browser.page(session))
        await tools.call("Page.navigate", url=url)
        deadline = time.monotonic() + RENDER_DEADLINE_S
        while True:
            result = await tools.call("Runtime.evaluate", expression="document.documentElement.outerHTML")
            page = Page(result["result"].get("value", ""))  # no value while the navigation replaces the document
            if shown(page) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)  # the page polls every 1.5 s; the deadline bounds the wait
        shot = await tools.call("Page.captureScreenshot", format="png")
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        await tools.ws.close()
        return page


class Page(HTMLParser):
    """Cell texts of each table's body rows (by table id) and the event list's items."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.events: list[str] = []
        self._table: str | None = None
        self._in_body = False
        self._cell: list[str] | None = None
        self._item: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
            self.tables.setdefault(self._table, [])
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.tables[self._table].append([])
        elif tag == "td" and self._in_body:
            self._cell = []
        elif tag == "li":
            self._item = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "li" and self._item is not None:
            self.events.append("".join(self._item))
            self._item = None

    def handle_data(self, data):
        for part in (self._cell, self._item):
            if part is not None:
                part.append(data)


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    server = start_scout(tmp_path_factory.mktemp("status-page"))
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.output)


def test_page_shows_scout_ready_and_a_request_made_now(scout, tmp_path):
    tokenized = scout.request("POST", "/tokenize", {"model": "scout", "content": "status page"})
    assert tokenized.status == 200, tokenized.body
    entries = [json.loads(line) for line in scout.request("GET", "/logz?limit=1000").body.splitlines()]
    [made] = [e for e in entries if e["event"] == "request" and e["kind"] == "tokenize"]
    url = f"http://127.0.0.1:{scout.port}/ui"
    marker = f"request={made['request']} "

    def rows(page: Page, table: str) -> dict[str, list[str]]:
        return {row[0]: row for row in page.tables.get(table, []) if row}

    def shown(page: Page) -> bool:
        return (rows(page, "registrations").get("scout", [None] * 3)[2] == "ready"
                and str(made["request"]) in rows(page, "requests") and any(marker in e for e in page.events))

    browser = Browser(tmp_path / "profile")
    try:
        shot = tmp_path / "status-page.png"
        page = asyncio.run(load_and_wait(browser, url, shown, shot))
    finally:
        browser.close()
    assert rows(page, "registrations")["scout"][1:3] == ["text", "ready"], page.tables
    assert rows(page, "requests")[str(made["request"])][1:3] == ["scout", "tokenize"], page.tables
    assert any(marker in e and "kind=tokenize" in e for e in page.events), page.events
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_page_assets_are_served_from_the_package(scout):
    """The page needs nothing from outside: its HTML names only its own files under /ui."""
    html = scout.request("GET", "/ui").body.decode()
    assert 'src="/ui/status.js"' in html and 'href="/ui/status.css"' in html
    assert "http://" not in html and "https://" not in html
    for path, kind in (("/ui", "text/html"), ("/ui/status.js", "text/javascript"), ("/ui/status.css", "text/css")):
        response = scout.request("GET", path)
        assert response.status == 200 and response.headers["content-type"].startswith(kind), path
