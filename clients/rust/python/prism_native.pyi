"""Types of `prism_native`, the worker's optional compiled hot path (clients/rust/python)."""

from collections.abc import Callable
from typing import Any

ABI: int  # 11: scan, security_record, security_span, signed_message, signed_mac, pair_copies (with the envelope
#          headers), DocPlan, finish_batch, murmur2, record_tail, record_batch (reading a record's tail), seal_batch
__version__: str

class WireFault(ValueError):
    """A record walk stopped: args are (kind, at, field, wire_type, length, remaining)."""

def scan(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
         ) -> list[tuple[int, int, int, int, int]]:
    """`app.envelope.wire.scan`, compiled: every top-level record of `buf[start:end]`."""

class SecurityFault(ValueError):
    """The security record is ambiguous: args are (kind, field, wire_type, expected, at)."""

def security_record(buf: bytes | bytearray | memoryview, reviewed: bool
                    ) -> tuple[tuple[int, int, int, int, int], list[tuple[int, int, int, int, int]], int] | None:
    """`app.security.signing._security_record`, compiled: (record, inner records, scope) or None."""

def security_span(buf: bytes | bytearray | memoryview, reviewed: bool, secret: bytes | None = None
                  ) -> tuple[int, int, int, bytes | None] | None:
    """`security_record`'s checks and faults, giving only (value_start, end, scope, mac) or None:
    `mac` is `signed_mac(buf, reviewed, secret)` for a `secret` and scope 2 or 0, else None."""

class StatementFault(ValueError):
    """A pair or batch scope's signed message cannot be formed: args are (kind, a, b, scope name)."""

def signed_message(buf: bytes | bytearray | memoryview, reviewed: bool) -> bytes:
    """`b"".join(app.security.signing._py_message_parts(...))`, compiled: the signed message of
    envelope bytes in every known scope (legacy, v2, pair, batch)."""

def signed_mac(buf: bytes | bytearray | memoryview, reviewed: bool, secret: bytes) -> bytes:
    """HMAC-SHA256 under `secret` of `signed_message(buf, reviewed)`."""

def pair_copies(header: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview | None, batch: bool
                ) -> tuple[bytes, bytes, bytes, bytes, bytes, list[tuple[str, bytes]] | None, bool] | None:
    """`app.security.signing._pair_copies`' bytes work, compiled: from the reviewed header
    serialized without its payload (signing fields cleared) and the payload `Any`'s bytes,
    (head_reviewed, head_draft, security_draft value, digest_draft, digest_reviewed, headers,
    tracestate_pending), or None when the general path must convert the header. `headers`:
    `app.bindings.kafka._envelope_headers` read from the same bytes, without `tracestate`,
    which the caller appends when `tracestate_pending` (None: the caller builds them)."""

def finish_batch(items: list[tuple[bytes, bytes, tuple[bytes, bytes, bytes, bytes, bytes,
                                                      bytes | bytearray | memoryview | None] | None]],
                 sign: Callable[[bytes], bytes]) -> tuple[bytes, list[list[bytes] | bytes]]:
    """`app.security.signing.finish_batch`, compiled: items are (digest_draft, digest_reviewed,
    pieces), pieces None or (layout codes, head_draft, security_draft, head_reviewed, reviewed
    header, payload); the Merkle tree is built, `sign(statement)` called once, and per message
    its finished copies come back, or its audit path where Python must write it."""

def murmur2(data: bytes | bytearray | memoryview) -> int:
    """`aiokafka.partitioner.murmur2`, compiled (the Java client's `Utils.murmur2`): Kafka's key
    hash as the same unsigned 32-bit value, for placing keyed records (`app/worker/batch_send.py`)."""

def record_tail(key: bytes | None, value: bytes | None, headers: Any) -> tuple[int, bytes]:
    """`(size, tail)`: the record's size as aiokafka's
    `DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)` gives it, and its
    `(str, bytes or None)` headers as a record batch holds them, for `record_batch` to copy as
    they are (`app/worker/size_fit.py`)."""

def record_batch(records: list[tuple[Any, ...]], start: int, batch_size: int,
                 transactional: bool) -> tuple[bytearray, int]:
    """One Kafka v2 record batch (uncompressed) of `records[start:]` - the worker's `OutRecord`s
    `(topic, key, value, timestamp_ms or None, headers, size, tail)` - as many as fit `batch_size`,
    written as aiokafka's `DefaultRecordBatchBuilder` writes them: `(batch, count)`, the batch
    without its producer state and CRC (`seal_batch`), `count` >= 1 records taken
    (`app/worker/batch_send.py`). A record with a tail (`record_tail`'s) has its headers written from it."""

def seal_batch(batch: bytearray, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    """Write the producer state and the CRC-32C into a batch from `record_batch`, in place."""

class DocPlan:
    """The payload check's compiled one-sided fast path (`app.schema.payload_check._compiled_fits`):
    the plan of a protobuf message's JSON form, flattened by `payload_check._flat_plan`."""

    def __init__(self, messages: list[list[tuple[tuple[str, ...], int, Any, Any, bool, int | None]]],
                 max_depth: int) -> None:
        """`messages`: per message (the first is the document's), per field (JSON keys, kind
        0..4 = str/int/num/bool/msg, lo, hi, repeated, message index); ValueError for a bad plan."""

    def fits(self, payload: bytes | bytearray | memoryview) -> bool:
        """True only when `json_format.Parse` certainly accepts `payload` for the message; False
        for anything else or not certain (the Python validator then decides, as without it)."""
