"""The suite's /tmp clean-up removes stranded hivemind sockets and nothing that is still in use."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.helpers.stale_sockets import bound_socket_paths, remove_stale_hivemind_sockets

pytestmark = pytest.mark.skipif(bound_socket_paths() is None, reason="needs Linux's /proc/net/unix")


def _bind(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1)
    return sock


def test_only_stranded_sockets_made_during_the_run_are_removed(tmp_path) -> None:
    older, stranded, live = (str(tmp_path / f"hivemind-{name}.sock") for name in ("old", "dead", "live"))
    _bind(older).close()  # closing a bound socket leaves its file behind, as a SIGKILL does
    os.utime(older, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 1
    _bind(stranded).close()
    listener = _bind(live)
    try:
        removed = remove_stale_hivemind_sockets(since, pattern=str(tmp_path / "hivemind-*.sock"))
        assert removed == [stranded]
        assert not os.path.exists(stranded)
        assert os.path.exists(live) and os.path.exists(older)
    finally:
        listener.close()
