"""The demo's load generator: every message it makes knows the outcome it must have.

The mix mirrors what producers send today (RFC-031 "Motivation"): Prism envelopes in both
layouts (signed with the producer key, with a JWT), Kafka-header metadata, NATS-style
headers, Redis JSON, CloudEvents in both Kafka modes, LNMP text and binary, raw bytes - and
deliberately bad ones: truncated bytes, forged signatures, signed envelopes whose
classification was downgraded after signing (scope v2 covers the security context),
expired tokens, classified data sent unencrypted, timestamps from the future, expired TTLs,
re-sent duplicates, a valid token claiming another namespace and a signed envelope replayed
from another topic. The summary compares what the worker did with these expectations,
message by message kind.

Producers sign with scope v2 (the default). There is no legacy-scope producer kind: the
demo topology keeps `verify_signature.accept_legacy_scope` off, as it should be.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

from app.envelope import Layout, decode, encode, new_envelope
from app.formats import cloudevents as ce
from app.formats.lnmp import Container, LnmpEnvelope, encode_container, encode_text
from app.security.devkeys import DevKeys
from app.security.signing import SigningKey, sign


@dataclass(frozen=True, slots=True)
class Sample:
    kind: str
    expect: str            # "emitted" | "expired" | "duplicate" | "dlq:<reason>"
    value: bytes
    headers: list[tuple[str, bytes]]
    key: bytes | None = None


# kind -> (weight, expected outcome)
MIX: dict[str, tuple[int, str]] = {
    "prism-v3-signed": (20, "emitted"),
    "prism-v2-draft": (8, "emitted"),
    "kafka-headers": (8, "emitted"),
    "nats-headers": (6, "emitted"),
    "redis-json": (8, "emitted"),
    "cloudevent-binary": (6, "emitted"),
    "cloudevent-structured": (6, "emitted"),
    "lnmp-text": (4, "emitted"),
    "lnmp-binary": (4, "emitted"),
    "raw-bytes": (4, "emitted"),
    "duplicate": (5, "duplicate"),
    "ttl-expired": (3, "expired"),
    "malformed-bytes": (3, "dlq:bad_prism_envelope"),
    "forged-signature": (3, "dlq:bad_signature"),
    "classification-downgraded": (2, "dlq:bad_signature"),
    "expired-token": (3, "dlq:token_expired"),
    "restricted-unencrypted": (3, "dlq:policy_violation"),
    "future-timestamp": (3, "dlq:invalid_envelope"),
    "missing-fields": (3, "dlq:invalid_envelope"),
    "namespace-impersonation": (2, "dlq:namespace_not_allowed"),
    "cross-topic-replay": (2, "dlq:topic_mismatch"),
}


class LoadGenerator:
    def __init__(self, keys: DevKeys, *, topic: str, namespace: str, seed: int = 7) -> None:
        self.keys = keys
        self.topic = topic
        self.namespace = namespace
        self.rng = random.Random(seed)
        self.producer_key: SigningKey = keys.keyring.signing["dev-producer-1"]
        self.forger = SigningKey.hmac_sha256("dev-producer-1", b"not-the-real-key-" * 2)
        self.token = keys.mint_token("svc-orders")
        self.expired_token = keys.mint_token("svc-legacy", ttl_s=-3600, now=time.time() - 7200)
        self._recent: list[tuple[bytes, bytes | None]] = []
        self._seq = 0
        kinds, weights = zip(*((k, w) for k, (w, _) in MIX.items()), strict=True)
        self._kinds, self._weights = list(kinds), list(weights)

    def order(self) -> dict:
        self._seq += 1
        n = self.rng.randint(1, 4)
        return {"order_id": f"ord-{self._seq:07d}", "customer_id": f"c-{self.rng.randint(1, 999):03d}",
                "items": [{"sku": f"SKU-{self.rng.randint(1, 500):04d}", "qty": self.rng.randint(1, 5)}
                          for _ in range(n)], "total": round(self.rng.uniform(5, 500), 2), "currency": "EUR"}

    def _env(self, **kw):
        env = new_envelope(self.topic, self.order(), namespace=self.namespace, **kw)
        sec = env.ensure_security()
        sec.data_classification = "internal"
        return env

    def next(self) -> Sample:
        kind = self.rng.choices(self._kinds, self._weights)[0]
        if kind == "duplicate" and not self._recent:
            kind = "prism-v3-signed"
        s = getattr(self, "_" + kind.replace("-", "_"))()
        sample = Sample(kind, MIX[kind][1], s[0], s[1], s[2] if len(s) > 2 else None)
        if sample.expect == "emitted" and kind.startswith("prism-v3"):
            self._recent = [*self._recent, (sample.value, sample.key)][-50:]
        return sample

    # -- good messages -------------------------------------------------------------------
    def _prism_v3_signed(self):
        env = self._env(correlation_id=f"req-{self._seq}", labels={"region": "eu-west"})
        env.ensure_security().auth_token = self.token
        env_id = env.message_id.encode()
        return sign(env, self.producer_key, Layout.REVIEWED), [], env_id

    def _prism_v2_draft(self):
        env = self._env(priority=7)
        env.ensure_security().auth_token = self.token
        return encode(env, Layout.DRAFT), []

    def _kafka_headers(self):
        return (json.dumps(self.order()).encode(),
                [("correlation-id", f"abc-{self._seq}".encode()), ("timestamp", str(int(time.time())).encode()),
                 ("schema-version", b"v2"), ("content-type", b"application/json"),
                 ("Authorization", f"Bearer {self.token}".encode())])

    def _nats_headers(self):
        return (json.dumps(self.order()).encode(),
                [("Nats-Msg-Id", f"nats-{self._seq}-{self.rng.random()}".encode()),
                 ("X-Schema-URL", b"registry://orders.created/v2"),
                 ("X-Trace-ID", b"4bf92f3577b34da6a3ce929d0e0e4736")])

    def _redis_json(self):
        return json.dumps({"meta": {"schema": "v2", "ts": int(time.time())}, "payload": self.order()}).encode(), []

    def _cloudevent_binary(self):
        rec = ce.to_kafka_binary(self._env())
        return rec.value, rec.headers, rec.key

    def _cloudevent_structured(self):
        rec = ce.to_kafka_structured(self._env())
        return rec.value, rec.headers, rec.key

    def _lnmp_text(self):
        env = LnmpEnvelope(timestamp=int(time.time() * 1000), source="sensor-gw", sequence=self._seq)
        return bytes(encode_text(f"F12={self._seq}\nF7=1\n".encode(), env)), []

    def _lnmp_binary(self):
        env = LnmpEnvelope(timestamp=int(time.time() * 1000), source="sensor-gw", sequence=self._seq)
        return encode_container(Container(record=b"\x01\x02" + self._seq.to_bytes(4, "big"), envelope=env)), []

    def _raw_bytes(self):
        return self.rng.randbytes(48), []

    # -- deliberately bad ----------------------------------------------------------------------
    def _duplicate(self):
        # A producer retry: same bytes, same key (so the same partition, where the dedup
        # window for that message id lives).
        value, key = self.rng.choice(self._recent)
        return value, [], key

    def _ttl_expired(self):
        env = self._env(ttl_seconds=1, published_at_ms=int(time.time() * 1000) - 60_000)
        return encode(env), []

    def _malformed_bytes(self):
        good = encode(self._env())
        return good[: len(good) // 2], [("prism-envelope-layout", b"reviewed")]

    def _forged_signature(self):
        env = self._env()
        return sign(env, self.forger, Layout.REVIEWED), []

    def _classification_downgraded(self):
        # Signed as confidential + PII, then relabelled public / no PII on the way (what a
        # legacy-scope signature let through): the signature covers the security context.
        env = self._env()
        sec = env.ensure_security()
        sec.data_classification, sec.contains_pii = "confidential", True
        tampered = decode(sign(env, self.producer_key, Layout.REVIEWED))
        tampered.security.data_classification, tampered.security.contains_pii = "public", False
        return encode(tampered, Layout.REVIEWED), []

    def _expired_token(self):
        env = self._env()
        env.ensure_security().auth_token = self.expired_token
        return encode(env), []

    def _restricted_unencrypted(self):
        env = self._env()
        env.ensure_security().data_classification = "restricted"
        return encode(env), []

    def _future_timestamp(self):
        return encode(self._env(published_at_ms=int(time.time() * 1000) + 86_400_000)), []

    def _namespace_impersonation(self):
        # A valid token for the order service, claiming another team's namespace: the
        # topology's `producers:` allows svc-orders only order-events.
        env = new_envelope(self.topic, self.order(), namespace="billing")
        env.ensure_security().auth_token = self.token
        return sign(env, self.producer_key, Layout.REVIEWED), []

    def _cross_topic_replay(self):
        # A genuine, signed, authenticated envelope of another topic, copied onto this one.
        env = new_envelope("payments.captured", self.order(), namespace=self.namespace)
        env.ensure_security().auth_token = self.token
        return sign(env, self.producer_key, Layout.REVIEWED), []

    def _missing_fields(self):
        env = self._env()
        env.metadata.ClearField("namespace")
        env.metadata.ClearField("message_id")
        return encode(env), [("prism-envelope-layout", b"reviewed")]
