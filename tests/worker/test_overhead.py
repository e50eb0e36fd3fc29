"""The overhead a worker adds to an input is measured, and it bounds what the worker really adds
(issue 31 item 3; app/worker/limits.py `measured_overhead`, `check_room`)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.agents.base import Message
from app.agents.publish import Publisher
from app.envelope import encode, new_envelope
from app.errors import NoRoomError
from app.security.signing import SigningKey
from app.topology import load_topology
from app.worker.limits import MIN_INPUT_ROOM, WriteLimits, check_room, measured_overhead, record_size
from tests.worker.conftest import ROOT

TOPOLOGY = load_topology(ROOT / "topologies/orders-created.yaml")
SOURCE = TOPOLOGY.sources[0].topic


def _publisher() -> Publisher:
    return Publisher(TOPOLOGY, worker_key=SigningKey.ed25519("worker-" + "k" * 40, Ed25519PrivateKey.generate()))


def test_the_measured_overhead_is_a_few_kib_not_64() -> None:
    overhead = measured_overhead(_publisher(), SOURCE, id_length=128)
    assert 2_048 < overhead < 16 * 1024


@pytest.mark.parametrize("size", [0, 1, 1_000, 100_000])
@pytest.mark.parametrize("ids", [16, 128])
def test_real_outputs_stay_within_the_measured_overhead(size: int, ids: int) -> None:
    """A real input (an envelope with ids at the validated length and a payload of `size`
    bytes) through the publisher: every output record is at most input + overhead."""
    pub = _publisher()
    overhead = measured_overhead(pub, SOURCE, id_length=ids)
    env = new_envelope(SOURCE, b"x" * size, namespace="n" * ids, message_id="m" * ids, correlation_id="c" * ids)
    value = encode(env)
    msg = Message(topic=SOURCE, partition=3, offset=123_456, value=value, key=b"k" * ids, envelope=env, settled=True)
    for e in pub.emissions(msg):
        assert record_size(e.record.key, e.record.value, e.record.headers) <= len(value) + len(msg.key or b"") + overhead


def test_no_room_names_the_topic_and_the_setting() -> None:
    overhead = measured_overhead(_publisher(), SOURCE, id_length=128)
    outputs = {SOURCE: (f"{SOURCE}.v2", f"{SOURCE}.v3")}
    tight = WriteLimits(4 << 20, output_topics=outputs[SOURCE], overhead=overhead).with_broker(
        {f"{SOURCE}.v2": 1 << 20, f"{SOURCE}.v3": overhead + MIN_INPUT_ROOM - 1})
    with pytest.raises(NoRoomError) as err:
        check_room(tight, outputs)
    text = str(err.value)
    assert err.value.code == "no_room" and f"{SOURCE}.v3" in text and "max.message.bytes" in text and "fix:" in text
    roomy = tight.with_broker({f"{SOURCE}.v2": 1 << 20, f"{SOURCE}.v3": overhead + MIN_INPUT_ROOM})
    check_room(roomy, outputs)  # exactly enough room
    assert roomy.input_limit_for(outputs[SOURCE]) == MIN_INPUT_ROOM
