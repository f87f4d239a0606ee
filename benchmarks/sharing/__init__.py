"""Whether sharing helps: the arms, the experiments' rules fixed before the runs, and their reports.

    arms          the arms of ``benchmarks.sapo_table``: silo-L, L/E, silo-matched, off-policy, specialists
    experiments   E1 and E2 (with E2's silo-matched control): metrics, margins and verdict rules
    matching      how silo-matched's settings follow from E2's summaries (``python -m ...matching``)
    report        their report and probe-curve plots (``benchmarks.sharing_report``)
    compute       what each arm spent a round, and its probe area against compute instead of rounds
    sapo_report   the multi-seed SAPO table and the summaries it is built from
    difficulty    step 0: the untrained model's pass@1 on candidate tasks (``benchmarks.task_difficulty``)

The reports: docs/sharing.md (E1, E2) and docs/sapo-table.md, from the summaries in docs/sharing/ and
docs/sapo/.
"""
