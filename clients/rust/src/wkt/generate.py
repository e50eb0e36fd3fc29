"""Write (or `--check`) `well_known.pb`: the protobuf well-known types' files as one serialized
`FileDescriptorSet`, which the Rust client `include_bytes!`s (src/schema_decode.rs).

Why: a protobuf schema may use `google.protobuf.Timestamp`, `Struct`, the wrappers ... without a
registry reference (the registry compiles every schema with these files, app/schema/protoparse.py),
so the client must carry their descriptors. They are taken from Python's protobuf runtime - the
descriptors `json_format` works with - so both SDKs read the same messages. Run from the
repository root with the project's venv:

    python clients/rust/src/wkt/generate.py          # rewrite
    python clients/rust/src/wkt/generate.py --check  # exit 1 when the checked-in file is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "well_known.pb"


def descriptor_set() -> bytes:
    """The well-known types' files, each as the runtime's `serialized_pb`, in a fixed order."""
    from google.protobuf import (
        any_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )

    modules = (any_pb2, source_context_pb2, type_pb2, api_pb2, duration_pb2, empty_pb2, field_mask_pb2,
               struct_pb2, timestamp_pb2, wrappers_pb2)
    fds = descriptor_pb2.FileDescriptorSet()
    for m in modules:
        fds.file.add().ParseFromString(m.DESCRIPTOR.serialized_pb)
    return fds.SerializeToString(deterministic=True)


def main(argv: list[str]) -> int:
    fresh = descriptor_set()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_bytes() != fresh:
            print(f"{OUT} is stale: run python {Path(__file__).relative_to(Path.cwd())}", file=sys.stderr)
            return 1
        return 0
    OUT.write_bytes(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
