"""Code that the tests and the benchmarks share; a running node never imports it.

It lives in the package because neither side may import the other (``benchmarks/`` never imports
``tests``, a test never imports ``benchmarks/``):

    processes    start real ``swarmnode`` processes on 127.0.0.1 and read what they write
    waiting      the one bounded poll (``wait_until``)
    soak, chaos  the long-run drivers behind ``benchmarks.soak`` / ``benchmarks.chaos`` and their short
                 versions in ``tests/integration``
    stats        a mean with its Student-t interval, paired differences, TOST (scipy, the ``test`` extra)
    arms         the arms of ``benchmarks.sapo_table``: silo-L, L/E, off-policy, specialists
    sapo_report  the multi-seed SAPO table of ``benchmarks.sapo_table``
    sharing      #28's experiments E1 and E2: metrics and verdict rules, fixed before the runs
    sharing_report  their report and probe-curve plots (``benchmarks.sharing_report``)
    difficulty   step 0: the untrained model's pass@1 on candidate tasks (``benchmarks.task_difficulty``)
    poisoning    #29's attack harness (``benchmarks.poisoning``): the payloads and their detectors;
                 ``poisoning_peer`` the attackers and the node's real receiving side, ``poisoning_measure``
                 attack success and payload log-prob, ``poisoning_run`` one arm and its summary

Importing this package loads nothing; each module imports what it needs. The process drivers start
``python -m swarmnode.cli`` from the repository root, so they need a source checkout.
"""
