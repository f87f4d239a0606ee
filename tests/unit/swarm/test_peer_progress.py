"""What status.json says of each peer (issue #30): its round from its newest signed message with that
message's age, its standing here, and how this node is connected."""

from __future__ import annotations

from swarmnode.swarm.exchange.inbox import Candidate
from swarmnode.swarm.exchange.status import SwarmStatus

CARD_AGE_S = 10.0  # the card a peer signed at start; it is re-signed only every ttl / 4


def _status(world) -> SwarmStatus:
    return SwarmStatus.take(
        roster=world.roster, arrivals=world.arrivals.snapshot(), book=world.book, rejections={}
    )


def _announce(world, author) -> None:
    """``author``'s next batch announcement, as a notice from it reaches the node."""
    record, _ = author.publish(announce=False)
    world.service.puller.consider(Candidate(record, author.peer_id, author.peer_id, "notice", 0.0, 0.0))


def test_a_peers_round_is_its_newest_announcements_with_that_announcements_age(world):
    """Its card says round 0 and is 10 s old; its batch announcements since say round 3 (seen before the
    fix: "round 0", aged as the card, for a peer three rounds on)."""
    (author,) = world.authors(1, card_age_s=CARD_AGE_S)
    world.service.refresh_roster()
    assert _status(world).peers[author.peer_id].round == 0  # the card alone: its round, its age
    assert _status(world).peers[author.peer_id].seen_s_ago >= CARD_AGE_S
    for _ in range(3):
        _announce(world, author)
    peer = _status(world).peers[author.peer_id]
    assert peer.round == author.sender.round == 3
    assert peer.seen_s_ago < CARD_AGE_S / 2, peer  # the announcement's age, not the card's


def test_status_says_which_peers_have_standing_and_round_trips_it(world):
    proven, newcomer = world.authors(1, standing=True) + world.authors(1)
    world.service.refresh_roster()
    status = _status(world)
    assert status.peers[proven.peer_id].standing and not status.peers[newcomer.peer_id].standing
    assert SwarmStatus.from_dict(status.as_dict()) == status


def test_client_mode_is_in_status_json_and_an_older_file_reads_without_it():
    status = SwarmStatus(peer_id="12D3KooWx", client_mode=True, reachability="unreachable")
    written = status.as_dict()
    assert written["client_mode"] is True and written["reachability"] == "unreachable"
    assert SwarmStatus.from_dict(written) == status
    older = {k: v for k, v in written.items() if k not in ("client_mode", "reachability")}
    assert SwarmStatus.from_dict(older).client_mode is False


def test_a_live_peer_past_its_start_tells_a_waiting_node_the_swarm_is_running(world):
    """``wait_for_peers`` stops waiting for ``min_peers`` once a live peer has begun its rounds (#27: 11 of
    32 loopback nodes waited out ``wait_for_peers_s`` while the other 21 ran all their rounds); a card
    alone (round 0: started, no round yet) or a banned peer's announcement says nothing."""
    fresh, banned = world.authors(2)
    world.service.refresh_roster()
    assert not world.roster.running_peer()  # two cards of round 0
    _announce(world, banned)
    world.book.ban(banned.peer_id, "forged")
    assert world.roster.progress(banned.peer_id)[0] == 1 and not world.roster.running_peer()
    _announce(world, fresh)
    world.book.reward(fresh.peer_id)  # and a batch of it verified here: a claim alone says nothing
    assert world.roster.running_peer()
