"""A hostile swarm peer for test_hostile.py: its own process, its own key, a real hivemind Transport.

Usage: python hostile_peer.py ATTACK WORK_DIR SWARM_ID HONEST_MULTIADDR [CONFIG_YAML]

It joins the swarm through the honest node's multiaddr, publishes a roster card like any node, waits
for the honest node's roster card, then performs ONE attack (``ATTACKS``) with real signed messages
built with ``swarm.wire.protocol`` and hand-made bad bytes. It talks to the honest node only over the
network: DHT records it writes and payload streams the honest node opens to it. Knowing the honest
node's task mix (the public config file) lets it make task refs and rewards that pass every check but
the one an attack aims at.

Everything it sends carries the marker ``HOSTILE-MARKER`` in its completion texts and uses task indexes
from ``HOSTILE_INDEX_BASE`` up (honest nodes draw small indexes), so the test can tell its groups apart.
The one batch meant to be accepted (the ``replay`` attack's first, honest batch) is marked
``REPLAY-CONTROL`` instead.

Output, one line each, on stdout: ``READY {json}`` once its transport is up, ``STEP {json}`` after each
step (digest, how often the honest node asked for it and how often it was fully served), ``STREAMING``
(``trickle`` only: the first chunk of a slow payload is out), ``DONE {json}`` with every step. Then it
keeps its roster card fresh until its stdin closes (or LIFETIME_S passes) and shuts down cleanly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from swarmnode.config import SwarmConfig, load_config
from swarmnode.identity import Identity
from swarmnode.rollouts import TaskRef
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.net.payloads import PayloadServer
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, convert, dht_rules, framing, limits, protocol, work
from swarmnode.tasks import TaskBank, answer_char_limit

MARKER = "HOSTILE-MARKER"
CONTROL_MARKER = "REPLAY-CONTROL"
HOSTILE_INDEX_BASE = 2_000_000_000  # tasks.INDEX_LIMIT is 2**31; honest nodes draw round * I + j
HOSTILE_SEED = 777
DATASET = "basic_arithmetic"  # in the tiny mix; its answers are plain strings
LIFETIME_S = 300.0
STEP_TIMEOUT_S = 60.0  # longest wait for the honest node to pull one payload
SETTLE_S = 2.5  # time into an honest exchange after which it has polled the DHT several times
ROSTER_PERIOD_S = 8.0
FLOOD_TEXT_BYTES = 16_000  # per completion (the limit is 16 KiB)
FLOOD_GROUPS = 60  # x 4 completions: ~3.7 MiB per batch, under the 4 MiB frame cap
COSTLY_TEXT_BYTES = 960  # x 64 completions x 64 groups: ~4 MiB, under the frame cap
COSTLY_DATASET = "propositional_logic"  # its parser is quadratic in the answer
TRICKLE_BYTES = 3 * 1024 * 1024
TRICKLE_CHUNK = 64 * 1024
TRICKLE_DELAY_S = 0.25


def audit_key(group: protocol.WireGroup) -> dict:
    """How the receiver's peer_groups.jsonl names this group: task ref key and sha256 of the texts."""
    texts = json.dumps([c.text for c in group.completions], ensure_ascii=False)
    return {
        "task": convert.task_from_wire(group.task).key(),
        "texts_sha256": hashlib.sha256(texts.encode()).hexdigest(),
    }


def say(kind: str, payload: object | None = None) -> None:
    print(kind if payload is None else f"{kind} {json.dumps(payload)}", flush=True)


class HostilePayloads(PayloadServer):
    """Counts what the honest node asks for; digests in ``special`` get a hand-made answer instead."""

    def __init__(self, **caps):
        super().__init__(**caps)
        self.requests: Counter[bytes] = Counter()
        self.served: Counter[bytes] = Counter()
        self.special: dict[bytes, Callable[[asyncio.StreamWriter], Awaitable[None]]] = {}

    async def _send_payload(self, writer: asyncio.StreamWriter, digest: bytes) -> None:
        self.requests[digest] += 1
        special = self.special.get(digest)
        if special is not None:
            self.served[digest] += 1  # answered: the honest node hangs up on a bad header at once
            await special(writer)
        else:
            await super()._send_payload(writer, digest)
            self.served[digest] += 1


