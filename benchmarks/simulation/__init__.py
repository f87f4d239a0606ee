"""A discrete-event model of the data plane at swarm sizes no machine here can run (``benchmarks.swarm_sim``,
docs/scaling.md).

    engine        the swarm: rounds, publishes, notices, pulls, over simulated time
    scenario      the knobs: the code's protocol (its constants), the target design, the swarm and network
    node          the event loop and one node's receiving side
    load          the counts priced: bytes, CPU seconds, bootstrap nodes
    validation    the model's per-node counts against loopback runs
"""
