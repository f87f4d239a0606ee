"""Whether sharing helps: the arms, the experiments' rules fixed before the runs, and their reports.

    arms          the arms of ``benchmarks.sapo_table``: silo-L, L/E, off-policy, specialists
    experiments   E1 and E2: metrics, margins and verdict rules
    report        their report and probe-curve plots (``benchmarks.sharing_report``)
    sapo_report   the multi-seed SAPO table and the summaries it is built from
    difficulty    step 0: the untrained model's pass@1 on candidate tasks (``benchmarks.task_difficulty``)

The reports: docs/sharing.md (E1, E2) and docs/sapo-table.md, from the summaries in docs/sharing/ and
docs/sapo/.
"""
