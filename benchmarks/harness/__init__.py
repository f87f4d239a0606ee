"""What the studies and the tests share: real ``swarmnode`` processes and the statistics of their results.

    processes     start real ``swarmnode`` processes (join, solo, bootstrap) on 127.0.0.1 and read their logs
    _clock_jump   a prefix that runs a node with its wall clock shifted (a script, not imported)
    waiting       ``wait_until``: the one bounded poll
    periodic      ``Periodic``: a watcher's tick every period in a thread, until stopped
    stats         a mean with its Student-t interval, paired differences, TOST (scipy: the ``test`` extra)
    cohorts       whether a loopback swarm ran as one swarm or split into cohorts

The process drivers start ``python -m swarmnode.cli`` from the repository root: they need a checkout.
"""
