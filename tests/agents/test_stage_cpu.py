"""Issue 14's shortcuts keep every check: normalize's walk of the envelope bytes is reused by
verify_signature (and tells validate the required fields were checked) only for the very
bytes it walked, the producers key memo remembers successes only, and the chain's sampled
stage timing gives the same outcomes as timing every stage."""

from __future__ import annotations

import contextlib

import pytest

from app.agents.base import Message, Stage
from app.agents.chain import Chain, Outcome
from app.agents.normalize import Normalize
from app.agents.validate import Validate
from app.agents.verify_signature import VerifySignature
from app.envelope import Layout, encode, new_envelope
from app.envelope.wire import encode_varint, scan
from app.errors import (
    AmbiguousEnvelopeError,
    DuplicateError,
    ExpiredError,
    KeyNamespaceError,
    SignatureError,
    ValidationError,
)
from app.security.producers import ProducerBindings
from app.security.signing import sign
from app.topology import NormalizeStage, ProducerSpec, ValidateStage, VerifySignatureStage
from tests.agents.conftest import make_msg

NS = {"orders.created": "order-events"}


def _normalized(value: bytes) -> Message:
    msg = make_msg(value)
    Normalize(NormalizeStage(), namespaces=NS, formats={}).process(msg)
    return msg


def _verify(dev_keys) -> VerifySignature:
    return VerifySignature(VerifySignatureStage(keyring="x", policy="required"), keyring=dev_keys.keyring)


def _signed(dev_keys, layout: Layout = Layout.REVIEWED) -> bytes:
    env = new_envelope("orders.created", {"order_id": "o-1"}, namespace="order-events")
    return sign(env, dev_keys.keyring.signing["dev-producer-1"], layout)


# --------------------------------------------------------------------------- the shared walk


@pytest.mark.parametrize("layout", list(Layout))
def test_normalize_keeps_its_walk_of_a_valid_envelope(dev_keys, layout) -> None:
    value = _signed(dev_keys, layout)
    msg = _normalized(value)
    assert msg.scanned is not None
    walked, records, lay = msg.scanned
    assert walked is msg.value and records == scan(memoryview(value)) and lay is layout
    _verify(dev_keys).process(msg)
    assert msg.signature is not None and msg.signature.key_id == "dev-producer-1"


def test_legacy_input_has_no_walk_to_share() -> None:
    msg = _normalized(b'{"order_id": "o-1"}')
    assert not msg.original_is_envelope and msg.scanned is None


def test_the_walk_of_other_bytes_is_never_used(dev_keys) -> None:
    """If `value` were replaced after normalize, the signature is checked on the new bytes."""
    good = _signed(dev_keys)
    msg = _normalized(good)
    tampered = good.replace(b"o-1", b"o-2")
    assert tampered != good and len(tampered) == len(good)
    msg.value = tampered  # same layout and offsets, other bytes: the records must not vouch for them
    with pytest.raises(SignatureError) as e:
        _verify(dev_keys).process(msg)
    assert e.value.code == "bad_signature"


@pytest.mark.parametrize("signed", [True, False])
def test_an_ambiguous_envelope_is_refused_from_the_shared_walk(dev_keys, signed) -> None:
    """A second security record decodes (protobuf merges it) and has every required field, so
    normalize keeps its walk; the ambiguity check still runs on it."""
    base = _signed(dev_keys) if signed else encode(new_envelope("orders.created", {"a": 1}, namespace="order-events"))
    second = encode_varint(2 << 3 | 2) + encode_varint(0)  # an empty security record
    msg = _normalized(base + second * 2)  # two more: ambiguous whether or not base has one
    assert msg.scanned is not None
    stage = VerifySignature(VerifySignatureStage(keyring="x", policy="optional"), keyring=dev_keys.keyring)
    with pytest.raises(AmbiguousEnvelopeError) as e:
        stage.process(msg)
    assert e.value.code == "ambiguous_envelope"


def test_validate_checks_required_fields_unless_normalize_did() -> None:
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    env.metadata.published_at_ms = 0  # a required-field problem: normalize keeps no walk
    msg = _normalized(encode(env))
    assert msg.original_is_envelope and msg.scanned is None
    with pytest.raises(ValidationError) as e:
        Validate(ValidateStage()).process(msg)
    assert "metadata.published_at_ms" in str(e.value)

    direct = make_msg(b"")  # a message no normalize stage saw: checked in full
    direct.envelope = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    direct.envelope.metadata.ClearField("message_id")
    with pytest.raises(ValidationError) as e:
        Validate(ValidateStage()).process(direct)
    assert "metadata.message_id" in str(e.value)


