"""``printable``: a peer's string made safe for a terminal, escaped and capped, never cut mid-escape."""

from __future__ import annotations

import unicodedata

from swarmnode.swarm.wire.printable import ELLIPSIS, MAX_PRINTED_CHARS, printable

HOSTILE = (
    "tiny"
    + "\x1b[2J\x07\x7f"  # C0 and DEL (the wire refuses these in model_name; status.json may hold anything)
    + "\x9b31m\x85"  # C1: CSI, NEL
    + "\u202a\u202b\u202c\u202d\u202e"  # bidi embeddings and overrides
    + "\u2066\u2067\u2068\u2069"  # bidi isolates
    + "\u200b\u200c\u200d\u2060\ufeff\u00ad"  # zero-width and other format characters
    + "\u2028\u2029\u00a0"  # line / paragraph separators, a no-break space
    + "\U000e0041\ue000"  # a tag character, private use
)
RAW_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def test_every_control_bidi_and_format_character_is_escaped():
    out = printable(HOSTILE, max_chars=None)
    assert not [c for c in out if unicodedata.category(c) in RAW_CATEGORIES or not c.isprintable()], out
    for escaped in ("\\x1b", "\\x9b", "\\x85", "\\u202e", "\\u2066", "\\u200b", "\\ufeff", "\\u2028",
                    "\\U000e0041"):  # fmt: skip
        assert escaped in out, (escaped, out)
    assert out.startswith("tiny") and printable(out, max_chars=None) == out  # a second pass changes nothing


def test_plain_names_pass_unchanged():
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "embedded:smollm2-135m-instruct", "modèle ü 模型"):
        assert printable(name) == name


def test_long_strings_are_capped_and_never_cut_inside_an_escape():
    assert len(printable("x" * 10_000)) == MAX_PRINTED_CHARS
    for n in range(1, 12):
        out = printable("a" * n + "\u202e" * 100, max_chars=16)
        assert len(out) <= 16 and out.endswith(ELLIPSIS), out
        body = out.removesuffix(ELLIPSIS).lstrip("a")
        assert len(body) % len("\\u202e") == 0 and set(body.split("\\u202e")) <= {""}, out
    assert printable(12345) == "12345"  # not a str: a crafted status.json may hold anything
