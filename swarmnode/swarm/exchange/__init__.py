"""The SAPO data plane: the ``Swarm`` façade the round loop calls, the service thread whose stages take
a peer's batch from a notice to the pool, membership (the roster), verification, standing, the pool and
this node's announcements. docs/reliability.md, "The data plane", gives the order a batch takes."""
