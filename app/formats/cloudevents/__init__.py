"""CloudEvents 1.0 <-> Prism envelopes, and both content modes of the CloudEvents Kafka
protocol binding.

Kafka binding rules followed (CloudEvents Kafka Protocol Binding 1.0):
* structured mode when the `content-type` header starts with `application/cloudevents`
  (only the JSON event format, `application/cloudevents+json`, is read); the value is the
  whole event;
* otherwise binary mode: attributes in `ce_<name>` headers (UTF-8 values, names compared
  case-insensitively), `datacontenttype` in `content-type`, the value is the data as is;
* the `partitionkey` extension is the Kafka record key.

The `cloudevents` SDK (2.x, `cloudevents.core`) validates every event we read or write (required
attributes, attribute types, extension names) and writes the attribute part of structured
events and the headers of binary ones. Reading is done here, not with the SDK's readers,
because those (a) invent an `id` and `time` when they are missing instead of refusing the event,
(b) re-encode JSON data, which would change the payload bytes, and (c) raise non-Prism errors.

Attribute mapping (full table with the reasons in docs/formats.md):

| CloudEvents                 | Prism envelope                                                     |
|-----------------------------|--------------------------------------------------------------------|
| id                          | metadata.message_id                                                |
| source                      | security.publisher_id; `/prism/<namespace>` when there is none     |
| type                        | schema.schema_name; metadata.topic when there is no schema name    |
| time (RFC 3339)             | metadata.published_at_ms                                           |
| datacontenttype             | metadata.content_type                                              |
| dataschema                  | schema.schema_url                                                  |
| subject, other extensions   | extensions["ce.<name>"]                                            |
| traceparent                 | observability.trace_id / span_id / trace_flags                     |
| tracestate                  | extensions["w3c.tracestate"] (as the backend bindings do)          |
| dataclassification          | security.data_classification                                       |
| partitionkey / record key   | extensions["kafka.key"]                                            |
| prism* extensions           | the remaining envelope fields (priority, ttl, schema version ...)  |

`source` (and `prismpublisherteam`) is a producer claim like any other shape's publisher: on
the worker's outputs it stays the publisher only when a verifier established that identity,
and is otherwise kept as `prism.claimed.publisher_id` (app/agents/identity.py).

`metadata.topic` and `metadata.namespace` come from the transport (the Kafka topic the event was
read from, the configured namespace), never from the event: an event must not pick its tenant.
The auth token never leaves Prism and a signature cannot survive (it covers envelope bytes):
both are reported in `dropped`.

Modules, one concern each:

* `attributes`: the CloudEvents context attributes (names, type system, required attributes);
* `extensions`: the `prism*` extension attributes for envelope fields CloudEvents has no
  attribute for;
* `sdk`: the boundary with the `cloudevents` SDK (validation, its errors as CloudEventError);
* `encode` / `decode`: envelope -> CloudEvent attributes, CloudEvent attributes -> envelope;
* `kafka`: what both Kafka content modes share (record, header prefixes, non-CloudEvents headers);
* `binary` / `structured`: the two content modes of the Kafka binding, both directions;
* `modes`: telling the content modes apart, and reading a record in either.

Import from this package (`from app.formats import cloudevents as ce`); the modules are its layout.
"""

# The names in __all__ plus, marked `noqa: F401`, the other public names of the module this
# package replaced. The `prism*` attribute names (A_TYPE_URL, ...) are in `extensions`.
from .attributes import (  # noqa: F401
    EXTENSION_PREFIX,
    KEY_EXTENSION,
    RESERVED,
    SOURCE_PREFIX,
    SPECVERSION,
)
from .binary import from_kafka_binary, to_kafka_binary
from .decode import Decoded, attributes_to_envelope, from_cloudevent
from .encode import Converted, envelope_attributes, to_cloudevent  # noqa: F401
from .extensions import PRISM_ATTRIBUTES  # noqa: F401
from .kafka import CE_PREFIX, STRUCTURED_JSON, STRUCTURED_PREFIX, Record  # noqa: F401
from .modes import from_kafka, is_binary, is_structured
from .structured import from_kafka_structured, to_kafka_structured

__all__ = [
    "KEY_EXTENSION", "STRUCTURED_JSON", "Converted", "Decoded", "Record", "attributes_to_envelope",
    "from_cloudevent", "from_kafka", "from_kafka_binary", "from_kafka_structured", "is_binary", "is_structured",
    "to_cloudevent", "to_kafka_binary", "to_kafka_structured",
]

