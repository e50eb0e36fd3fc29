"""`prism envelope inspect` / `validate` on LNMP files, through the real CLI: binary containers
and `#ENVELOPE` text, good and broken. Broken input exits 2 with one line
`error [bad_lnmp] what (at FILE where); fix: how`, never a traceback."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.formats import lnmp

ROOT = Path(__file__).resolve().parents[2]
RECORD = b'F12=14532\nF7=1\nF20="Alice"\n'
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ONE_LINE = re.compile(r"^error \[bad_lnmp\] .+ \(at .+\); fix: .+$")


def prism(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, cwd=ROOT,
                          timeout=60, input=stdin, env={**os.environ, "COLUMNS": "80"})


def now_env(**kw: object) -> lnmp.LnmpEnvelope:
    return lnmp.LnmpEnvelope(timestamp=int(time.time() * 1000), source="auth-service", trace_id=TRACEPARENT,
                             sequence=42, **kw)  # type: ignore[arg-type]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_inspect_binary_container(tmp_path: Path) -> None:
    env = now_env(extra_tlv=((0x20, b"\x01\x02"),))
    f = write(tmp_path, "ok.lnmp", lnmp.encode_container(lnmp.Container(record=RECORD, envelope=env)))
    res = prism("envelope", "inspect", str(f), "--payload")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["format"] == "lnmp-binary" and doc["decoding"] == "strict"
    c = doc["lnmp"]["container"]
    assert c["mode"] == "binary" and c["flags"] == "0x8000" and c["has_ext_metadata"] is True
    assert c["metadata_length"] == len(lnmp.encode_tlv(env))
    meta = doc["lnmp"]["envelope"]
    assert meta["timestamp"] == env.timestamp and meta["source"] == "auth-service" and meta["sequence"] == 42
    assert meta["trace_id"] == TRACEPARENT and meta["unknown_tlv"] == [{"type": "0x20", "length": 2, "hex": "0102"}]
    assert doc["lnmp"]["record"] == {"bytes": len(RECORD), "text": RECORD.decode()}
    mapped = doc["maps_to"]
    assert mapped["metadata"]["published_at_ms"] == str(env.timestamp)
    assert mapped["metadata"]["content_type_custom"] == "application/lnmp"
    assert mapped["security"]["publisher_id"] == "auth-service"
    assert mapped["observability"]["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert set(mapped["extensions"]) == {"lnmp.sequence", "lnmp.tlv"}
    assert mapped["payload"]["bytes"] == len(RECORD) and doc["warnings"] == []


def test_inspect_text_message_from_stdin() -> None:
    env = now_env(extra_keys=(("region", "eu west"),))
    res = prism("envelope", "inspect", "-", stdin=lnmp.encode_text(RECORD, env))  # type: ignore[arg-type]
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["format"] == "lnmp-text" and "container" not in doc["lnmp"]
    assert doc["lnmp"]["envelope"]["unknown_keys"] == {"region": "eu west"}
    assert doc["lnmp"]["record"] == {"bytes": len(RECORD)}
    assert doc["maps_to"]["metadata"]["content_type_custom"] == "text/lnmp"
    assert doc["maps_to"]["security"]["publisher_id"] == "auth-service"


def test_inspect_bare_text_record_without_envelope(tmp_path: Path) -> None:
    doc = json.loads(prism("envelope", "inspect", str(write(tmp_path, "r.lnmp", RECORD))).stdout)
    assert doc["format"] == "lnmp-text" and doc["lnmp"]["envelope"] is None


def test_validate_good_and_insane_metadata(tmp_path: Path) -> None:
    good = write(tmp_path, "ok.lnmp", lnmp.encode_container(lnmp.Container(record=RECORD, envelope=now_env())))
    res = prism("envelope", "validate", str(good))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "valid LNMP binary container (mode binary), envelope: timestamp, source, trace_id, sequence" \
        in res.stdout.decode()
    # §9.1: a timestamp a day in the future and an over-long source are caught
    future = lnmp.LnmpEnvelope(timestamp=int(time.time() * 1000) + 86_400_000, source="s" * 70)
    bad = write(tmp_path, "future.txt", lnmp.encode_text(RECORD, future))  # type: ignore[arg-type]
    res = prism("envelope", "validate", str(bad))
    out = res.stdout.decode()
    assert res.returncode == 1, out
    assert "metadata.published_at_ms" in out and "in the future" in out
    assert "source is 70 chars" in out


def _container(mlen: int, chain: bytes, flags: int = 0x8000, version: int = 1, mode: int = 2) -> bytes:
    return b"LNMP" + struct.pack(">BBHI", version, mode, flags, mlen) + chain + RECORD


GOOD_CHAIN = lnmp.encode_tlv(lnmp.LnmpEnvelope(timestamp=1732373147000, source="auth-service", sequence=42))
BROKEN = [
    ("short.lnmp", b"LNMP\x01\x02\x80", "shorter than its 12-byte header", "byte 0"),
    ("version.lnmp", _container(0, b"", version=2), "unsupported LNMP container version 0x02", "byte 4"),
    ("mode.lnmp", _container(0, b"", mode=0x09), "unknown LNMP mode 0x09", "byte 5"),
    ("past-end.lnmp", _container(5000, GOOD_CHAIN), "metadata_length 5000 runs past the end", "byte 8"),
    ("wrong-length.lnmp", _container(20, GOOD_CHAIN), "claims 12 bytes but only 6 remain", "metadata byte 11"),
    ("ts-length.lnmp", _container(7, bytes.fromhex("100004") + b"\x00\x00\x00\x01"), "length 4, must be 8",
     "metadata byte 0"),
    ("duplicate.lnmp", _container(8, bytes.fromhex("110001") + b"a" + bytes.fromhex("110001") + b"b"),
     "appears twice", "metadata byte 4"),
    ("flags.lnmp", _container(0, b"", flags=0x0004), "reserved container flag bits 0x0004", "byte 6"),
    ("ts-zero.lnmp", _container(11, bytes.fromhex("100008") + bytes(8)), "timestamp 0 is not a usable publish time",
     "timestamp"),
    ("quote.txt", b'#ENVELOPE source="auth service\n' + RECORD, "unterminated quoted value", "#ENVELOPE char"),
    ("number.txt", b"#ENVELOPE sequence=4x2\n" + RECORD, "is not an unsigned 64-bit decimal", "#ENVELOPE sequence"),
    ("dup-key.txt", b"#ENVELOPE source=a source=b\n" + RECORD, "appears twice", "#ENVELOPE source"),
    ("utf8.txt", b"#ENVELOPE source=\xff\xfe\n" + RECORD, "not valid UTF-8", "line 1"),
]


@pytest.mark.parametrize(("name", "data", "what", "where"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_lnmp_is_one_precise_line(tmp_path: Path, name: str, data: bytes, what: str, where: str) -> None:
    f = write(tmp_path, name, data)
    for command in ("inspect", "validate"):
        res = prism("envelope", command, str(f))
        err = res.stderr.decode()
        assert res.returncode == 2, (command, res.stdout, err)
        assert "Traceback" not in err and res.stdout == b""
        [line] = err.strip().splitlines()
        assert ONE_LINE.match(line), line
        assert what in line and f"(at {f} {where}" in line, line


def test_loose_recovers_a_wrong_metadata_length(tmp_path: Path) -> None:
    f = write(tmp_path, "wrong-length.lnmp", _container(20, GOOD_CHAIN))
    strict = prism("envelope", "inspect", str(f)).stderr.decode()
    assert "--loose" in strict  # the strict error says how to read it anyway
    res = prism("envelope", "inspect", "--loose", str(f))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["decoding"] == "loose" and doc["lnmp"]["container"]["metadata_length"] == 20
    assert doc["lnmp"]["envelope"]["source"] == "auth-service" and doc["lnmp"]["record"]["bytes"] == len(RECORD)
    assert any(f"declares 20 bytes but the TLV chain ends after {len(GOOD_CHAIN)}" in w for w in doc["warnings"])
    res = prism("envelope", "validate", "--loose", str(f))
    out = res.stdout.decode()
    assert "declares 20 bytes" in out  # reported; the 2024 timestamp then fails the age check
    assert res.returncode == 1 and "metadata.published_at_ms" in out


def test_loose_ignores_a_broken_text_header(tmp_path: Path) -> None:
    f = write(tmp_path, "quote.txt", b'#ENVELOPE source="auth service\n' + RECORD)
    doc = json.loads(prism("envelope", "inspect", "--loose", str(f)).stdout)
    assert doc["lnmp"]["envelope"] is None and doc["lnmp"]["record"]["bytes"] == len(RECORD)
    assert doc["warnings"] and "envelope ignored" in doc["warnings"][0]


def test_prism_envelopes_still_take_the_envelope_path(tmp_path: Path) -> None:
    from app.envelope import Layout, encode, new_envelope

    f = write(tmp_path, "e.bin", encode(new_envelope("orders.created", {"a": 1}, namespace="n"), Layout.REVIEWED))
    doc = json.loads(prism("envelope", "inspect", str(f)).stdout)
    assert doc["layout"] == "reviewed" and "lnmp" not in doc


def test_hostile_metadata_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """A source with an ANSI escape and rich markup: inspect prints it JSON-escaped, validate
    names the field without echoing it, and neither interprets the markup."""
    hostile = "\x1b[2J[bold red]pwned[/]"
    env = lnmp.LnmpEnvelope(timestamp=int(time.time() * 1000), source=hostile)
    f = write(tmp_path, "hostile.lnmp", lnmp.encode_container(lnmp.Container(record=RECORD, envelope=env)))
    res = prism("envelope", "inspect", str(f))
    assert res.returncode == 0 and b"\x1b" not in res.stdout
    assert json.loads(res.stdout)["lnmp"]["envelope"]["source"] == hostile
    res = prism("envelope", "validate", str(f))
    out = res.stdout + res.stderr
    assert res.returncode == 1 and b"\x1b" not in out and b"pwned" not in out
    assert b"security.publisher_id: contains control characters" in out
