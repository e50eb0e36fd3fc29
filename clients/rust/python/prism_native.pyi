"""Types of `prism_native`, the worker's optional compiled hot path (clients/rust/python)."""

ABI: int  # 2: scan and security_record
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
