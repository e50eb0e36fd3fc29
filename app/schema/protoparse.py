"""Real ``.proto`` parsing: run ``protoc`` (bundled with grpcio-tools) into a FileDescriptorSet.

Why protoc and not a hand-written parser: the compatibility rules must see exactly what a
protobuf runtime sees — resolved type names, nested types, imports, ``reserved`` ranges,
proto3 ``optional`` (synthetic oneofs), custom options — and only the reference compiler
gets all of that right. We compile with ``--include_imports`` so imported files (and the
well-known types) are part of the set.

protoc is run in-process (``grpc_tools.protoc.main``), which is ~50x faster than a
subprocess. It reports errors on file descriptor 2, so we point fd 2 at a temporary file
while it runs, under a lock (the registry service is multi-threaded). Results are cached by
content hash because registration, audit and compatibility checks compile the same text often.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

from .model import SchemaError

_PKG_PROTO = Path(__file__).resolve().parent / "proto"  # ships prism/annotations.proto
_LOCK = threading.Lock()
_CACHE: OrderedDict[str, descriptor_pb2.FileDescriptorSet] = OrderedDict()
_CACHE_MAX = 256

#: Files that are never part of a user's schema surface (compared, audited, hashed).
LIBRARY_FILES_PREFIXES = ("google/protobuf/",)
LIBRARY_FILES = frozenset({"prism/annotations.proto"})


def _wkt_include() -> Path:
    import grpc_tools

    return Path(grpc_tools.__file__).parent / "_proto"


@dataclass(frozen=True)
class ProtoSchema:
    """A compiled protobuf schema: the descriptor set plus which file is the schema itself."""

    fds: descriptor_pb2.FileDescriptorSet
    main_file: str

    @property
    def files(self) -> list[descriptor_pb2.FileDescriptorProto]:
        return list(self.fds.file)

    @property
    def main(self) -> descriptor_pb2.FileDescriptorProto:
        for f in self.fds.file:
            if f.name == self.main_file:
                return f
        raise KeyError(self.main_file)

    def user_files(self) -> list[descriptor_pb2.FileDescriptorProto]:
        """The schema's own files: the main file and user imports, not WKTs or Prism's options."""
        return [f for f in self.fds.file if is_user_file(f.name)]


def is_user_file(name: str) -> bool:
    return not name.startswith(LIBRARY_FILES_PREFIXES) and name not in LIBRARY_FILES


def messages_by_name(files: Iterable[descriptor_pb2.FileDescriptorProto], *, leading_dot: bool = False
                     ) -> dict[str, descriptor_pb2.DescriptorProto]:
    """Every message of ``files``, nested ones (and map entries) included, by full name:
    ``pkg.Outer.Inner``, or ``.pkg.Outer.Inner`` with ``leading_dot`` (how a field's
    ``type_name`` spells it)."""
    out: dict[str, descriptor_pb2.DescriptorProto] = {}

    def index(msgs: Iterable[descriptor_pb2.DescriptorProto], prefix: str) -> None:
        for m in msgs:
            out[f"{prefix}{m.name}"] = m
            index(m.nested_type, f"{prefix}{m.name}.")

    for fd in files:
        index(fd.message_type, ("." if leading_dot else "") + (f"{fd.package}." if fd.package else ""))
    return out


def compile_proto(
    source: str,
    filename: str = "schema.proto",
    imports: Mapping[str, str] | None = None,
    include_paths: Sequence[str | Path] = (),
) -> ProtoSchema:
    """Compile ``source`` (the text of ``filename``) with protoc.

    ``imports`` maps import paths (``"common/money.proto"``) to their text, for schemas kept
    in a registry rather than on disk; ``include_paths`` adds directories (CLI use).
    ``prism/annotations.proto`` and the well-known types are always importable.
    Raises :class:`SchemaError` with protoc's message when the schema does not compile.
    """
    imports = dict(imports or {})
    key = hashlib.sha256(
        repr((filename, source, sorted(imports.items()), [str(p) for p in include_paths])).encode()
    ).hexdigest()
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            _CACHE.move_to_end(key)
            return ProtoSchema(cached, filename)
        fds = _run_protoc(source, filename, imports, include_paths)
        _CACHE[key] = fds
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return ProtoSchema(fds, filename)


def _run_protoc(
    source: str, filename: str, imports: Mapping[str, str], include_paths: Sequence[str | Path]
) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    for name in (filename, *imports):
        # An import path is a reference name from a client or a registry answer: it must not
        # name a file outside the temporary source tree protoc reads (nor the tree itself).
        parts = Path(name).parts
        if not name or os.path.isabs(name) or ".." in parts or not parts or "\x00" in name or "\\" in name:
            raise SchemaError(f"schema file name must be a relative path inside the schema: {name[:200]!r}")
    with tempfile.TemporaryDirectory(prefix="prism-protoc-") as tmp:
        root = Path(tmp) / "src"
        for name, text in {**imports, filename: source}.items():
            p = root / name
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text, encoding="utf-8")
            except (OSError, UnicodeError) as e:  # "a" and "a/b.proto", a name too long, a lone surrogate
                raise SchemaError(f"import {name[:200]!r} cannot be laid out as a file: {e}") from None
        out = Path(tmp) / "out.pb"
        err = Path(tmp) / "err.txt"
        args = [
            "protoc", f"-I{root}", *(f"-I{p}" for p in include_paths), f"-I{_PKG_PROTO}",
            f"-I{_wkt_include()}", "--include_imports", f"--descriptor_set_out={out}", filename,
        ]
        rc = _call_capturing_stderr(lambda: protoc.main(args), err)
        message = err.read_text(errors="replace").strip() if err.exists() else ""
        if rc != 0 or not out.exists():
            raise SchemaError(message.replace(str(root) + os.sep, "") or f"protoc failed ({rc})")
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
        return fds


def _call_capturing_stderr(fn, path: Path) -> int:  # type: ignore[no-untyped-def]
    saved = os.dup(2)
    try:
        with open(path, "wb") as fh:
            os.dup2(fh.fileno(), 2)
            try:
                return int(fn())
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


# ---------------------------------------------------------------------------------------------
# Minimal wire-format walker. Used to read custom options (which arrive as unknown fields
# because the Python runtime never imported prism/annotations_pb2) and, in resolve.py, to
# see which fields a payload sets without decoding it into a message class.

WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_SGROUP, WIRE_EGROUP, WIRE_I32 = 0, 1, 2, 3, 4, 5


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def iter_wire(data: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield ``(field_number, wire_type, value)`` for each top-level record.

    ``value`` is an int for varint/fixed records and a zero-copy memoryview for
    length-delimited ones; groups are skipped over (yielded with value 0).
    """
    buf = memoryview(data)
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wt = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wt == WIRE_VARINT:
            v, pos = _varint(buf, pos)
            yield number, wt, v
        elif wt == WIRE_I64:
            if pos + 8 > n:
                raise ValueError("truncated fixed64")
            yield number, wt, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wt == WIRE_I32:
            if pos + 4 > n:
                raise ValueError("truncated fixed32")
            yield number, wt, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        elif wt == WIRE_LEN:
            length, pos = _varint(buf, pos)
            if pos + length > n:
                raise ValueError("truncated length-delimited field")
            yield number, wt, buf[pos:pos + length]
            pos += length
        elif wt == WIRE_SGROUP:
            depth = 1
            while depth:
                k, pos = _varint(buf, pos)
                w = k & 7
                if w == WIRE_SGROUP:
                    depth += 1
                elif w == WIRE_EGROUP:
                    depth -= 1
                elif w == WIRE_VARINT:
                    _, pos = _varint(buf, pos)
                elif w == WIRE_I64:
                    pos += 8
                elif w == WIRE_I32:
                    pos += 4
                elif w == WIRE_LEN:
                    ln, pos = _varint(buf, pos)
                    pos += ln
            yield number, wt, 0
        else:
            raise ValueError(f"bad wire type {wt}")


def string_options(options: descriptor_pb2.FieldOptions, numbers: Sequence[int]) -> dict[int, str]:
    """Read string-valued custom options (e.g. ``(prism.pii)``) from a FieldOptions message."""
    found: dict[int, str] = {}
    raw = options.SerializeToString()
    if not raw:
        return found
    for number, wt, value in iter_wire(raw):
        if number in numbers and wt == WIRE_LEN and isinstance(value, memoryview):
            found[number] = bytes(value).decode("utf-8", "replace")
    return found
