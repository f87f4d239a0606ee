"""A DHT call the node gives up on at its deadline leaves no traceback in the log (issue #26: under a
Sybil flood, every timed-out DHT read made hivemind's DHT process log two tracebacks, "Caught an exception
when running a coroutine" and "Task exception was never retrieved", for a cancelled future). A real DHT
process (hivemind, p2pd) on 127.0.0.1; the call is a coroutine that outlives its caller's deadline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import pytest

from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.net import dht as dht_module
from swarmnode.swarm.net.daemon import AbandonedCallFilter
from swarmnode.swarm.net.transport import Transport

SLOW_S = 1.0


async def _slow(_dht, _node) -> str:
    await asyncio.sleep(SLOW_S)
    return "late"


def test_a_call_abandoned_at_its_deadline_logs_nothing(tmp_path, capfd):
    key = tmp_path / "node.key"
    Identity.generate().save(key)
    transport = Transport(key, SwarmConfig())
    transport.start()
    try:
        future = transport._dht.run_coroutine(_slow, return_future=True)
        with pytest.raises(concurrent.futures.TimeoutError):
            dht_module._result(future, 0.1)  # the node's deadline: cancelled
        time.sleep(SLOW_S + 1.0)  # the DHT process finishes the call meanwhile
        assert transport._dht.run_coroutine(_quick, return_future=True).result(10) == "up"
    finally:
        transport.shutdown()
    err = capfd.readouterr().err
    assert "InvalidStateError" not in err and "Traceback" not in err, err


async def _quick(_dht, _node) -> str:
    return "up"


def test_the_filter_drops_only_abandoned_calls():
    def record(exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord("hivemind.dht.dht", logging.ERROR, __file__, 1, "boom", None, info)

    quiet = AbandonedCallFilter()
    cancelled = concurrent.futures.InvalidStateError("Can't set_result to a future that is CANCELLED (1)")
    assert not quiet.filter(record(cancelled))
    assert quiet.filter(record(concurrent.futures.InvalidStateError("FINISHED (1)")))
    assert quiet.filter(record(ValueError("a real error")))
    assert quiet.filter(record(None))
