"""The roster card's optional offline field: on the wire only when true, strictly a boolean."""

from __future__ import annotations

import pytest

from swarmnode.identity import Identity
from swarmnode.swarm.wire import codec, limits, protocol


def _card(identity: Identity, **changes) -> protocol.RosterCard:
    fields = dict(
        peer_id=identity.peer_id, swarm_id="s", model_name="tiny", tokenizer_fingerprint="", policy_version=0,
        round=0, addrs=(), timestamp=1767225600.0, seq=1,
    )  # fmt: skip
    return protocol.RosterCard(**{**fields, **changes})


def test_an_offline_card_round_trips_and_an_online_one_does_not_carry_the_field():
    identity = Identity.generate()
    online = _card(identity)
    assert limits.OFFLINE_FIELD not in online.to_body()
    data = codec.encode_message(identity, "s", _card(identity, offline=True))
    card, _ = codec.decode_message(data, swarm_id="s", expected_type=limits.ROSTER_CARD)
    assert card.offline is True and card.extra == {}
    assert codec.encode_message(identity, "s", card) == data


@pytest.mark.parametrize("value", [1, "true", None, False])
def test_an_offline_field_other_than_true_is_rejected(value):
    """Not a boolean; or false, which is never written (absent means online): one encoding per card."""
    identity = Identity.generate()
    body = {**_card(identity).to_body(), limits.OFFLINE_FIELD: value}
    body_bytes = codec.canonical_packb(body)
    signature = identity.sign(codec.signing_bytes(limits.ROSTER_CARD, "s", body_bytes))
    data = codec.pack_envelope(limits.ROSTER_CARD, body_bytes, identity.public_key, signature)
    with pytest.raises(limits.ProtocolError) as caught:
        codec.decode_message(data, swarm_id="s", expected_type=limits.ROSTER_CARD)
    assert caught.value.reason == "bad_field"
