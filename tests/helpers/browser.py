"""A real headless browser for the status page's tests: Debian's ``chromium`` (``apt-get install -y
chromium``), run as a process per page with its own profile folder, bounded in time.

``chromium_or_skip`` skips the calling test, saying why, where no chromium binary is found (CI machines may
lack it). ``load`` renders a URL after its scripts ran and returns the DOM, with a screenshot beside it;
``Dom`` reads what the tests assert on: tables by id, SVG polylines, text by id.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
RUN_SCRIPTS_MS = 4000  # virtual time the page's scripts get before the DOM is taken
LOAD_TIMEOUT_S = 60.0


def chromium_or_skip() -> str:
    """The browser's path, or skip the test with the reason."""
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.skip(f"no headless browser ({', '.join(BROWSERS)} not on PATH): apt-get install -y chromium")
    return found


def load(
    browser: str, url: str, work_dir: Path, name: str = "page", run_scripts_ms: int = RUN_SCRIPTS_MS
) -> tuple[Dom, Path]:
    """``url`` rendered by ``browser`` after its scripts ran for ``run_scripts_ms`` of virtual time (timers
    fire at once, network waits pause it): its DOM, and the path of its screenshot (``work_dir/<name>.png``,
    kept as the test's artifact)."""
    shot = work_dir / f"{name}.png"
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={work_dir / 'profile'}",
            f"--virtual-time-budget={run_scripts_ms}", "--window-size=1200,1400"]  # fmt: skip
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=LOAD_TIMEOUT_S)
    assert dom.returncode == 0 and dom.stdout, dom.stderr[-2000:]
    subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=LOAD_TIMEOUT_S)
    assert shot.exists(), f"no screenshot of {url}"
    return Dom.parse(dom.stdout), shot


@dataclass
class Dom:
    """What the tests read of a dumped DOM: each table's rows of cell texts (by table id), each SVG
    polyline's attributes, each element's text by id, and every tag seen."""

    tables: dict[str, list[list[str]]] = field(default_factory=dict)
    polylines: list[dict[str, str]] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, html: str) -> Dom:
        reader = _Reader()
        reader.feed(html)
        return reader.dom


VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.dom = Dom()
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._open: list[tuple[str, str | None, list[str]]] = []  # (tag, id, text) of open elements

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        self.dom.tags.add(tag)
        if tag == "table" and attrs.get("id"):
            self._table = attrs["id"]
            self.dom.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
            self.dom.tables[self._table].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "polyline":
            self.dom.polylines.append(attrs)
        if tag not in VOID_TAGS:
            self._open.append((tag, attrs.get("id"), []))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = self._row = None
        while any(open_tag == tag for open_tag, _, _ in self._open):
            open_tag, element_id, text = self._open.pop()
            if element_id:
                self.dom.texts[element_id] = "".join(text).strip()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for _, element_id, text in self._open:
            if element_id:
                text.append(data)
