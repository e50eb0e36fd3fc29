"""Types of `prism_native`, the worker's optional compiled hot path (clients/rust/python)."""

ABI: int
__version__: str

class WireFault(ValueError):
    """A record walk stopped: args are (kind, at, field, wire_type, length, remaining)."""

def scan(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
         ) -> list[tuple[int, int, int, int, int]]:
    """`app.envelope.wire.scan`, compiled: every top-level record of `buf[start:end]`."""
