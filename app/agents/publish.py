"""publish: dual-publish (draft layout -> `<topic>.v2`, reviewed -> `<topic>.v3`) and the
archive tap, re-signed with the worker's key.

Enrichment changed the envelope after the producer signed it, so the producer's
signature cannot hold on what Prism emits; the worker signs each output with its own key
(id recorded in `security.signature_key_id`) so every consumer can verify what it reads.
The token is stripped again here (defence in depth: even a topology without an
`authenticate` stage never forwards one). Input headers pass through, except credentials
and CloudEvents/content-type headers that describe the *input* value, not the envelope.

Signing on a thread pool (`SigningBatch`, opt-in: `PipelineApp(sign_threads=N)`): with an
Ed25519 worker key the two signatures are most of publish's CPU (~30-40 us each), and
pyca/cryptography releases the GIL while it signs. The worker can then build a batch's
outputs with placeholder signatures (`app.security.signing.DeferredSigner`), have the pool
sign them in chunks while it runs the chain over the rest of the batch, and swap the
signatures in before the batch's writes. Records, order and failures (a signature that
fails sends that message to the DLQ) are the same as with `Publisher.emissions`. Why it is
off by default: `app/worker/pipeline.py`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from app.agents.base import Message
from app.bindings import kafka
from app.envelope import Layout
from app.security.jwt_auth import strip_token
from app.security.signing import ED25519, DeferredSigner, PendingSignature, SigningKey
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
        self.archive_topic = topology.archive.topic if topology.archive.enabled else None  # None: reads .v3

    def emissions(self, msg: Message) -> list[Emission]:
        return self._emissions(msg, self.sign_with)

    def can_defer_signing(self) -> bool:
        """True when the outputs are signed with an Ed25519 key (what `SigningBatch` offloads;
        an HMAC signature costs ~2 us, less than handing it to a thread)."""
        return self.sign_with is not None and self.sign_with.algorithm == ED25519

    def _emissions(self, msg: Message, sign_with: SigningKey | None) -> list[Emission]:
        env = msg.env
        strip_token(env)
        forwarded = [(k, v) for k, v in kafka.passthrough_headers(msg.headers)
                     if v is not None and _forwardable(k.lower())] if msg.headers else []
        source = (SOURCE_HEADER, f"{msg.topic}/{msg.partition}/{msg.offset}".encode())
        out: list[Emission] = []
        reviewed: kafka.KafkaRecord | None = None
        records = kafka.encode_layouts(env, self._layouts, key=msg.key, headers=forwarded, sign_with=sign_with)
        for (suffix, layout), rec in zip(self.layouts, records, strict=True):
            rec.headers.append(source)
            out.append(Emission(f"{msg.topic}.{suffix}", rec))
            if layout is Layout.REVIEWED:
                reviewed = rec
        if self.archive_topic is not None:
            if reviewed is None:
                reviewed = kafka.encode(env, Layout.REVIEWED, key=msg.key, sign_with=sign_with)
                reviewed.headers.append(source)
            out.append(Emission(self.archive_topic, reviewed))
        return out


class SigningBatch:
    """One batch's outputs with their Ed25519 signatures computed on `pool` (module docs).

    Per message, in order: `emissions(msg)` (placeholders; chunks of `chunk` signatures go to
    the pool as they fill up), then, once `wait()`/`wait_sync()` returned, `finish(msg, ems)`
    for the records to write - or the exception signing raised for that message, which
    `Publisher.emissions` would have raised. A finished message's `env.security.signature`
    holds what direct signing leaves there (its last signature).
    """

    def __init__(self, publisher: Publisher, pool: Executor | None, *, chunk: int = 64) -> None:
        assert publisher.sign_with is not None
        self.publisher = publisher
        self.pool = pool
        self.chunk = chunk
        self.signer = DeferredSigner(publisher.sign_with)
        self._futures: list[Future[list[PendingSignature]]] = []
        self._jobs: dict[int, list[PendingSignature]] = {}  # id(msg) -> its signatures, in order

    def emissions(self, msg: Message) -> list[Emission]:
        signer = self.signer
        before = signer.pending()
        try:
            out = self.publisher._emissions(msg, signer.key)
        except Exception:
            # Direct signing would have stopped at the first signature that failed, before
            # whatever raised here: sign this message's recorded ones now to raise the same.
            for job in signer.compute(signer.drop_since(before)):
                if job.error is not None:
                    raise job.error from None
            raise
        self._jobs[id(msg)] = signer.recorded_since(before)
        if signer.pending() >= self.chunk:
            self.flush()
        return out

    def flush(self) -> None:
        """Hand the signatures recorded so far to the pool (inline when there is none or it is shut down)."""
        jobs = self.signer.take()
        if not jobs:
            return
        if self.pool is not None:
            try:
                self._futures.append(self.pool.submit(self.signer.compute, jobs))
                return
            except RuntimeError:  # pool shut down (worker stopping): sign here
                pass
        self.signer.compute(jobs)

    async def wait(self) -> None:
        """Every signature of the batch computed (the event loop keeps running meanwhile)."""
        self.flush()
        futures, self._futures = self._futures, []
        for fut in futures:
            await asyncio.wrap_future(fut)

    def wait_sync(self) -> None:
        self.flush()
        futures, self._futures = self._futures, []
        for fut in futures:
            fut.result()

    def finish(self, msg: Message, emissions: list[Emission]) -> list[Emission]:
        jobs = self._jobs.pop(id(msg))
        if not jobs:
            return emissions
        patched: dict[int, kafka.KafkaRecord] = {}  # the archive may share the .v3 record
        out = []
        for e in emissions:
            rec = patched.get(id(e.record))
            if rec is None:
                rec = patched[id(e.record)] = _patched(e.record, jobs)
            out.append(Emission(e.topic, rec))
        sec = msg.env.security
        if sec is not None:
            sec.signature = jobs[-1].signature or b""
        return out


def _patched(rec: kafka.KafkaRecord, jobs: list[PendingSignature]) -> kafka.KafkaRecord:
    for job in jobs:
        if job.placeholder in rec.value:
            return kafka.KafkaRecord(key=rec.key, value=DeferredSigner.patch(rec.value, job), headers=rec.headers,
                                     timestamp_ms=rec.timestamp_ms)
    for job in jobs:  # a failed signature's record
        if job.error is not None:
            raise job.error
    return rec  # unsigned record (no signature was asked for it)
