"""The suite's /tmp clean-up removes stranded sockets and nothing that is still in use."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.helpers.stranded_sockets import bound_socket_paths, remove_stranded_sockets

pytestmark = pytest.mark.skipif(bound_socket_paths() is None, reason="needs Linux's /proc/net/unix")


def _bind(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


def test_only_sockets_stranded_during_the_run_are_removed(tmp_path) -> None:
    hour_ago = time.time() - 3600
    older, stranded, live = (tmp_path / f"hivemind-p2pd-{name}.sock" for name in ("old", "dead", "live"))
    _bind(older).close()  # closing a bound socket leaves its file behind, as a SIGKILL does
    os.utime(older, (hour_ago, hour_ago))
    for name in ("dead", "live", "note"):  # multiprocessing's folders, a listener socket in each
        (tmp_path / f"pymp-{name}").mkdir()
    _bind(tmp_path / "pymp-dead" / "listener-1").close()
    (tmp_path / "pymp-note" / "listener-1").write_text("not a socket: not ours to judge")
    since = time.time() - 1
    _bind(stranded).close()
    listeners = [_bind(live), _bind(tmp_path / "pymp-live" / "listener-1")]
    try:
        removed = remove_stranded_sockets(since, folder=str(tmp_path))
        assert sorted(removed) == sorted([str(stranded), str(tmp_path / "pymp-dead")])
        assert not stranded.exists() and not (tmp_path / "pymp-dead").exists()
        assert live.exists() and older.exists()
        assert (tmp_path / "pymp-live" / "listener-1").exists() and (tmp_path / "pymp-note").exists()
    finally:
        for listener in listeners:
            listener.close()
