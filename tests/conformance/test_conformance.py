"""The Python runner of the shared conformance suite (conformance/README.md).

Reads conformance/manifest.json, runs every vector of every listed file through Prism's own
code the way a Go or Rust runner would (decode, encode, convert, verify, decrypt, LNMP), and
checks that the committed files are exactly what `python -m conformance.generate` writes, so
a change to the wire format or to signing made here without regenerating the suite fails, and
a regenerated suite shows up in the other languages' runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM1024PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.bindings.kafka import headers_for
from app.envelope import Layout, Limits, convert, decode, detect_layout, encode
from app.errors import PrismError
from app.formats.lnmp_envelope import decode_message, to_lnmp
from app.security.encryption import build_aad, decrypt_envelope
from app.security.signing import (
    ED25519,
    HMAC_SHA256,
    SigningKey,
    VerificationKey,
    VerificationKeys,
    signed_message,
    verify,
    verify_and_decode,
)
from conformance import generate
from conformance._common import (
    ERROR_KINDS,
    counts_as,
    effective_json,
    envelope_from_model,
    message_json,
    model_json,
)
from conformance.generate_encryption import keyring as encryption_keyring
from conformance.generate_lnmp import lnmp_fields

ROOT = Path(generate.__file__).resolve().parent
MANIFEST = json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))
DOCS = {e["path"]: json.loads((ROOT / e["path"]).read_text(encoding="utf-8")) for e in MANIFEST["files"]}
CASES = [(e["path"], i) for e in MANIFEST["files"] for i in range(e["vectors"])]


# --------------------------------------------------------------------------- the suite itself


def test_the_committed_suite_is_what_the_generator_writes() -> None:
    stale = generate.stale_files(generate.build())
    assert stale == [], f"stale conformance files {stale}: run python -m conformance.generate"


def test_the_check_mode_exits_1_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = generate.build()
    for path, text in built.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 0
    first = next(p for p in built if p != "manifest.json")
    (tmp_path / first).write_text(built[first].replace('"name"', '"nome"', 1), encoding="utf-8")
    (tmp_path / "envelopes" / "left-behind.json").write_text("{}", encoding="utf-8")
    assert generate.main(["--check"]) == 1
    assert generate.stale_files(built) == sorted([first, "envelopes/left-behind.json"])


@pytest.mark.parametrize(("module", "name", "value", "stale_folder"), [
    ("app.envelope.model", "_MIME_TO_CT", {"application/json": 1}, "envelopes/"),  # a wire mapping
    ("app.security.encryption", "AAD_PREFIX", b"prism-envelope-aad/v2\x00", "encryption/"),  # the AAD bytes
    ("app.envelope.layouts", "KNOWN_ENVELOPE_VERSION", 2, "conversion/"),  # the draft's version record
])
def test_a_change_to_the_wire_format_makes_the_suite_stale(module: str, name: str, value: object, stale_folder: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What issue 30 asks: a change to the wire format, signing or encryption made in Python
    alone fails the build (`--check`), until the vectors - which Go and Rust run - change too."""
    import importlib
    mod = importlib.import_module(module)
    current = getattr(mod, name)
    monkeypatch.setattr(mod, name, {**current, **value} if isinstance(current, dict) else value)
    stale = generate.stale_files(generate.build())
    assert any(p.startswith(stale_folder) for p in stale) and "manifest.json" in stale


