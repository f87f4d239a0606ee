"""The simulation against real loopback runs: the measured per-node counts, read from a
``benchmarks.swarm_latency --json`` report, and their comparison with the simulated ones (the bar:
within 25% at 8-32 nodes before the model is trusted beyond them).

The fields compared (``FIELDS``), each a mean per node and round over the statistics' rounds: notices
sent and received, pulls started, verifications (batches verified, accepted or rejected), payload bytes
pulled in and served out. ``benchmarks.swarm_latency`` reports them as ``analysis["work_per_round"]``;
``per_node_from_metrics`` computes them from metrics.jsonl records as
``swarm.exchange.records.PeerRoundCounts.as_dict`` writes them (for reports that lack them);
``loopback_per_node`` reads either.
"""

from __future__ import annotations

from collections.abc import Iterable

FIELDS = ("notices_sent", "notices_received", "pulls", "verifications", "bytes_in", "bytes_out")
TOLERANCE = 0.25  # simulated / measured within 1 +- this


def per_node_from_metrics(records: Iterable[dict]) -> dict[str, float]:
    """Means of ``FIELDS`` over metrics.jsonl records (one per node and round; pass only the statistics'
    rounds): ``peer_notices_sent``, ``peer_notices_received``, ``peer_pulls``, ``peer_bytes_in``,
    ``peer_bytes_out`` as they are; verifications = ``peer_batches_received`` (accepted) + the counts of
    ``peer_rejected`` (rejected after a pull). Empty for no records."""
    sums, n = dict.fromkeys(FIELDS, 0.0), 0
    for r in records:
        n += 1
        for name in ("notices_sent", "notices_received", "pulls", "bytes_in", "bytes_out"):
            sums[name] += r.get(f"peer_{name}", 0)
        sums["verifications"] += r.get("peer_batches_received", 0) + sum(r.get("peer_rejected", {}).values())
    return {k: v / n for k, v in sums.items()} if n else {}


def loopback_per_node(report: dict) -> dict[int, dict]:
    """Swarm size -> ``{"per_node": {FIELDS...}, "round_s": ..., "fill_share": ... or None}`` from a
    ``benchmarks.swarm_latency --json`` report.

    Read per entry of ``report["results"]``: ``nodes``; the per-node means of every name of ``FIELDS``,
    from ``analysis["work_per_round"]`` (what swarm_latency's ``work_per_round`` writes since it counts
    the network work per round; its ``verifications`` are batches accepted, which on an honest run are
    all of them) or ``analysis["per_node_per_round"]`` (``per_node_from_metrics``'s output);
    ``analysis["round_p50_s"]``, the run's median round (the simulation runs with it); and the share of
    rounds that filled J, ``rounds_filling_j`` in the former or ``analysis["fill_share"]``, compared when
    present. Entries without the counts (older reports) are skipped."""
    out = {}
    for entry in report.get("results", []):
        analysis = entry.get("analysis", {})
        counts = analysis.get("work_per_round") or analysis.get("per_node_per_round") or {}
        if any(f not in counts for f in FIELDS):
            continue
        fill = counts.get("rounds_filling_j", analysis.get("fill_share"))
        out[int(entry["nodes"])] = {
            "per_node": {f: float(counts[f]) for f in FIELDS},
            "round_s": float(analysis["round_p50_s"]),
            "fill_share": None if fill is None else float(fill),
        }
    return out


def compare(simulated: dict[str, float], measured: dict[str, float]) -> list[tuple[str, float, float, bool]]:
    """(field, simulated, measured, within TOLERANCE) for each field measured; a measured 0 passes only
    against a simulated 0."""
    rows = []
    for name, real in measured.items():
        sim = simulated.get(name, 0.0)
        ok = abs(sim - real) <= TOLERANCE * real if real else sim == 0
        rows.append((name, sim, real, ok))
    return rows
