"""normalize: any input shape -> a Prism envelope (RFC-031 "Motivation" shapes, CloudEvents, LNMP).

It is also where the envelope meets the transport, so it owns the source-topic binding: an
envelope (or a legacy input that names a topic) read from source topic T must claim T or one
of T's `topic_aliases`. A signed envelope copied from another topic keeps its valid signature
but claims its original topic, and goes to the DLQ as `topic_mismatch` - before any sink or
lake partition could file it under that topic. The check is always on; it costs one set lookup.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from app.agents.base import Message, Stage
from app.envelope.layouts import KNOWN_ENVELOPE_VERSION, PRODUCER_VERSION_EXT
from app.errors import FormatError, TopicMismatchError, UnknownSourceError
from app.formats.detect import InputShape, normalize
from app.observability.redaction import default_redactor
from app.topology import LnmpSource, NormalizeStage

# Which detected shapes a source's declared `format` accepts.
_ACCEPTS: dict[str, frozenset[InputShape]] = {
    "prism": frozenset({InputShape.PRISM_REVIEWED, InputShape.PRISM_DRAFT}),
    "cloudevents": frozenset({InputShape.CLOUDEVENT_BINARY, InputShape.CLOUDEVENT_STRUCTURED}),
    "kafka-headers": frozenset({InputShape.KAFKA_HEADERS, InputShape.RAW}),
    "nats-headers": frozenset({InputShape.NATS_HEADERS, InputShape.RAW}),
    "redis-json": frozenset({InputShape.REDIS_JSON}),
    "lnmp": frozenset({InputShape.LNMP_BINARY, InputShape.LNMP_TEXT}),
    "raw": frozenset(InputShape),
}
ENVELOPE_SHAPES = _ACCEPTS["prism"]
LNMP_SHAPES = _ACCEPTS["lnmp"]
#: the member `process` tests on every message, as a module name (an EnumType attribute
#: lookup costs ~50 ns more; as in app/formats/detect.py)
_PRISM_DRAFT = InputShape.PRISM_DRAFT
log = logging.getLogger("prism.worker")
#: newer envelope versions already warned about in this process: one line per version, not per message
_WARNED_VERSIONS: set[int] = set()
_WARN_LOCK = threading.Lock()
#: distinct newer versions counted per stage; more are counted as -1 (a bounded metric label)
MAX_VERSIONS = 16


class Normalize(Stage):
    name = "normalize"

    def __init__(self, settings: NormalizeStage, *, namespaces: dict[str, str], formats: dict[str, str],
                 accepted_topics: dict[str, frozenset[str]] | None = None,
                 lnmp: dict[str, LnmpSource] | None = None) -> None:
        self.settings = settings
        #: source topic -> its LNMP rules (sources[].lnmp); topics not named read LNMP strictly
        self.lnmp = lnmp or {}
        #: source topics whose LNMP is read in loose mode (decided once, not per message)
        self._loose = frozenset(t for t, cfg in self.lnmp.items() if cfg.mode == "loose")
        #: source topic -> the LNMP `source` identifiers it accepts (only topics that list them)
        self._known_sources = {t: frozenset(cfg.known_sources) for t, cfg in self.lnmp.items()
                               if cfg.known_sources is not None}
        #: draft envelopes read whose `envelope_version` is newer than this build knows, per
        #: version, since the last `drain_newer_versions` (the worker's metrics read them per batch)
        self.newer_versions: Counter[int] = Counter()
        self._versions_seen: set[int] = set()
        self.namespaces = namespaces  # source topic -> namespace for inputs that carry none
        self.formats = formats        # source topic -> declared format
        #: source topic -> envelope topics it accepts (itself, plus `topic_aliases`)
        self.accepted_topics = accepted_topics if accepted_topics is not None else {
            t: frozenset([t]) for t in namespaces}

    def process(self, msg: Message) -> None:
        topic = msg.topic
        res = normalize(msg.value, msg.headers, topic=topic, namespace=self.namespaces[topic],
                        default_content_type=self.settings.default_content_type, key=msg.key,
                        now_ms=msg.timestamp_ms,
                        # the same input record always gets the same generated id, so a
                        # redelivery after a crash is caught by dedup (formatted only for the
                        # shapes that may need an id: not for every envelope)
                        id_seed=lambda: f"{topic}/{msg.partition}/{msg.offset}".encode(),
                        strict=topic not in self._loose)
        shape = res.shape
        msg.shape = str(shape)
        msg.envelope = env = res.envelope
        msg.original_is_envelope = shape in ENVELOPE_SHAPES
        if res.records is not None and type(msg.value) is bytes:  # immutable: the walk stays true
            msg.scanned = (msg.value, res.records, res.layout)  # type: ignore[assignment]  # Message.scanned
        notes = res.notes
        if shape is _PRISM_DRAFT and notes:  # a newer version always leaves a note
            self._newer_version(res.envelope, topic)
        msg.generated_id = bool(notes) and any(n.startswith("metadata.message_id generated") for n in notes)
        header = env.header
        # An absent security context reads as the empty default (reading never sets it): ""
        # for the token and the publisher, without the HasField call (~0.1 µs per message).
        sec = header.security
        token = sec.auth_token  # one read: each builds a str
        # the publisher the input states: a claim until a verifier confirms it (app/agents/identity.py)
        msg.claimed = (sec.publisher_id, sec.publisher_team)
        if token:
            msg.secrets.append(token.encode())
            # "at least two dots" as two `find`s: they stop at the second dot, where `count`
            # reads the whole token, signature included (~170 ns less for a JWT; issue 29)
            if not (token.startswith("eyJ") and token.find(".", token.find(".") + 1) >= 0) and token.strip("*"):
                # Opaque tokens have no recognisable shape: tell the log redactor about them.
                # (JWTs are masked by their shape; registering each would only cost CPU. A
                # replayed DLQ record's token is all '*': nothing to hide.)
                default_redactor().register_secret(token)
        known = self._known_sources.get(topic)
        if known is not None and shape in LNMP_SHAPES:
            self._check_lnmp_source(topic, msg.claimed[0], known)
        declared = self.formats.get(topic, "auto")
        if declared != "auto" and shape not in _ACCEPTS[declared]:
            raise FormatError(f"source {topic!r} is declared as {declared!r} but the message is {shape.value}",
                              path="sources[].format",
                              hint="fix the producer, or set the source's format to `auto`")
        claimed = header.metadata.topic
        # An empty topic is not a claim: the validate stage reports it as a missing field.
        if claimed and claimed not in self.accepted_topics.get(topic, (topic,)):
            raise TopicMismatchError(
                f"envelope claims topic {claimed[:200]!r} but was read from source topic {topic!r}",
                path="metadata.topic",
                hint="produce the envelope to the topic it names (a copy from another topic is a replay), "
                     "or list that name in the source's topic_aliases")

    @staticmethod
    def _check_lnmp_source(topic: str, source: str, known: frozenset[str]) -> None:
        """LNMP spec v1 section 9.1: a `source` is untrusted metadata; where the topology lists the
        known service identifiers, an unknown one is refused before any later stage reads it.
        A message that names no source claims nothing and passes (there is nothing to check; the
        identity rule records it as unverified either way)."""
        if source and source not in known:
            raise UnknownSourceError(
                f"LNMP source {source[:128]!r} is not a known service identifier of source topic {topic!r}",
                path="lnmp.source (TLV 0x11 / #ENVELOPE source= / lnmp.source header)",
                hint=f"add it to sources[topic={topic}].lnmp.known_sources if it is a real service, or fix the "
                     "producer's source identifier")

    def _newer_version(self, env: object, topic: str) -> None:
        """RFC-031 Backward Compatibility: a draft envelope of a newer `envelope_version` is
        processed on a best-effort basis (every known field read, unknown ones carried - see
        app/envelope/layouts.py). Counted per version, and logged once per version per process."""
        raw = env.extensions.get(PRODUCER_VERSION_EXT)  # type: ignore[attr-defined]
        if raw is None:
            return
        try:
            version = int(raw)
        except ValueError:
            return
        if version not in self._versions_seen:
            if len(self._versions_seen) >= MAX_VERSIONS:
                version = -1  # counted, under one bounded label value
            else:
                self._versions_seen.add(version)
        self.newer_versions[version] += 1
        if version in _WARNED_VERSIONS:
            return
        with _WARN_LOCK:
            if version in _WARNED_VERSIONS:
                return
            _WARNED_VERSIONS.add(version)
        log.warning("draft envelopes with envelope_version %s on %s are newer than this worker's %d: processed on a "
                    "best-effort basis (known fields read, unknown fields carried in prism.unknown.* extensions); "
                    "upgrade the worker (logged once per version; counted in "
                    "prism_envelope_version_newer_total)", version if version >= 0 else "(one of many)", topic,
                    KNOWN_ENVELOPE_VERSION,
                    extra={"event": "envelope_version_newer", "version": version, "topic": topic})

    def drain_newer_versions(self) -> Counter[int]:
        """The newer-version counts since the last call (and reset them): the observer adds them
        to its counter once per batch, so the per-message path only increments a dict entry."""
        out, self.newer_versions = self.newer_versions, Counter()
        return out
