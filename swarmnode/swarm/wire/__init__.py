"""The wire format, pure (no hivemind, no network): wire types and limits, the canonical codec, conversion
between rollouts and wire types, and the rules a DHT record must meet. PROTOCOL.md is its spec."""
