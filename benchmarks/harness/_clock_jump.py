"""Run ``python -m MODULE ARGS...`` with this process's wall clock off by the seconds in OFFSET_FILE.

    python _clock_jump.py OFFSET_FILE PYTHON -m MODULE ARGS...

It is a ``prefix`` for ``processes.start_node`` (chaos's node01, test_bootstrap's skewed node): the
caller writes a number of seconds into OFFSET_FILE while the node runs, and the node's clock jumps by
that much (as after an NTP step, or a laptop waking up), for this process and its hivemind DHT process
(forked from it: it inherits the shifted clock and reads the file too). The file is re-read at most
every 0.5 s.

Why a shifted ``time.time`` instead of a wrong system clock: setting the machine's clock would disturb
every other process on it (faketime is not installed here, and time namespaces do not cover
CLOCK_REALTIME). The node reads the wall clock only through ``time.time`` (message timestamps, sequence
numbers, freshness checks), and hivemind through ``get_dht_time = time.time``, bound at import, i.e.
after this shift. The p2p daemon keeps the true clock; libp2p does not use it for anything checked here.
"""

import runpy
import sys
import time

_offset_file = sys.argv[1]
_real_time, _monotonic = time.time, time.monotonic
_offset = [0.0, -1.0]  # seconds, monotonic time of the last read


def _shifted_time() -> float:
    now = _monotonic()
    if now - _offset[1] > 0.5:
        _offset[1] = now
        try:
            with open(_offset_file) as f:
                _offset[0] = float(f.read().strip() or 0.0)
        except (OSError, ValueError):
            pass
    return _real_time() + _offset[0]


time.time = _shifted_time
_, flag, module, *rest = sys.argv[2:]  # PYTHON -m MODULE ARGS...
if flag != "-m":
    raise SystemExit("usage: _clock_jump.py OFFSET_FILE PYTHON -m MODULE ARGS...")
sys.argv = [module, *rest]
runpy.run_module(module, run_name="__main__", alter_sys=True)
