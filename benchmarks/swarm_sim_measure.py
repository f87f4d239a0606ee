"""The per-operation costs that ``benchmarks.swarm_sim`` can measure here in seconds, with real code.

Each number is one real operation of the data plane, timed in a loop on this machine: a batch of the tiny
config (node_configs/tiny.yaml: 4 questions x 4 completions x 16 tokens) and one of the public demo's
(4 x 8 x ``sampling.max_new_tokens`` tokens) encoded and signed, verified by the project's ``Verifier``
(every answer re-scored), a notice frame encoded, an announcement and a roster card checked. What this
module cannot time without a running swarm (stream and DHT latencies, a round) comes from the committed
figures in ``benchmarks/swarm_sim_costs.json``, each with its source.

    .venv/bin/python -m benchmarks.swarm_sim --measure     # re-measures these, rewrites the cost file
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable

from swarmnode.config import SamplingConfig, TasksConfig, TaskSpec
from swarmnode.identity import Identity
from swarmnode.rollouts import Completion, Provenance
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.verify import Verifier
from swarmnode.swarm.net import notices
from swarmnode.swarm.wire import codec, convert, limits, protocol, work
from swarmnode.tasks import TaskBank

SWARM = "sim-measure"
_STAMPS = limits.Stamper()  # (seq, timestamp) of the messages measured here
MIX = {  # node_configs/tiny.yaml's mix
    "propositional_logic": TaskSpec(weight=3),
    "basic_arithmetic": TaskSpec(config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
}
TINY = (4, 4, 16)  # questions, completions per question, tokens per completion
PUBLIC = (4, 8, SamplingConfig().max_new_tokens)  # node_configs/public-demo.yaml, default token cap
CHARS_PER_TOKEN = 4  # a completion's text length per sampled token (English-like text)


def per_call(fn: Callable[[], object], min_s: float = 0.3, min_calls: int = 5) -> float:
    """Seconds per call of ``fn`` (process CPU time, so other engineers' load does not count)."""
    fn()  # first-call work (imports, caches) is not the steady cost
    calls, start = 0, time.process_time()
    while calls < min_calls or time.process_time() - start < min_s:
        fn()
        calls += 1
    return (time.process_time() - start) / calls


def _batch(bank: TaskBank, author: Identity, shape: tuple[int, int, int], round_: int, rng: random.Random):
    questions, completions, tokens = shape
    provenance = Provenance(source="local", producer=author.peer_id, policy_version=1, round=round_)
    words = "the answer is so then we have p q r and or not if".split()
    groups = []
    for ref in bank.draw(round_, questions):
        question = bank.question(ref)
        texts = []
        for _ in range(completions):
            text = " ".join(rng.choice(words) for _ in range(tokens))[: tokens * CHARS_PER_TOKEN]
            texts.append(f"{text} <answer>{rng.randint(0, 99)}</answer>")
        done = [
            Completion(
                text=t,
                token_ids=tuple(rng.randrange(512) for _ in range(tokens)),
                logprobs=tuple(-rng.random() for _ in range(tokens)),
            )
            for t in texts
        ]
        groups.append(bank.score_group(question, done, provenance))
    seq, timestamp = _STAMPS.stamp()
    batch = convert.make_rollout_batch(
        groups,
        peer_id=author.peer_id,
        swarm_id=SWARM,
        round=round_,
        policy_version=1,
        model_name="tiny",
        tokenizer_fingerprint="ab" * 32,
        timestamp=timestamp,
        seq=seq,
    )
    return batch


def _seconds(value: float, source: str) -> dict:
    """A cost table entry in seconds, with where the figure came from."""
    return {"value": round(value, 6), "unit": "s", "source": source}


def _announce(author: Identity, batch: protocol.RolloutBatch, data: bytes) -> bytes:
    seq, timestamp = _STAMPS.stamp()
    announcement = protocol.announcement_for(batch, data, timestamp=timestamp, seq=seq)
    return codec.encode_message(author, SWARM, announcement)


def _card(author: Identity, fingerprint: str, bits: int) -> bytes:
    seq, timestamp = _STAMPS.stamp()
    card = protocol.RosterCard(
        peer_id=author.peer_id,
        swarm_id=SWARM,
        model_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        tokenizer_fingerprint="ab" * 32,
        policy_version=1,
        round=1,
        addrs=("/ip4/203.0.113.7/tcp/31337", "/ip6/2001:db8::7/tcp/31337"),
        timestamp=timestamp,
        seq=seq,
        work_nonce=work.mint(author.public_key, bits),
        extra=roster_extra(fingerprint),
    )
    return codec.encode_message(author, SWARM, card)


def measure() -> dict[str, dict]:
    """``{name: {"value", "unit", "source"}}`` for every cost this module times (about a minute)."""
    rng = random.Random(0)
    bank = TaskBank(TasksConfig(mix=MIX, seed=1))
    author = Identity.generate()
    source = f"measured by benchmarks/swarm_sim_measure.py on {time.strftime('%Y-%m-%d')}"
    out: dict[str, dict] = {}

    def put(name: str, value: float, unit: str, what: str) -> None:
        timed = ", process CPU time a call" if unit == "s" else ""
        out[name] = {"value": round(value, 9), "unit": unit, "source": f"{what}; {source}{timed}"}

    for label, shape in (("tiny", TINY), ("public", PUBLIC)):
        batch = _batch(bank, author, shape, 1, rng)
        data = codec.encode_message(author, SWARM, batch)
        record = _announce(author, batch, data)
        q, g, t = shape
        put(f"batch_bytes_{label}", len(data), "bytes", f"encoded RolloutBatch, {q} x {g} x {t} tokens")
        put(
            f"publish_s_{label}",
            per_call(lambda b=batch: _announce(author, b, codec.encode_message(author, SWARM, b))),
            "s",
            "encode and sign the batch, then its announcement",
        )

        def verify(record: bytes = record, data: bytes = data) -> None:
            verifier = Verifier(bank, SWARM, PeerBook(time.monotonic), clock=time.time)
            announcement = verifier.check_announcement(record, author.peer_id)
            verifier.check_batch(announcement, data, author.peer_id)

        put(
            f"verify_batch_s_{label}",
            per_call(verify),
            "s",
            "Verifier.check_announcement + check_batch (signature, sha256, decode, every answer re-scored)",
        )
    put("announcement_bytes", len(record), "bytes", "signed BatchAnnouncement record")
    card = _card(author, bank.fingerprint, 8)
    put(
        "card_bytes",
        len(card),
        "bytes",
        "signed RosterCard record (2 addresses, work nonce, task fingerprint)",
    )
    put(
        "notice_bytes",
        len(notices.encode_notice(author.peer_id, record, card)),
        "bytes",
        "notice frame /swarmnode/notice/2: id, announcement, card",
    )
    put(
        "notice_encode_s",
        per_call(lambda: notices.encode_notice(author.peer_id, record, card)),
        "s",
        "notices.encode_notice",
    )

    def check_announcement() -> None:
        Verifier(bank, SWARM, PeerBook(time.monotonic), clock=time.time).check_announcement(
            record, author.peer_id
        )

    put(
        "announcement_check_s",
        per_call(check_announcement),
        "s",
        "Verifier.check_announcement (decode, Ed25519 verify, freshness, seq)",
    )

    def check_card() -> None:
        decoded, _ = codec.decode_message(card, swarm_id=SWARM, expected_type=limits.ROSTER_CARD)
        work.card_has_work(decoded, 8)

    put(
        "card_check_s",
        per_call(check_card),
        "s",
        "a roster card decoded, signature and identity work checked",
    )
    return out


def _tree_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and all its descendants (a DHT process and its p2pd)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        pass
    return total


def measure_net(count: int = 200) -> dict[str, dict]:
    """CPU per notice, per pull of a tiny batch and per DHT key lookup between two real transports on
    127.0.0.1 (hivemind DHT processes and p2pd included), both ends together, and the server side of a DHT
    lookup alone (what a bootstrap spends per key asked). About a minute; starts and stops its own
    processes only."""
    import asyncio
    import hashlib
    import os
    import tempfile
    from pathlib import Path

    from swarmnode.config import SwarmConfig
    from swarmnode.swarm.net.transport import Transport

    rng = random.Random(0)
    bank = TaskBank(TasksConfig(mix=MIX, seed=1))
    author = Identity.generate()
    batch = _batch(bank, author, TINY, 1, rng)
    data = codec.encode_message(author, SWARM, batch)
    record, card = _announce(author, batch, data), _card(author, bank.fingerprint, 8)
    digest = hashlib.sha256(data).digest()
    got = []

    async def on_notice(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = int.from_bytes(await reader.readexactly(4), "big")
        got.append(len(await reader.readexactly(length)))
        writer.close()

    source = f"measured by benchmarks/swarm_sim_measure.py --measure-net on {time.strftime('%Y-%m-%d')}"
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="swarm-sim-") as tmp:
        nodes = []
        try:
            for name in ("server", "client"):
                Identity.generate().save(Path(tmp) / f"{name}.key")
            server = Transport(
                Path(tmp) / "server.key",
                SwarmConfig(swarm_id=SWARM, reachability="public"),
                must_reach_initial_peers=False,
            )
            server.serve(notices.NOTICE_STREAM, on_notice)
            nodes.append(server)
            addrs = server.start()
            client = Transport(
                Path(tmp) / "client.key",
                SwarmConfig(swarm_id=SWARM, initial_peers=addrs, reachability="public"),
            )
            nodes.append(client)
            client.start()
            server.payloads.offer(digest, data)
            pids = [t._dht.pid for t in nodes]  # noqa: SLF001 - the DHT process (and p2pd) CPU is the point

            def cpu() -> tuple[float, float]:
                return time.process_time() + sum(_tree_cpu(p) for p in pids), _tree_cpu(pids[0])

            def timed(fn: Callable[[], object], n: int) -> tuple[float, float, float]:
                fn()
                (before, server_before), wall = cpu(), time.monotonic()
                for _ in range(n):
                    fn()
                (after, server_after), wall = cpu(), time.monotonic() - wall
                return (after - before) / n, (server_after - server_before) / n, wall / n

            def notice() -> None:
                notices.notify(client, [server.peer_id], author.peer_id, record, card).result(timeout=10)

            both, _, wall = timed(notice, count)
            out["notice_stream_cpu_s"] = _seconds(both, f"one notice sent and read, both ends; {source}")
            out["notice_local_s"] = _seconds(wall, f"one notice sent and read, wall time; {source}")
            both, _, wall = timed(lambda: client.fetch(server.peer_id, digest, timeout_s=10), count)
            out["pull_stream_cpu_s"] = _seconds(both, f"one tiny batch pulled, both ends; {source}")
            out["fetch_local_s"] = _seconds(wall, f"one tiny batch pulled, wall time; {source}")
            keys = 32

            def lookup() -> None:  # absent keys: the client must ask the server
                client.records.get_many([os.urandom(8).hex() for _ in range(keys)], 10.0)

            both, served, wall = timed(lookup, max(count // 10, 5))
            out["dht_key_cpu_s"] = {
                "value": round(both / keys, 7),
                "unit": "s",
                "source": f"one key looked up (pages of 32), both ends; {source}",
            }
            out["dht_key_server_cpu_s"] = {
                "value": round(served / keys, 7),
                "unit": "s",
                "source": f"one key looked up, the answering DHT process and its p2pd alone; {source}",
            }
            out["dht_get_local_s"] = _seconds(wall, f"a get_many of 32 keys, wall time; {source}")
        finally:
            for t in reversed(nodes):
                t.shutdown()
    if len(got) < count:
        raise RuntimeError(f"only {len(got)} of {count}+ notices arrived: the notice measurement is void")
    return out
