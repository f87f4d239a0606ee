"""Correct-answer poisoning: hostile peers hide a payload in correct completions (``python -m
benchmarks.poisoning``, docs/poisoning.md).

    payloads      what the attackers hide, and the detectors that see it in a sample
    peer          the attackers (their own signed batches) and the node's real receiving side
    measure       attack success, payload log-prob and the probe of the node at a checkpoint
    run           one arm: the node through its own round with hostile peer groups, and its summary
    report        the arms' tables from their summaries
    __main__      the command line
"""
