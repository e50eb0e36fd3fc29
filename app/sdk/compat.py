"""`check_compat`: can a given consumer read what is on a topic right now?

It reads a sample of a topic's stored messages without consuming them (Kafka: no group,
from the beginning; Redis: XRANGE; NATS: direct gets; PostgreSQL: a plain SELECT), sorts
each into its shape (`app.formats.detect`), and checks it against what the consumer
expects:

* `expect_layout` - the wire layout the consumer parses. A consumer generated from one
  `.proto` reads only that layout (the draft puts the payload at field 3, the reviewed one
  at field 99); the Prism SDK reads both (`None`, the default).
* `expect_version` - the `schema.schema_version` the consumer asserts (RFC-030), compared
  as `SchemaAssertion` does (`v2` == `2`).
* `dual_read` - the consumer reads legacy shapes too (RFC-031 Phase 2, `read_any`);
  otherwise a legacy message is a problem.
* `verify_with` - the consumer requires signatures by these keys.

The verdict is `compatible` (every sampled message readable), with counts per shape,
layout and schema version and the first problems found (ref + reason), which is what a
team wants to know before switching a consumer or a producer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..envelope.codec import Layout, decode, detect_layout
from ..envelope.model import Envelope
from ..envelope.validation import required_problems
from ..errors import PrismError
from ..formats.detect import InputShape, detect, normalize
from ..schema.assertion import SchemaAssertion
from ..security.signing import VerificationKeys, verify
from ._canonical import canonical_wire
from .backends import backend_for_url
from .backends.base import RawMessage, redact_url
from .backends.postgres import PostgresBackend

PRISM_SHAPES = frozenset({InputShape.PRISM_DRAFT, InputShape.PRISM_REVIEWED})
MAX_PROBLEMS = 20


@dataclass(slots=True)
class CompatReport:
    topic: str
    url: str
    expect_layout: str | None
    expect_version: str | None
    dual_read: bool
    sampled: int = 0
    readable: int = 0
    shapes: Counter[str] = field(default_factory=Counter)
    layouts: Counter[str] = field(default_factory=Counter)
    schema_versions: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    @property
    def compatible(self) -> bool | None:
        """True when every sampled message is readable; None when the topic had none."""
        if self.sampled == 0:
            return None
        return self.readable == self.sampled

    def add_problem(self, ref: str, reason: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{ref}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "url": self.url, "expect_layout": self.expect_layout,
            "expect_version": self.expect_version, "dual_read": self.dual_read, "sampled": self.sampled,
            "readable": self.readable, "compatible": self.compatible, "shapes": dict(self.shapes),
            "layouts": dict(self.layouts), "schema_versions": dict(self.schema_versions),
            "problem_count": self.problem_count, "problems": self.problems,
        }


def _check_prism(report: CompatReport, raw: RawMessage, env: Envelope | None, assertion: SchemaAssertion | None,
                 verify_with: VerificationKeys | None) -> str | None:
    """The reason the consumer cannot read this envelope, or None."""
    value = raw.value
    try:
        layout = detect_layout(value) if env is None else Layout.REVIEWED
        if env is None:
            env = decode(value)
    except PrismError as exc:
        return f"broken envelope: {exc.message}"
    report.layouts[layout.value] += 1
    version = env.schema.schema_version if env.schema is not None else ""
    report.schema_versions[version or "(none)"] += 1
    missing = required_problems(env)
    if missing:
        return "envelope misses required fields: " + "; ".join(str(p) for p in missing)
    if report.expect_layout is not None and layout.value != report.expect_layout:
        return f"{layout.value} layout, the consumer parses the {report.expect_layout} layout"
    if assertion is not None and not _version_ok(assertion, version):
        return f"schema version {version or '(none)'}, the consumer expects {assertion.expected_version}"
    if verify_with is not None:
        try:
            verify(value if raw.envelope is None else canonical_wire(env), verify_with)
        except PrismError as exc:
            return f"signature: {exc.message}"
    return None


def _version_ok(assertion: SchemaAssertion, version: str) -> bool:
    before = assertion.mismatches  # "ignore" mode only counts; the comparison rules stay RFC-030's
    assertion.check(version or None)
    return assertion.mismatches == before


def analyse(report: CompatReport, messages: list[RawMessage], *, verify_with: VerificationKeys | None = None
            ) -> CompatReport:
    """Fill `report` from already-read messages (the backend-free half of `check_compat`)."""
    assertion = SchemaAssertion(report.expect_version, "ignore") if report.expect_version is not None else None
    for raw in messages:
        report.sampled += 1
        shape = InputShape.PRISM_REVIEWED if raw.envelope is not None else detect(raw.value, raw.headers)
        report.shapes[shape.value] += 1
        if shape in PRISM_SHAPES:
            reason = _check_prism(report, raw, raw.envelope, assertion, verify_with)
        elif not report.dual_read:
            reason = f"{shape.value} message, not a Prism envelope (enable dual-read to accept legacy shapes)"
        else:
            try:
                normalize(raw.value, raw.headers, topic=report.topic, namespace="legacy")
                reason = None
            except PrismError as exc:
                reason = f"{shape.value} message the dual-read path cannot read: {exc.message}"
        if reason is None:
            report.readable += 1
        else:
            report.add_problem(raw.ref or f"#{report.sampled}", reason)
    return report


async def check_compat(url: str, topic: str, *, sample: int = 100, expect_layout: Layout | str | None = None,
                       expect_version: str | None = None, dual_read: bool = False,
                       verify_with: VerificationKeys | None = None) -> CompatReport:
    """Read up to `sample` messages of `topic` at `url` and judge them (module docstring)."""
    layout = Layout(expect_layout).value if expect_layout not in (None, "any") else None
    report = CompatReport(topic, redact_url(url), layout, expect_version, dual_read)
    backend = backend_for_url(url)
    if isinstance(backend, PostgresBackend):
        backend.create = False  # a read-only check never creates a schema or a table
    await backend.connect()
    try:
        messages = await backend.sample(topic, sample)
    finally:
        await backend.close()
    return analyse(report, messages, verify_with=verify_with)