class Hostile:
    def __init__(self, attack: str, work_dir: Path, swarm_id: str, honest_addr: str, config: str):
        self.attack = attack
        self.swarm_id = swarm_id
        self.honest_peer = honest_addr.rsplit("/p2p/", 1)[1]
        self.cfg = load_config(config)
        self.bank = TaskBank(self.cfg.tasks, default_seed=HOSTILE_SEED)
        self.task_config = self.cfg.tasks.mix[DATASET].config
        self.identity = Identity.generate()
        self.work_nonce = work.mint(self.identity.public_key, self.cfg.swarm.identity_work_bits)
        key_path = work_dir / f"{attack}.key"
        self.identity.save(key_path)
        self.peer_id = self.identity.peer_id
        self.transport = Transport(
            key_path,
            # the honest node's identity work: a DHT node with a stricter rule refuses every card stored
            # with it (the honest node's included), so which cards reach the DHT would depend on DHT ids
            SwarmConfig(
                swarm_id=swarm_id,
                initial_peers=[honest_addr],
                identity_work_bits=self.cfg.swarm.identity_work_bits,
            ),
            payloads=HostilePayloads(serve_timeout_s=60.0),
            start_timeout_s=120.0,  # a loaded test machine can take a while
        )
        self.ttl_s = 60.0
        self.last_seq = 0
        self.round = 0
        self.next_index = HOSTILE_INDEX_BASE
        self.last_roster = 0.0
        self.addrs: list[str] = []
        self.steps: list[dict] = []

    # --- plumbing ----------------------------------------------------------------------------------
    def seq(self) -> int:
        self.last_seq = max(self.last_seq + 1, int(time.time() * 1000))
        return self.last_seq

    def publish_roster(self) -> None:
        card = protocol.RosterCard(
            peer_id=self.peer_id,
            swarm_id=self.swarm_id,
            model_name="hostile-model",
            tokenizer_fingerprint="",
            policy_version=0,
            round=self.round,
            addrs=tuple(self.addrs[: limits.MAX_ADDRS]),
            timestamp=time.time(),
            seq=self.seq(),
            extra=roster_extra(self.bank.fingerprint),  # the honest node's task mix: it pulls from us
            work_nonce=self.work_nonce,
        )
        record = codec.encode_message(self.identity, self.swarm_id, card)
        self.transport.records.put(
            dht_rules.roster_key(self.swarm_id, self.peer_id), self.peer_id, record, self.ttl_s
        )
        self.last_roster = time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep, keeping this peer's roster card fresh (an honest-looking, live peer)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if time.monotonic() - self.last_roster > ROSTER_PERIOD_S:
                self.publish_roster()
            time.sleep(min(0.2, left))

    def honest_round(self) -> int | None:
        """The round in the honest node's batch announcement (put as each of its exchanges starts: the
        phase of its rounds); None before its first."""
        dht_key = dht_rules.announce_key(self.swarm_id, self.honest_peer)
        record = self.transport.records.get(dht_key).get(self.honest_peer)
        if record is None:
            return None
        try:
            message, _ = codec.decode_message(
                record,
                swarm_id=self.swarm_id,
                expected_type=limits.BATCH_ANNOUNCEMENT,
                expected_peer_id=self.honest_peer,
            )
        except limits.ProtocolError:
            return None
        return message.round

    def wait_for_rounds(self, timeout_s: float = 240.0) -> int:
        """Until the honest node has begun its rounds (its first exchange put an announcement).

        Why: an attack that starts while it still waits for ``min_peers`` gets this peer banned, and a
        peer banned before the last one joined keeps the start barrier from ever seeing them all live: the
        node then waits out ``wait_for_peers_s`` and the other attacks' steps time out meanwhile (seen on
        a loaded 2-core CI machine: 180 s at the barrier, the replay control never pulled)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.honest_round()
            if found is not None:
                return found
            self.sleep(0.5)
        raise SystemExit(f"the honest node {self.honest_peer} began no round in {timeout_s} s")

    def wait_next_exchange(self, timeout_s: float = STEP_TIMEOUT_S, settle_s: float = SETTLE_S) -> None:
        """Until the honest node has started a new exchange (its announcement's round moved on) and, after
        ``settle_s``, polled for a while in it: whatever this peer put in the DHT before the call has been
        read by then. With ``settle_s`` 0 it returns early in an exchange: a batch announced then is pulled
        in it (one announced late in an exchange and found by the poll after its end is of the last wave,
        dropped for an author with standing: exchange/round_budget.py)."""
        start = self.honest_round() or 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.honest_round()
            if now is not None and now > start:
                break
            self.sleep(0.4)
        self.sleep(settle_s)

    # --- messages ----------------------------------------------------------------------------------
    def ref(self) -> TaskRef:
        self.next_index += 1
        return TaskRef.make(DATASET, HOSTILE_SEED, self.next_index, self.task_config)

    def group(
        self,
        *,
        informative: bool = True,
        marker: str = MARKER,
        pad: int = 0,
        claims: float | None = None,
        task: protocol.WireTask | None = None,
    ) -> protocol.WireGroup:
        """Four completions of a fresh hostile task; claimed rewards are the true task scores unless
        ``claims`` overrides them. Informative groups have different rewards (a learner would use them)."""
        ref = self.ref()
        question = self.bank.question(ref)
        right = question.answer
        if informative:
            texts = [f"<answer>{right}</answer>", f"answer: {right}", "<answer>12345</answer>", "no idea"]
        else:
            texts = [f"<answer>{right}</answer>"] * 4  # all equally right: zero advantage
        filler = "x" * max(0, pad - 64) + "\n" if pad else ""
        texts = [f"{marker} {filler}{t}" for t in texts]
        scores = [self.bank.score(question, t)[1] for t in texts]
        return protocol.WireGroup(
            task=task if task is not None else convert.task_to_wire(ref),
            completions=tuple(protocol.WireCompletion(text=t, n_tokens=0) for t in texts),
            claimed_rewards=tuple(float(s) if claims is None else claims for s in scores),
        )

    def batch(self, groups: list[protocol.WireGroup]) -> protocol.RolloutBatch:
        self.round += 1
        return protocol.RolloutBatch(
            peer_id=self.peer_id,
            swarm_id=self.swarm_id,
            round=self.round,
            policy_version=0,
            model_name="hostile-model",
            tokenizer_fingerprint="",
            timestamp=time.time(),
            seq=self.seq(),
            groups=tuple(groups),
        )

    def encode(self, batch: protocol.RolloutBatch) -> bytes:
        return codec.encode_message(self.identity, self.swarm_id, batch)

    def announce(
        self, digest: bytes, length: int, batch: protocol.RolloutBatch | None, *, seq: int | None = None
    ) -> protocol.BatchAnnouncement:
        announcement = protocol.BatchAnnouncement(
            peer_id=self.peer_id,
            swarm_id=self.swarm_id,
            round=batch.round if batch else self.round,
            policy_version=batch.policy_version if batch else 0,
            payload_sha256=digest,
            payload_len=length,
            n_groups=len(batch.groups) if batch else 1,
            timestamp=time.time(),
            seq=self.seq() if seq is None else seq,
        )
        record = codec.encode_message(self.identity, self.swarm_id, announcement)
        if not self.transport.records.put(
            dht_rules.announce_key(self.swarm_id, self.peer_id), self.peer_id, record, self.ttl_s
        ):
            say("WARN", {"put_record": "failed"})
        return announcement

    # --- steps -------------------------------------------------------------------------------------
    def record(self, name: str, digest: bytes, **extra) -> dict:
        step = {
            "name": name,
            "digest": digest.hex(),
            "requested": self.transport.payloads.requests[digest],
            "served": self.transport.payloads.served[digest],
            **extra,
        }
        self.steps.append(step)
        say("STEP", step)
        return step

    def send(
        self,
        name: str,
        data: bytes,
        batch: protocol.RolloutBatch | None,
        *,
        length: int | None = None,
        digest: bytes | None = None,
        seq: int | None = None,
        **extra,
    ) -> dict:
        """Offer ``data`` (or answer ``digest`` with a special handler), announce it, and wait until the
        honest node has pulled it (or STEP_TIMEOUT_S passes: the step then says served = 0)."""
        digest = digest or limits.payload_digest(data)
        if digest not in self.transport.payloads.special:
            self.transport.payloads.offer(digest, data)
        announcement = self.announce(digest, length or len(data), batch, seq=seq)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline and not self.transport.payloads.served[digest]:
            self.sleep(0.1)
        return self.record(name, digest, seq=announcement.seq, **extra)

    def probe_after_ban(self) -> None:
        """A valid, informative batch after the ban: a banned peer's data is never even pulled."""
        batch = self.batch([self.group(), self.group()])
        data = self.encode(batch)
        self.transport.payloads.offer(limits.payload_digest(data), data)
        self.announce(limits.payload_digest(data), len(data), batch)
        self.wait_next_exchange()
        self.record("valid_after_ban", limits.payload_digest(data))

    # --- attacks -----------------------------------------------------------------------------------
    def forged_signature(self) -> None:
        """A payload whose signature does not verify, announced with its own sha256 so that it passes
        the hash check and reaches the signature check (-> bad_signature, immediate ban)."""
        batch = self.batch([self.group(), self.group()])
        data = self.encode(batch)
        at = data.rindex(b"\xa1s\xc4\x40") + 4  # "s", then bin8 of 64 bytes: the signature
        forged = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
        self.send("forged", forged, batch)
        self.probe_after_ban()

    def peer_id_mismatch(self) -> None:
        """A batch signed with our key whose body claims to be the honest node's (-> peer_id_mismatch)."""
        batch = self.batch([self.group(), self.group()])
        body = batch.to_body()
        body["peer_id"] = self.honest_peer
        body_bytes = codec.canonical_packb(body)
        signature = self.identity.sign(codec.signing_bytes(limits.ROLLOUT_BATCH, self.swarm_id, body_bytes))
        data = codec.pack_envelope(limits.ROLLOUT_BATCH, body_bytes, self.identity.public_key, signature)
        self.send("impersonation", data, batch)
        self.probe_after_ban()

    def replay(self) -> None:
        """One honest batch (accepted: the control), then three ways of getting it or its seq reused."""
        original = self.batch([self.group(marker=CONTROL_MARKER), self.group(marker=CONTROL_MARKER)])
        data = self.encode(original)
        first = self.send("control", data, original, groups=[audit_key(g) for g in original.groups])
        # the same payload announced anew: never pulled again (-> duplicate_payload)
        digest = limits.payload_digest(data)
        self.announce(digest, len(data), original)
        self.wait_next_exchange()
        self.record("reannounced_payload", digest)
        # an announcement carrying an old seq (new bytes): the DHT-level replay (-> replay, not charged)
        fresh = self.batch([self.group(), self.group()])
        fresh_data = self.encode(fresh)
        self.transport.payloads.offer(limits.payload_digest(fresh_data), fresh_data)
        self.announce(limits.payload_digest(fresh_data), len(fresh_data), fresh, seq=first["seq"])
        self.wait_next_exchange()
        self.record("old_seq_announcement", limits.payload_digest(fresh_data))
        # the accepted groups re-signed under the accepted batch's seq: new bytes, new sha256, new
        # announcement; only the batch's own seq gives it away (-> replay)
        self.wait_next_exchange(settle_s=0.0)  # early in an exchange: time to pull
        again = replace(original, timestamp=time.time())
        self.send("resigned_old_batch", self.encode(again), again)
        self.wait_next_exchange(settle_s=0.0)
        # the accepted groups in a brand-new batch with a fresh seq, valid in every way: the verifier
        # accepts it, and the swarm's content dedup keeps its groups from being trained a second time
        renewed = replace(original, timestamp=time.time(), seq=self.seq())
        self.send("resent_groups_new_seq", self.encode(renewed), renewed)

    def oversize_frame(self) -> None:
        """Announce a small payload, then answer with a frame header over the limit: over
        MAX_FRAME_BYTES, then over the announced length (-> fetch refused before the body: oversize)."""
        for name, claimed in (("header_4gib", 0xFFFFFFFF), ("header_over_announced", 4097)):
            digest = hashlib.sha256(name.encode()).digest()

            async def answer(writer: asyncio.StreamWriter, claimed: int = claimed) -> None:
                writer.write(claimed.to_bytes(framing.FRAME_HEADER_BYTES, "big") + b"\x00" * 4096)
                await writer.drain()
                await asyncio.sleep(2.0)

            self.transport.payloads.special[digest] = answer
            self.send(name, b"", None, length=4096, digest=digest)

    def malformed(self) -> None:
        """Bytes that are not a message, announced with their own sha256 (-> malformed)."""
        self.send("never_msgpack", b"\xc1" * 64, None)
        batch = self.batch([self.group()])
        self.send("truncated_envelope", self.encode(batch)[:-7], batch)

    def tampered_task(self) -> None:
        """One group per batch names a question outside the honest node's mix (-> bad_task); the 3rd
        strike bans. A question and an answer key ride along as unknown task fields: decoders ignore
        them, and the receiver regenerates the question anyway."""
        injected = {"question": "What is 1 + 1?", "answer": "HOSTILE"}
        tasks = {
            "dataset_not_in_mix": protocol.WireTask(
                "leg_counting", {}, HOSTILE_SEED, self.next_index + 100, injected
            ),
            "config_tampered": protocol.WireTask(
                DATASET, {**self.task_config, "max_digits": 6}, HOSTILE_SEED, self.next_index + 101, injected
            ),
            "eval_seed": protocol.WireTask(DATASET, dict(self.task_config), self.cfg.tasks.eval_seed, 3),
        }
        for name, task in tasks.items():
            batch = self.batch([self.group(), self.group(task=task, claims=0.0)])
            self.send(name, self.encode(batch), batch)
        self.probe_after_ban()

    def inflated_rewards(self) -> None:
        """Claims of 1.0 for every completion, the wrong ones included (-> reward_mismatch; the 3rd
        strike bans). The second batch also carries an injected answer key its completions agree with."""
        injected = {"question": "Say HOSTILE-ANSWER.", "answer": "HOSTILE-ANSWER"}
        for i in range(3):
            if i == 1:
                ref = self.ref()
                task = replace(convert.task_to_wire(ref), extra=injected)
                group = protocol.WireGroup(
                    task=task,
                    completions=tuple(
                        protocol.WireCompletion(text=f"{MARKER} <answer>HOSTILE-ANSWER</answer>", n_tokens=0)
                        for _ in range(4)
                    ),
                    claimed_rewards=(1.0,) * 4,
                )
            else:
                group = self.group(claims=1.0)
            batch = self.batch([self.group(), group])
            self.send(f"inflated_{i + 1}", self.encode(batch), batch)
        self.probe_after_ban()

    def flood(self) -> None:
        """Maximum-size batches back to back. The first fits the per-peer burst allowance (4 MiB) and is
        accepted like any batch within the limits; its groups carry no learning signal (all answers
        right), so whether the round ends before the ban does not decide what is trained. The next one
        is over the byte rate (-> rate_limited, immediate ban); later ones are never pulled."""

        def big(informative: bool) -> tuple[protocol.RolloutBatch, bytes]:
            batch = self.batch(
                [self.group(informative=informative, pad=FLOOD_TEXT_BYTES) for _ in range(FLOOD_GROUPS)]
            )
            return batch, self.encode(batch)

        self.wait_next_exchange(timeout_s=120.0, settle_s=0.0)  # early in an exchange: time to pull
        for attempt in range(3):  # a pull cut by the honest deadline never reached the rate limiter
            batch, data = big(informative=False)
            if self.send(f"within_limit_{attempt + 1}", data, batch, bytes=len(data))["served"]:
                break
        for attempt in range(3):
            batch, data = big(informative=True)
            if self.send(f"over_limit_{attempt + 1}", data, batch, bytes=len(data))["served"]:
                break
        # keep flooding into the next honest exchange: none of it is pulled any more
        start = self.honest_round() or 0
        digests = []
        for _ in range(12):
            batch, data = big(informative=True)
            digests.append(limits.payload_digest(data))
            self.transport.payloads.offer(digests[-1], data)
            self.announce(digests[-1], len(data), batch)
            self.sleep(0.5)
            if (self.honest_round() or 0) > start:
                break
        self.sleep(SETTLE_S)
        for i, digest in enumerate(digests):
            self.record(f"after_ban_{i + 1}", digest)

    def costly(self) -> None:
        """One valid, honestly claimed batch of ~4 MiB whose every answer is the costliest its dataset's
        scorer sees at the receiver's answer cap (a long chain of conjunctions): 64 groups of 64
        completions. The receiver keeps its own G completions per group, stops scoring at its budget
        (-> over_budget, a strike) and finishes the round on time."""
        answer = ("P ∧ " * 64)[: answer_char_limit(COSTLY_DATASET) - 1] + "P"
        config = self.cfg.tasks.mix[COSTLY_DATASET].config
        groups = []
        for _ in range(limits.MAX_GROUPS_PER_BATCH):
            self.next_index += 1
            ref = TaskRef.make(COSTLY_DATASET, HOSTILE_SEED, self.next_index, config)
            tail = f"<answer>{answer}</answer>"
            head = f"{MARKER} " + "x" * (COSTLY_TEXT_BYTES - len(tail.encode()) - len(MARKER) - 2) + "\n"
            text = head + tail
            score = self.bank.score(self.bank.question(ref), text)[1]
            groups.append(
                protocol.WireGroup(
                    task=convert.task_to_wire(ref),
                    completions=tuple(protocol.WireCompletion(text=text, n_tokens=0) for _ in range(64)),
                    claimed_rewards=(float(score),) * 64,
                )
            )
        batch = self.batch(groups)
        data = self.encode(batch)
        self.wait_next_exchange(timeout_s=120.0, settle_s=0.0)  # early in an exchange: time to pull
        self.send("costly", data, batch, bytes=len(data))

    def trickle(self) -> None:
        """Serve a large payload slowly (for a SIGKILL in the middle of the transfer): header, then
        64 KiB every 0.25 s. Prints STREAMING once the first chunk is out; waits to be killed."""
        digest = hashlib.sha256(b"trickle").digest()

        async def answer(writer: asyncio.StreamWriter) -> None:
            writer.write(TRICKLE_BYTES.to_bytes(framing.FRAME_HEADER_BYTES, "big"))
            for i in range(TRICKLE_BYTES // TRICKLE_CHUNK):
                writer.write(b"s" * TRICKLE_CHUNK)
                await writer.drain()
                if i == 0:
                    say("STREAMING")
                await asyncio.sleep(TRICKLE_DELAY_S)

        self.transport.payloads.special[digest] = answer
        self.announce(digest, TRICKLE_BYTES, None)
        self.sleep(LIFETIME_S)

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.addrs = self.transport.start()
        say("READY", {"peer_id": self.peer_id, "attack": self.attack, "addrs": self.addrs})
        self.publish_roster()

    def run(self) -> None:
        self.wait_for_rounds()
        getattr(self, self.attack)()
        say("DONE", {"peer_id": self.peer_id, "attack": self.attack, "steps": self.steps})


ATTACKS = (
    "forged_signature",
    "peer_id_mismatch",
    "replay",
    "oversize_frame",
    "malformed",
    "tampered_task",
    "inflated_rewards",
    "flood",
    "trickle",
    "costly",
)


def main() -> None:
    attack, work_dir, swarm_id, honest_addr = sys.argv[1:5]
    config = sys.argv[5] if len(sys.argv) > 5 else "node_configs/tiny.yaml"
    if attack not in ATTACKS:
        raise SystemExit(f"unknown attack {attack!r}; one of {', '.join(ATTACKS)}")
    closed = threading.Event()

    def watch_stdin() -> None:  # the test closes our stdin when it is done with us
        for _ in sys.stdin:
            pass
        closed.set()

    hostile = Hostile(attack, Path(work_dir), swarm_id, honest_addr, config)
    try:
        hostile.start()
        # only now: the DHT process is forked in start(), and a child forked while this thread holds
        # stdin's lock deadlocks when multiprocessing closes stdin in it
        threading.Thread(target=watch_stdin, daemon=True).start()
        hostile.run()
        end = time.monotonic() + LIFETIME_S
        while not closed.is_set() and time.monotonic() < end:
            hostile.sleep(0.5)
    finally:
        hostile.transport.shutdown()


if __name__ == "__main__":
    main()
