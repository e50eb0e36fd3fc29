"""publish: dual-publish (draft layout -> `<topic>.v2`, reviewed -> `<topic>.v3`) and the
archive tap, re-signed with the worker's key.

Enrichment changed the envelope after the producer signed it, so the producer's
signature cannot hold on what Prism emits; the worker signs each output with its own key
(id recorded in `security.signature_key_id`) so every consumer can verify what it reads.
By default it signs both copies of a message with ONE signature (scope `pair`: the
signature covers the SHA-256 digests of the `.v2` and the `.v3` bytes, and each copy carries
the other's digest), because an Ed25519 signature is the largest single cost of a message
here (~36 µs). `outputs.signature_scope: v2` signs each copy on its own with scope v2, for
consumers that cannot verify the pair scope yet; a single-layout topology always uses v2.
Whatever scope the input was signed with, the publisher, classification, PII flag and
encryption metadata the pipeline established are covered on `.v2`, `.v3` and the archive
(docs/signing.md).
The token is stripped again here (defence in depth: even a topology without an
`authenticate` stage never forwards one). Input headers pass through, except credentials
and CloudEvents/content-type headers that describe the *input* value, not the envelope.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.agents.base import Message
from app.bindings import kafka
from app.envelope import Layout
from app.security.jwt_auth import strip_token
from app.security.signing import SCOPE_PAIR, SCOPE_V2, SigningKey
from app.topology import Topology

_DROP_HEADERS = frozenset({"authorization", "proxy-authorization", "prism-auth-token", "x-auth-token", "auth-token",
                           "cookie", "content-type"})
LAYOUT_OF = {"v2": Layout.DRAFT, "v3": Layout.REVIEWED}
#: On every output record: the input record it came from (`topic/partition/offset`), like
#: Connect's error context but for successes - provenance for the archive and for audits.
SOURCE_HEADER = "prism-source"


def _forwardable(lowered: str) -> bool:
    return lowered not in _DROP_HEADERS and not lowered.startswith("ce_")


@dataclass(frozen=True, slots=True)
class Emission:
    topic: str
    record: kafka.KafkaRecord


class Publisher:
    def __init__(self, topology: Topology, *, worker_key: SigningKey | None) -> None:
        self.layouts = [(suffix, LAYOUT_OF[suffix]) for suffix in topology.outputs.layouts]
        self._layouts = tuple(layout for _, layout in self.layouts)
        self.sign_with = worker_key if topology.outputs.sign else None
        both = set(self._layouts) == {Layout.DRAFT, Layout.REVIEWED}
        self.scope = SCOPE_PAIR if both and topology.outputs.signature_scope == "pair" else SCOPE_V2
        self.archive_topic = topology.archive.topic if topology.archive.enabled else None  # None: reads .v3
        #: Which record the archive tap reuses: the (last) reviewed one, as the loop once found it.
        self._reviewed_at = max((i for i, lay in enumerate(self._layouts) if lay is Layout.REVIEWED), default=None)
        self._topics: dict[str, tuple[str, ...]] = {}

    def _output_topics(self, topic: str) -> tuple[str, ...]:
        """`<topic>.<suffix>` per layout, built once per input topic rather than per message."""
        names = self._topics.get(topic)
        if names is None:
            names = self._topics[topic] = tuple(f"{topic}.{suffix}" for suffix, _ in self.layouts)
        return names

    def emissions(self, msg: Message) -> list[Emission]:
        env = msg.env
        strip_token(env)
        forwarded = [(k, v) for k, v in kafka.passthrough_headers(msg.headers)
                     if v is not None and _forwardable(k.lower())] if msg.headers else []
        source = (SOURCE_HEADER, f"{msg.topic}/{msg.partition}/{msg.offset}".encode())
        records = kafka.encode_layouts(env, self._layouts, key=msg.key, headers=forwarded, sign_with=self.sign_with,
                                       scope=self.scope)
        out: list[Emission] = []
        for topic, rec in zip(self._output_topics(msg.topic), records, strict=True):
            rec.headers.append(source)
            out.append(Emission(topic, rec))
        reviewed = records[self._reviewed_at] if self._reviewed_at is not None else None
        if self.archive_topic is not None:
            if reviewed is None:
                reviewed = kafka.encode(env, Layout.REVIEWED, key=msg.key, sign_with=self.sign_with, scope=self.scope)
                reviewed.headers.append(source)
            out.append(Emission(self.archive_topic, reviewed))
        return out