@pytest.mark.parametrize(("name", "value", "case"), [
    ("KNOWN_FLAGS", 0x01, "flags/2"),  # random-trace-id no longer propagated
    ("TRACESTATE_MAX_LENGTH", 8193, "tracestate/8193-characters"),  # the cap moved
    ("TRACESTATE_MAX_MEMBERS", 33, "tracestate/33-members"),
])
def test_a_change_to_the_trace_header_rules_stops_the_binding_generator(name: str, value: int, case: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each binding case states the trace headers it expects: a Python change to the rules
    Go and Rust must follow cannot slip into regenerated vectors without changing the case."""
    from app.observability import tracecontext
    from conformance import generate_bindings
    monkeypatch.setattr(tracecontext, name, value)
    with pytest.raises(AssertionError, match=case):
        generate_bindings.build()


def test_a_change_to_the_ttl_rule_stops_the_expiry_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each expiry case states its verdict: a Python change to the rule Go and Rust follow (here
    the boundary made live) cannot slip into regenerated vectors without changing the case."""
    from app.envelope.model import Envelope
    from conformance import generate_expiry

    def strictly_after(self: Envelope, now_ms: int | None = None) -> bool:
        exp = self.expires_at_ms()
        return exp is not None and now_ms is not None and now_ms > exp

    monkeypatch.setattr(Envelope, "is_expired", strictly_after)
    with pytest.raises(AssertionError, match="at-boundary"):
        generate_expiry.build()


def test_a_change_to_the_kafka_header_names_makes_the_suite_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.bindings import kafka
    monkeypatch.setattr(kafka, "_FIELD_WIRE", tuple(n.replace("prism-", "prism-x-") for n in kafka._FIELD_WIRE))
    stale = generate.stale_files(generate.build())
    assert "bindings/kafka-headers.json" in stale and "manifest.json" in stale


def test_the_manifest_lists_every_vector_file_with_its_hash_and_kind() -> None:
    on_disk = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.json") if p.name != "manifest.json")
    assert sorted(DOCS) == on_disk
    for entry in MANIFEST["files"]:
        text = (ROOT / entry["path"]).read_text(encoding="utf-8")
        assert hashlib.sha256(text.encode()).hexdigest() == entry["sha256"]
        assert DOCS[entry["path"]]["kind"] == entry["kind"] in MANIFEST["kinds"]
        assert len(DOCS[entry["path"]]["vectors"]) == entry["vectors"] > 0
    assert set(MANIFEST["error_kinds"]) == set(ERROR_KINDS)


def test_vector_names_are_unique_in_each_file() -> None:
    for path, doc in DOCS.items():
        names = [v["name"] for v in doc["vectors"]]
        assert len(names) == len(set(names)), f"{path} repeats a vector name"


def test_the_suite_stays_small() -> None:
    total = sum(p.stat().st_size for p in ROOT.rglob("*.json"))
    assert total < 2_000_000, f"the conformance suite is {total} bytes; keep it under 2 MB"


def test_every_expected_error_is_a_listed_kind() -> None:
    verdicts = {"valid", "ok", "plaintext"} | set(ERROR_KINDS)
    for path, doc in DOCS.items():
        for v in doc["vectors"]:
            for key, value in v.items():
                if key.startswith("expected") and isinstance(value, str):
                    assert value in verdicts, f"{path} {v['name']}: {key}={value!r} is not an error kind"


# --------------------------------------------------------------------------- runners by kind


def _error_kind(fn: Callable[[], object]) -> str:
    try:
        fn()
    except PrismError as exc:
        return exc.code
    return "valid"


def _matches(python_code: str, expected: str) -> bool:
    return python_code == expected or counts_as(python_code, expected)


def _signature_keyring(doc: dict[str, Any], accept_legacy: bool) -> VerificationKeys:
    k = doc["key"]
    if k["algorithm"] == HMAC_SHA256:
        key: VerificationKey = SigningKey.hmac_sha256(k["key_id"], bytes.fromhex(k["secret_hex"])).verification_key()
    else:
        assert k["algorithm"] == ED25519
        key = VerificationKey(k["key_id"], ED25519,
                              public_key=Ed25519PublicKey.from_public_bytes(bytes.fromhex(k["public_key_hex"])))
    return VerificationKeys.of([key], accept_legacy_scope=accept_legacy)


def run_signature(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["envelope_hex"])
    for accept, field in ((False, "expected"), (True, "expected_accept_legacy_scope")):
        got = _error_kind(lambda accept=accept: verify(data, _signature_keyring(doc, accept)))  # type: ignore[misc]
        assert _matches(got, v[field]), f"{field}: Prism says {got}, the vector {v[field]}"
    if "signed_message_hex" in v:
        assert signed_message(data).joined().hex() == v["signed_message_hex"]


def run_envelope(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["envelope_hex"])
    layout = Layout(v["layout"])
    assert detect_layout(data) is layout
    cls = dpb.PrismEnvelope if layout is Layout.DRAFT else vpb.PrismEnvelope
    assert message_json(cls.FromString(data)) == v["wire"]
    env = decode(data)
    assert model_json(env) == v["model"]
    assert effective_json(env) == v["effective"]
    loc = v["payload_location"]
    if loc is None:
        assert not env.payload.present
    else:
        any_bytes = data[loc["any_offset"]:loc["any_offset"] + loc["any_length"]]
        assert bytes(env.payload.wire()) == any_bytes
        assert loc["record_offset"] + loc["record_length"] == loc["any_offset"] + loc["any_length"]
        value = data[loc["value_offset"]:loc["value_offset"] + loc["value_length"]] if "value_offset" in loc else b""
        assert bytes(env.payload.value) == value
    rebuilt = envelope_from_model(v["model"])
    assert model_json(rebuilt) == v["model"]
    assert (encode(rebuilt, layout) == data) is v["canonical"]
    assert encode(decode(encode(rebuilt, layout)), layout) == encode(rebuilt, layout)


def run_conversion(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["input_hex"])
    src, dst = Layout(v["from"]), Layout(v["to"])
    assert detect_layout(data) is src and src is not dst
    if "same_layout_hex" in v:  # an odd extensions entry stays in its own layout, as upb writes it
        assert encode(decode(data), src).hex() == v["same_layout_hex"]
    if "expected" in v:  # refused (an extensions entry with more than a key and a value)
        assert _matches(_error_kind(lambda: convert(data, dst)), v["expected"])
        assert not {"output_hex", "output_wire", "output_model", "not_carried"} & set(v)
        return
    out, dropped = convert(data, dst)
    assert detect_layout(out) is dst
    if "output_hex" in v:
        assert out.hex() == v["output_hex"]
    cls = dpb.PrismEnvelope if dst is Layout.DRAFT else vpb.PrismEnvelope
    if "output_wire" in v:  # not for odd trace map entries: plain parsers disagree on them
        assert message_json(cls.FromString(out)) == v["output_wire"]
    assert model_json(decode(out)) == v["output_model"]
    assert {d.split(":", 1)[0] for d in dropped} == set(v["not_carried"])
    if not v["not_carried"]:  # nothing lost: converting back gives the input's model
        assert model_json(decode(convert(out, src)[0])) == model_json(decode(data))


def run_key_wrap(doc: dict[str, Any], v: dict[str, Any]) -> None:
    """Prism's AwsKmsProvider over a KMS client that answers from the file's table and records
    the encryption context it is sent."""
    from app.security.keys import AwsKmsProvider
    from conformance.generate_key_wrap import TableKMS

    class Recording(TableKMS):
        sent: list[dict[str, str]] = []

        def decrypt(self, CiphertextBlob: bytes, KeyId: str, EncryptionContext: dict[str, str]) -> dict[str, Any]:
            self.sent.append(dict(EncryptionContext))
            return super().decrypt(CiphertextBlob=CiphertextBlob, KeyId=KeyId, EncryptionContext=EncryptionContext)

    client = Recording(doc["data_keys"])
    provider = AwsKmsProvider(encryption_context=doc["provider_context"], client=client)
    assert provider.wrap_name == doc["wrap_name"]
    env = decode(bytes.fromhex(v["envelope_hex"]))
    assert detect_layout(bytes.fromhex(v["envelope_hex"])) is Layout(v["layout"])
    got = _error_kind(lambda: decrypt_envelope(env, provider))
    assert _matches(got, "valid" if v["expected"] == "plaintext" else v["expected"]), got
    md, enc = env.metadata, env.header.security.encryption
    assert build_aad(md.message_id, md.namespace, md.topic, enc.algorithm, enc.key_id).hex() == v["aad_hex"]
    if v["expected"] == "plaintext":
        assert decrypt_envelope(env, provider).hex() == v["plaintext_hex"]
        assert client.sent[-1] == v["encryption_context"]


def run_encryption(doc: dict[str, Any], v: dict[str, Any]) -> None:
    env = decode(bytes.fromhex(v["envelope_hex"]))
    assert detect_layout(bytes.fromhex(v["envelope_hex"])) is Layout(v["layout"])
    got = _error_kind(lambda: decrypt_envelope(env, encryption_keyring(doc["keys"])))
    assert _matches(got, "valid" if v["expected"] == "plaintext" else v["expected"]), got
    if v["expected"] != "plaintext":
        return
    assert decrypt_envelope(env, encryption_keyring(doc["keys"])).hex() == v["plaintext_hex"]
    md, enc = env.metadata, env.header.security.encryption
    assert build_aad(md.message_id, md.namespace, md.topic, enc.algorithm, enc.key_id).hex() == v["aad_hex"]
    key = doc["keys"][enc.key_id]
    if key["type"] == "symmetric-256":
        return
    seed = key["private_seed_hex"] if key["type"] == "ml-kem-1024" else key["ml_kem_private_seed_hex"]
    m_ss = MLKEM1024PrivateKey.from_seed_bytes(bytes.fromhex(seed)).decapsulate(enc.encapsulated_key)
    assert m_ss.hex() == v["ml_kem_shared_secret_hex"]
    if key["type"] == "ml-kem-1024":
        assert v["aead_key_hex"] == m_ss.hex()
        return
    eph = base64.b64decode(json.loads(enc.algorithm_params)["x25519_ephemeral_public"])
    x_ss = X25519PrivateKey.from_private_bytes(bytes.fromhex(key["x25519_private_hex"])).exchange(
        X25519PublicKey.from_public_bytes(eph))
    assert x_ss.hex() == v["x25519_shared_secret_hex"]
    info = b"prism-envelope payload key" + eph + bytes.fromhex(key["x25519_public_hex"])
    aead_key = HKDF(hashes.SHA256(), 32, salt=b"prism-envelope/x25519-ml-kem-1024/v1", info=info).derive(x_ss + m_ss)
    assert aead_key.hex() == v["aead_key_hex"]


def run_lnmp(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["input_hex"])
    assert v["strict"] is True
    got = _error_kind(lambda: decode_message(data, strict=True))
    assert _matches(got, "valid" if v["expected"] == "ok" else v["expected"]), got
    if v["expected"] != "ok":
        return
    mapped = decode_message(data)
    fields, record = lnmp_fields(data)
    assert fields == v["lnmp"] and record.hex() == v["record_hex"]
    assert bytes(mapped.envelope.payload.value) == record
    assert model_json(mapped.envelope) == v["model"]
    assert bytes(to_lnmp(mapped.envelope)).hex() == v["reencoded_hex"]
    assert bytes(to_lnmp(envelope_from_model(v["model"]))).hex() == v["reencoded_hex"]


def run_negative(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["input_hex"])
    limits = Limits(**v["limits"]) if "limits" in v else Limits()
    got = _error_kind(lambda: decode(data, limits=limits))
    assert _matches(got, "valid" if v["expected_decode"] == "ok" else v["expected_decode"]), got
    if v["expected_decode"] == "ok" and "expected_payload" in v:  # header-only: the payload is not an Any
        env = decode(data, limits=limits)
        assert message_json(env.header) == v["model"]
        loc = v["payload_location"]
        assert bytes(env.payload.wire()) == data[loc["any_offset"]:loc["any_offset"] + loc["any_length"]]
        assert _matches(_error_kind(lambda: env.payload.value), v["expected_payload"])
    elif v["expected_decode"] == "ok":
        assert model_json(decode(data, limits=limits)) == v["model"]
    else:
        assert "model" not in v
    keys = _signature_keyring(doc, False)
    got = _error_kind(lambda: verify_and_decode(data, keys, limits=limits))
    assert _matches(got, v["expected_verify"]), got


def run_kafka_headers(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["envelope_hex"])
    layout = Layout(v["layout"])
    assert detect_layout(data) is layout
    expected = [(name, value.encode("utf-8")) for name, value in v["headers"]]
    assert headers_for(decode(data), layout) == expected


def run_expiry(doc: dict[str, Any], v: dict[str, Any]) -> None:
    data = bytes.fromhex(v["envelope_hex"])
    assert detect_layout(data) is Layout(v["layout"])
    env = decode(data)
    md = env.header.metadata
    ttl = str(md.ttl_seconds) if md.HasField("ttl_seconds") else None
    assert (str(md.published_at_ms), ttl) == (v["published_at_ms"], v["ttl_seconds"])
    expiry = env.expires_at_ms()
    assert (None if expiry is None else str(expiry)) == v["expires_at_ms"]
    assert env.is_expired(int(v["now_ms"])) is v["expired"]


RUNNERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "signature": run_signature,
    "envelope": run_envelope,
    "conversion": run_conversion,
    "encryption": run_encryption,
    "key_wrap": run_key_wrap,
    "lnmp": run_lnmp,
    "negative": run_negative,
    "kafka_headers": run_kafka_headers,
    "expiry": run_expiry,
}


def test_every_kind_in_the_manifest_has_a_runner() -> None:
    assert set(MANIFEST["kinds"]) == set(RUNNERS)


@pytest.mark.parametrize(("path", "index"), CASES,
                         ids=[f"{p}:{DOCS[p]['vectors'][i]['name']}" for p, i in CASES])
def test_vector(path: str, index: int) -> None:
    doc = DOCS[path]
    RUNNERS[doc["kind"]](doc, doc["vectors"][index])


def test_a_broken_encryption_file_stops_the_generator_with_a_reason(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned ML-KEM ciphertexts come from the committed file; a file mangled by a merge
    must stop regeneration (which would otherwise draw new ones) with a way out."""
    from conformance import generate_encryption
    (tmp_path / "encryption").mkdir()
    (tmp_path / "encryption" / "vectors.json").write_text("<<<<<<< HEAD\n", encoding="utf-8")
    monkeypatch.setattr(generate_encryption, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="git checkout"):
        generate_encryption.build()
