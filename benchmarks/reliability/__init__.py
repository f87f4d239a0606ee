"""Long-run drivers of real node processes, shared by ``benchmarks.soak``/``chaos``/``sybil_flood`` and their
short versions in ``tests/integration``.

    soak          many tiny nodes for many rounds: memory and open files stay flat
    chaos         kills, corrupt checkpoints, a full disk, a clock jump
    sybil_flood   attacker hosts with fresh identities against an honest swarm, measured
    sybil_mix     one hostile process with a mix of identities (canned text that scores, silent,
                  future-dated, churn): what the honest nodes train on, and their share deadlines
    honest_swarm  the Sybil studies' honest nodes; sybils, canned, mix_host: their attackers
"""
