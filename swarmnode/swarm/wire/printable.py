"""Peer-chosen text made safe to print: what ``swarmnode status`` passes every peer string through (log
lines quote peers' strings with ``ascii()`` / ``%r``, which escape the same characters).

The wire refuses C0 controls in names (``limits.NO_CONTROL_RE``), but a valid UTF-8 string may still hold
C1 controls (U+0080-U+009F: U+009B is CSI, an escape sequence on many terminals), bidi overrides and
isolates (U+202A-U+202E, U+2066-U+2069: text that reads backwards, "Trojan Source"), zero-width and other
format characters, line and paragraph separators, and it may be long. ``printable`` escapes every
character Python does not call printable (``str.isprintable``: categories Cc, Cf, Cs, Co, Cn, Zl, Zp and
spaces other than U+0020) as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN`` and cuts the result to ``max_chars``
characters ending in ``...``. Its output is printable, so a second pass changes nothing (a whole line may
go through it again after its fields did).
"""

from __future__ import annotations

MAX_PRINTED_CHARS = 128  # a peer's string on a status or log line, escapes included
ELLIPSIS = "..."


def _escape(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object, max_chars: int | None = MAX_PRINTED_CHARS) -> str:
    """``text`` (``str()`` of it if not a str) with every non-printable character escaped, at most
    ``max_chars`` characters long (None: no cap). No escape is ever cut in half."""
    text = text if isinstance(text, str) else str(text)
    if max_chars is None:
        return "".join(map(_escape, text))
    out: list[str] = []
    used = 0
    for ch in text:
        piece = _escape(ch)
        if used + len(piece) > max_chars:
            while out and used + len(ELLIPSIS) > max_chars:  # room for the ellipsis
                used -= len(out.pop())
            return "".join(out) + ELLIPSIS
        out.append(piece)
        used += len(piece)
    return "".join(out)
