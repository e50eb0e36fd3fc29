"""What both content modes of the CloudEvents Kafka Protocol Binding 1.0 share.

The header prefix of binary mode (`ce_`), the `content-type` values of structured mode, the
record a writer hands to a Kafka producer, and the headers of a record that are not
CloudEvents attributes: an auth token is taken out (it never becomes an extension) and any
other header is kept as a header extension, in either mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...envelope.model import Envelope
from .._fields import set_auth_token, take_auth_token
from ..legacy import HEADER_EXTENSION_PREFIX

CE_PREFIX = "ce_"
STRUCTURED_PREFIX = "application/cloudevents"
STRUCTURED_JSON = "application/cloudevents+json"


@dataclass(slots=True)
class Record:
    """A Kafka record in either content mode: hand to any Kafka producer."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    dropped: list[str] = field(default_factory=list)


def _other_headers(env: Envelope, pairs: list[tuple[str, bytes]], skip: set[str], notes: list[str]) -> None:
    auth = take_auth_token(pairs)
    notes += auth.notes
    set_auth_token(env, auth.token, notes, "Kafka headers")
    for name, value in pairs:
        if name in skip or name in auth.consumed or name.startswith(CE_PREFIX):
            continue
        ext = HEADER_EXTENSION_PREFIX + name
        env.extensions[ext] = env.extensions[ext] + b", " + value if ext in env.extensions else value