# --------------------------------------------------------------------------- producers key memo


def test_the_key_memo_remembers_successes_only_and_apart_from_principals() -> None:
    b = ProducerBindings([ProducerSpec(principals=["orders-key"], namespaces=["billing"]),
                          ProducerSpec(key_ids=["orders-key"], namespaces=["order-events"])], ["orders.created"])
    b.check_principal("orders-key", "billing", "orders.created")  # a principal spelled like the key
    for _ in range(2):  # a refusal is refused again, never remembered
        with pytest.raises(KeyNamespaceError):
            b.check_key("orders-key", "billing", "orders.created")
    for _ in range(2):
        b.check_key("orders-key", "order-events", "orders.created")
    assert set(b._keys_seen) == {("orders-key", "order-events", "orders.created")}


# --------------------------------------------------------------------------- sampled stage timing


class _Named(Stage):
    def __init__(self, name: str, exc: BaseException | None = None, every: int = 0) -> None:
        self.name, self.exc, self.every, self.calls = name, exc, every, 0

    def process(self, msg: Message) -> None:
        self.calls += 1
        if self.exc is not None and (not self.every or self.calls % self.every == 0):
            raise self.exc


def _chain(*stages: Stage, every: int) -> Chain:
    c = Chain(list(stages), dlq_topic_for=lambda t: t + ".dlq")
    c.stage_timing_every = every
    return c


def test_stages_are_timed_on_one_message_in_n_and_the_chain_on_every_one() -> None:
    c = _chain(_Named("normalize"), _Named("validate"), every=4)
    for i in range(10):
        assert c.run(make_msg(b"x", offset=i)).outcome is Outcome.EMITTED
    s = c.stats
    assert s.chain_calls == 10 and s.chain_ns > 0
    assert s.stage_calls == {"normalize": 3, "validate": 3}  # messages 0, 4 and 8
    assert set(s.stage_us_per_message()) == {"normalize", "validate"}


@pytest.mark.parametrize("exc", [ExpiredError("ttl"), DuplicateError("dup"), SignatureError("forged"),
                                 KeyError("a bug")])
@pytest.mark.parametrize("expired_to_dlq", [False, True])
def test_untimed_messages_end_exactly_as_timed_ones(exc, expired_to_dlq) -> None:
    results = {}
    for every in (1, 1000):  # every message timed / all but the first untimed
        c = _chain(_Named("normalize"), _Named("policy", exc, every=2), _Named("enrich"), every=every)
        c.expired_to_dlq = expired_to_dlq
        out = [c.run(make_msg(b"x", offset=i)) for i in range(6)]
        results[every] = ([(r.outcome, r.stage, r.reason, r.dlq.value if r.dlq else None) for r in out],
                          dict(c.stats.outcomes), dict(c.stats.dlq_reasons), c.stages[2].calls)
    assert results[1] == results[1000]
    outcomes = [o for o, *_ in results[1][0]]
    assert outcomes.count(Outcome.EMITTED) == 3 and results[1][3] == 3  # enrich never saw a failed message


@pytest.mark.parametrize("every", [1, 0, -3])
def test_an_interval_of_one_or_less_times_every_message(every) -> None:
    c = _chain(_Named("normalize"), every=every)
    for i in range(5):
        c.run(make_msg(b"x", offset=i))
    assert c.stats.stage_calls["normalize"] == 5 and c.stats.chain_calls == 5


def test_with_a_tracing_scope_every_message_is_timed() -> None:
    c = _chain(_Named("normalize"), every=16)
    c.stage_scope = lambda stage, msg: contextlib.nullcontext()
    for i in range(5):
        c.run(make_msg(b"x", offset=i))
    assert c.stats.stage_calls["normalize"] == 5


def test_a_mutable_value_gets_no_shared_walk(dev_keys) -> None:
    """A bytearray could change after normalize walked it: verify_signature walks it itself."""
    msg = make_msg(bytearray(_signed(dev_keys)))  # type: ignore[arg-type]
    Normalize(NormalizeStage(), namespaces=NS, formats={}).process(msg)
    assert msg.original_is_envelope and msg.scanned is None
    _verify(dev_keys).process(msg)
    assert msg.signature is not None
