"""The network: wire protocol, libp2p transport, verification of peers' rollouts, and the exchange.

Imports hivemind lazily (inside the transport) and never the learner (``swarmnode.learn``): what
crosses between them is a ``RolloutGroup``.
"""
