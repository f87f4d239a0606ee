"""The status page: one self-contained HTML file (``status_page.html``: no CDN, no build step, it works
offline) that shows a node's or a bootstrap's page data.

The data is a dict (``node_page``; ``BootstrapCollector.page``) embedded in the page as a script literal.
A live page (``/`` of the metrics port, with ``live`` set) then fetches ``/page.json`` every ``REFRESH_S``
and redraws; a saved one (``swarmnode status --html``, ``saved_page``) shows its run folder as of when it
was written. The page's script draws the curves as inline SVG and sets every string as text, never as
markup; the JSON is embedded with ``<``, ``>`` and ``&`` escaped, so no string in it can end the script
element (peers choose some of the strings: ``run_view`` has already made them printable and short).
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path
from typing import Any

from swarmnode.run_view import RunView
from swarmnode.status import read_status

PAGE_FILE = Path(__file__).with_name("status_page.html")  # package data (pyproject.toml)
DATA_MARK = "/*PAGE_DATA*/null"  # where the page's script takes its first data
REFRESH_S = 5.0  # a live page fetches /page.json this often
MAX_PAGE_PEERS = 256  # connected peers a bootstrap's page lists by id


def node_page(
    view: RunView | None, *, live: bool, info: dict | None = None, health: dict | None = None,
    running: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A node's page data: its run folder's ``view`` (None: nothing written yet), and either ``live`` with
    the node's ``info`` and ``health``, or a saved page with the lock's ``running``."""
    return {
        "kind": "node", "live": live, "refresh_s": REFRESH_S, "generated": time.time(), "node": info or {},
        "health": health, "running": running, "view": view.as_dict() if view is not None else None,
    }  # fmt: skip


def bootstrap_page(peer_id: str, peers: list[str], dht: dict, health: dict) -> dict[str, Any]:
    """A bootstrap's page data: the connected ``peers`` (the first MAX_PAGE_PEERS listed), its DHT's
    stats (``Transport.dht_stats``) and its ``health``."""
    return {
        "kind": "bootstrap", "live": True, "refresh_s": REFRESH_S, "generated": time.time(),
        "node": {"peer_id": peer_id}, "health": health, "running": None, "view": None,
        "bootstrap": {"connected": len(peers), "peers": peers[:MAX_PAGE_PEERS], **dht},
    }  # fmt: skip


def saved_page(run_dir: Path) -> dict[str, Any]:
    """The page data of a run folder, running node or not (``swarmnode status --html``)."""
    status = read_status(run_dir)
    return node_page(status.view, live=False, running=status.running)


def render(data: dict[str, Any]) -> str:
    """The page with ``data`` in it."""
    return _template().replace(DATA_MARK, _script_literal(data), 1)


def page_json(data: dict[str, Any]) -> bytes:
    """``/page.json``: what a live page fetches."""
    return json.dumps(data).encode()


@cache
def _template() -> str:
    return PAGE_FILE.read_text()


def _script_literal(data: dict[str, Any]) -> str:
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
