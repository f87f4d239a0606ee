"""Bytes between peers, no rollouts: the transport (DHT process, p2pd, streams), payload serving, notices,
hello, reachability, the DHT storage guard, and the one module that names DHT keys and makes DHT calls."""
