"""CloudEvents 1.0 context attributes: the names with a fixed meaning here, and the type system.

Implements the parts of the CloudEvents spec that both directions share:
* "Context Attributes": the required attributes (`specversion`, `id`, `source`, `type`) and the
  optional ones, and which names Prism maps to envelope fields (`RESERVED`);
* "Naming Conventions": an extension attribute name is lowercase letters and digits;
* "Type System": how a Boolean, Integer or Timestamp attribute value reads as a string.

Also the envelope-side names of the mapping: `ce.<name>` extensions, `kafka.key`, `/prism/<ns>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ...errors import CloudEventError
from .extensions import PRISM_ATTRIBUTES

SPECVERSION = "1.0"
#: Envelope extension prefix for CloudEvents attributes Prism has no field for.
EXTENSION_PREFIX = "ce."
#: Envelope extension holding the Kafka record key (the `partitionkey` extension).
KEY_EXTENSION = "kafka.key"
SOURCE_PREFIX = "/prism/"

_CORE = ("specversion", "id", "source", "type")
_OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
_NAME = re.compile(r"[a-z0-9]+")
#: Attribute names with a fixed meaning here: never produced from `ce.<name>` extensions.
#: `subject` is not here: it has no envelope field, so it travels as extensions["ce.subject"].
RESERVED = frozenset({*_CORE, "datacontenttype", "dataschema", "time", "data", "traceparent", "tracestate",
                      "dataclassification", "partitionkey", *PRISM_ATTRIBUTES})


def _attr_text(value: Any) -> str:
    """Canonical string form of an attribute value (CloudEvents type system)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def _require(attrs: Mapping[str, Any], where: str) -> None:
    for name in _CORE:
        v = attrs.get(name)
        if v is None:
            raise CloudEventError(f"required attribute {name!r} is missing", path=f"{where}{name}",
                                  hint="a CloudEvent needs specversion, id, source and type")
        if not isinstance(v, str) or not v:
            raise CloudEventError(f"required attribute {name!r} must be a non-empty string", path=f"{where}{name}")
    if attrs["specversion"] != SPECVERSION:
        raise CloudEventError(f"specversion {attrs['specversion'][:20]!r} is not supported",
                              path=f"{where}specversion", hint=f"this reader supports CloudEvents {SPECVERSION}")


def _as_text(name: str, value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    raise CloudEventError(f"attribute {name!r} has a {type(value).__name__} value", path=where,
                          hint="CloudEvents attribute values are strings, integers, booleans or timestamps")

