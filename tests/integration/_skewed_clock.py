"""Start a Transport whose wall clock is off by SECONDS and print how it failed (or ``STARTED``).

    python _skewed_clock.py SECONDS KEY_FILE INITIAL_PEER

Why a shifted ``time.time`` instead of a wrong clock: setting the machine's clock would disturb every
other process on it, and time namespaces do not cover CLOCK_REALTIME. hivemind's DHT reads the wall clock
through ``time.time`` (``get_dht_time = time.time``, bound when hivemind is imported), so shifting it
before that import is exactly what a wrong clock looks like to the DHT's check. The p2p daemon keeps the
true clock; it plays no part in that check.
"""

import sys
import time

offset = float(sys.argv[1])
_real_time = time.time
time.time = lambda: _real_time() + offset

from swarmnode.config import SwarmConfig  # noqa: E402  (after the shift, on purpose)
from swarmnode.transport import Transport, TransportError  # noqa: E402

transport = Transport(sys.argv[2], SwarmConfig(initial_peers=[sys.argv[3]]), start_timeout_s=30)
try:
    transport.start()
    print("STARTED", flush=True)
except TransportError as exc:
    print(f"ERROR {exc}", flush=True)
finally:
    transport.shutdown()
