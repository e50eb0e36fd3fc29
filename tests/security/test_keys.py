"""Key providers: the dev FileKeyring (format, validation, rotation) and AWS KMS (moto server)."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.config import Config
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from moto.server import ThreadedMotoServer

from app.errors import (
    ConfigError,
    DecryptionError,
    KeyNotUsableError,
    KeyProviderError,
    KeyringError,
    UnknownKeyError,
)
from app.security.algorithms import KEY_TYPES
from app.security.keys import (
    AwsKmsProvider,
    DataKeyProvider,
    FileKeyring,
    KeyProvider,
    KeyRecord,
    KeyUse,
    generate,
    main,
    new_key_record,
    parse_duration,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)
SECRET_A = bytes(range(32))
SECRET_B = bytes(range(100, 132))


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def sym(key_id: str, secret: bytes, not_before: datetime, **kw: object) -> dict[str, object]:
    return {"id": key_id, "type": "symmetric-256", "created": not_before.isoformat(),
            "secret": base64.b64encode(secret).decode(), **kw}


# --------------------------------------------------------------------------- generate / file format


@pytest.fixture(scope="module")
def dev_keyring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keyring with every key type, written by the CLI (`python -m app.security.keys generate`)."""
    path = tmp_path_factory.mktemp("ring") / "dev-keyring.json"
    assert main(["generate", str(path), "--namespace", "orders", "--valid-for", "90d"]) == 0
    return path


@pytest.fixture(scope="module")
def ring(dev_keyring: Path) -> FileKeyring:
    return FileKeyring.load(dev_keyring)


def test_generate_writes_one_key_of_every_type_owner_readable_only(dev_keyring: Path, ring: FileKeyring) -> None:
    assert stat.S_IMODE(dev_keyring.stat().st_mode) == 0o600
    types = {ring.records[k].key_type for k in ring.list_key_ids()}
    assert types == set(KEY_TYPES)
    for key_type in KEY_TYPES:
        (kid,) = ring.list_key_ids(key_type)
        rec = ring.records[kid]
        assert rec.namespace == "orders"
        assert rec.expires is not None and rec.expires - rec.not_before == timedelta(days=90)
        assert ring.current_key_id(key_type, "orders") == kid
    assert isinstance(ring, KeyProvider) and not isinstance(ring, DataKeyProvider)


def test_keyring_survives_json_and_yaml_round_trips(ring: FileKeyring, tmp_path: Path) -> None:
    yml = ring.save(tmp_path / "ring.yaml")
    assert isinstance(yaml.safe_load(yml.read_text())["keys"], list)
    again = FileKeyring.load(yml)
    assert again.to_mapping() == ring.to_mapping()
    rsa_id = ring.list_key_ids("rsa-4096")[0]
    assert (again.get_private_key(rsa_id).key.private_numbers()
            == ring.get_private_key(rsa_id).key.private_numbers())


def test_cli_check_validates_a_file(dev_keyring: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(dev_keyring)]) == 0
    assert "symmetric-256" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"keys": [{"id": "k", "type": "aes-128"}]}))
    assert main(["check", str(bad)]) == 2
    assert "aes-128" in capsys.readouterr().err


def test_save_refuses_to_overwrite_by_accident(dev_keyring: Path, ring: FileKeyring) -> None:
    with pytest.raises(KeyringError, match="already exists"):
        ring.save(dev_keyring)
    with pytest.raises(KeyringError, match="already exists"):
        generate(dev_keyring, key_types=["symmetric-256"])


def test_yaml_timestamps_and_durations_are_understood(tmp_path: Path) -> None:
    path = tmp_path / "ring.yml"
    path.write_text(
        "version: 1\noverlap: 36h\nkeys:\n"
        f"  - id: a\n    type: symmetric-256\n    created: 2026-03-01T00:00:00Z\n"
        f"    expires: 2026-06-01T00:00:00+02:00\n    secret: {base64.b64encode(SECRET_A).decode()}\n"
    )
    ring = FileKeyring.load(path)
    assert ring.overlap == timedelta(hours=36)
    assert ring.records["a"].expires == datetime(2026, 5, 31, 22, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("45s", 45),
                                               ("2w", 1209600), (90, 90)])
def test_parse_duration(text: object, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["7 days", "-1d", "", True, "99999999999w", "9" * 5000, float("inf"),
                                  float("nan"), 10**15, "²"])  # the inf and 10**15: OverflowError before
def test_parse_duration_rejects_nonsense(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


# --------------------------------------------------------------------------- validation


def load_error(tmp_path: Path, data: object, name: str = "ring.json") -> KeyringError:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(KeyringError) as info:
        FileKeyring.load(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ConfigError) and info.value.code == "bad_keyring"
    return info.value


def test_every_problem_is_reported_at_once_with_file_key_and_field(tmp_path: Path) -> None:
    leaked = base64.b64encode(b"S" * 16).decode()
    err = load_error(tmp_path, {"version": 1, "overlap": "a week", "keys": [
        {"type": "symmetric-256"},
        {"id": "short", "type": "symmetric-256", "created": "2026-01-01T00:00:00Z", "secret": leaked},
        {"id": "typo", "type": "symmetric-256", "created": "2026-01-01T00:00:00Z", "secert": leaked},
        {"id": "weird", "type": "aes-128"},
        {"id": "naive", "type": "symmetric-256", "created": "2026-01-01T00:00:00", "secret": leaked},
        {"id": "backwards", "type": "symmetric-256", "created": "2026-02-01T00:00:00Z",
         "expires": "2026-01-01T00:00:00Z", "secret": base64.b64encode(SECRET_A).decode()},
        {"id": "notb64", "type": "ml-kem-768", "created": "2026-01-01T00:00:00Z", "public": "%%%"},
    ]})
    text = str(err)
    assert "problem(s)" in text
    assert "overlap: 'a week' is not a duration" in text
    assert "keys[0]: missing 'id'" in text
    assert "keys[1] (id 'short') field 'secret': is 16 bytes, secret needs 32 (AES-128 is deprecated" in text
    assert "keys[2] (id 'typo'): unknown field 'secert'" in text
    assert "keys[3] (id 'weird'): type 'aes-128' is not one of" in text
    assert "keys[4] (id 'naive') field 'created'" in text and "no time zone" in text
    assert "keys[5] (id 'backwards'): expires (2026-01-01T00:00:00Z) is not after not_before" in text
    assert "keys[6] (id 'notb64') field 'public': is not valid base64" in text
    assert leaked not in text  # key material never appears in an error


def test_small_rsa_keys_are_refused_as_deprecated(tmp_path: Path) -> None:
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    err = load_error(tmp_path, {"keys": [{"id": "old-rsa", "type": "rsa-3072", "created": "2026-01-01T00:00:00Z",
                                          "private_pem": pem}]})
    assert "keys[0] (id 'old-rsa') field 'private_pem': is a 2048-bit RSA key but the type says rsa-3072" in str(err)
    assert "deprecated" in str(err)
    assert "PRIVATE KEY" not in str(err)


def test_mismatched_halves_duplicates_and_missing_material(tmp_path: Path, ring: FileKeyring) -> None:
    keys = {k["type"]: k for k in ring.to_mapping()["keys"]}
    fresh = new_key_record("x", "ml-kem-768")
    mlkem = dict(keys["ml-kem-768"], public=base64.b64encode(fresh.public.public_bytes_raw()).decode())
    hybrid = {k: v for k, v in keys["x25519-ml-kem-1024"].items() if k != "ml_kem_private_seed"}
    hybrid.pop("ml_kem_public")
    hybrid.pop("x25519_public")
    dup = dict(keys["symmetric-256"])
    err = load_error(tmp_path, {"keys": [
        mlkem, hybrid, dup, dict(dup),
        {"id": "empty", "type": "rsa-4096", "created": "2026-01-01T00:00:00Z"},
    ]})
    text = str(err)
    assert "public is not the public half of private_seed" in text
    assert "needs both x25519_private and ml_kem_private_seed" in text
    assert f"keys[3] (id {dup['id']!r}): duplicate key id {dup['id']!r}" in text
    assert "keys[4] (id 'empty'): no key material: a rsa-4096 key needs private_pem or public_pem" in text


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("ring.json", '{"keys": [', "keyring file is not valid JSON: Expecting value at line 1"),
        ("ring.json", '{"keys": [], "keys": []}', "duplicate"),
        ("ring.yaml", "keys: [\n  - {id: a\n", "is not valid YAML"),
        ("ring.yaml", "keys: []\nkeys: []\n", "ring.yaml:2:1); fix: keep one of them"),
        ("ring.json", "[1, 2]", "top level: must be a mapping"),
        ("ring.json", '{"version": 2, "keys": []}', "version: 2 is not supported"),
        ("ring.json", '{"keys": [], "extra": 1}', "unknown field 'extra'"),
    ],
)
def test_malformed_files(tmp_path: Path, name: str, content: str, match: str) -> None:
    assert match in str(load_error(tmp_path, content, name))


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="cannot read keyring file") as info:
        FileKeyring.load(tmp_path / "nope.json")
    assert "generate" in (info.value.hint or "")


# --------------------------------------------------------------------------- rotation


def rotating_ring(clock: Clock, **kw: object) -> FileKeyring:
    return FileKeyring.from_mapping({"overlap": "7d", "keys": [
        sym("k1", SECRET_A, T0),
        sym("k2", SECRET_B, T0 + timedelta(days=90)),
    ]}, clock=clock, **kw)


def test_current_key_is_the_newest_active_one() -> None:
    clock = Clock(T0 + timedelta(days=10))
    ring = rotating_ring(clock)
    assert ring.current_key_id("symmetric-256") == "k1"  # k2 is not valid yet
    with pytest.raises(KeyNotUsableError, match="not valid before 2026-05-30"):
        ring.get_symmetric_key("k2", KeyUse.ENCRYPT)
    clock.now = T0 + timedelta(days=90, seconds=1)
    assert ring.current_key_id("symmetric-256") == "k2"
    assert ring.get_symmetric_key("k2", KeyUse.ENCRYPT).secret == SECRET_B


def test_superseded_key_decrypts_during_the_overlap_then_is_refused() -> None:
    clock = Clock(T0 + timedelta(days=91))
    ring = rotating_ring(clock)
    with pytest.raises(KeyNotUsableError, match="'k1' was superseded by a newer key at 2026-05-30T00:00:00Z"):
        ring.get_symmetric_key("k1", KeyUse.ENCRYPT)
    assert ring.get_symmetric_key("k1", KeyUse.DECRYPT).secret == SECRET_A
    clock.now = T0 + timedelta(days=97) - timedelta(seconds=1)
    assert ring.get_symmetric_key("k1", KeyUse.DECRYPT).secret == SECRET_A
    clock.now = T0 + timedelta(days=97)
    with pytest.raises(KeyNotUsableError) as info:
        ring.get_symmetric_key("k1", KeyUse.DECRYPT)
    assert str(info.value).startswith(
        "key 'k1' retired at 2026-05-30T00:00:00Z and its 7d decrypt overlap ended at 2026-06-06T00:00:00Z")
    assert "re-encrypt" in (info.value.hint or "")


def test_expired_key_follows_the_same_overlap() -> None:
    clock = Clock(T0 + timedelta(days=31))
    ring = FileKeyring.from_mapping({"overlap": "1d", "keys": [
        sym("only", SECRET_A, T0, expires=(T0 + timedelta(days=30)).isoformat())]}, clock=clock)
    with pytest.raises(KeyNotUsableError, match="'only' expired at 2026-03-31"):
        ring.get_symmetric_key("only", KeyUse.ENCRYPT)
    with pytest.raises(UnknownKeyError, match="no active symmetric-256 key") as info:
        ring.current_key_id("symmetric-256")
    assert "only (not_before 2026-03-01T00:00:00Z, retired 2026-03-31T00:00:00Z)" in str(info.value)
    clock.now = T0 + timedelta(days=30, hours=23)
    assert ring.get_symmetric_key("only", KeyUse.DECRYPT).secret == SECRET_A
    clock.now = T0 + timedelta(days=31, seconds=1)
    with pytest.raises(KeyNotUsableError, match="overlap ended"):
        ring.get_symmetric_key("only", KeyUse.DECRYPT)


def test_decrypt_tolerates_small_clock_skew_before_not_before() -> None:
    clock = Clock(T0 + timedelta(days=90) - timedelta(minutes=2))
    ring = rotating_ring(clock)
    assert ring.get_symmetric_key("k2", KeyUse.DECRYPT).secret == SECRET_B
    clock.now = T0 + timedelta(days=90) - timedelta(minutes=10)
    with pytest.raises(KeyNotUsableError, match="not valid before"):
        ring.get_symmetric_key("k2", KeyUse.DECRYPT)


def test_namespaces_have_their_own_groups_with_a_shared_fallback() -> None:
    ring = FileKeyring.from_mapping({"keys": [
        sym("shared", SECRET_A, T0),
        sym("orders-1", SECRET_B, T0, namespace="orders"),
        sym("orders-2", SECRET_A, T0 + timedelta(days=1), namespace="orders"),
    ]}, clock=Clock(T0 + timedelta(days=2)))
    assert ring.current_key_id("symmetric-256", "orders") == "orders-2"
    assert ring.current_key_id("symmetric-256", "billing") == "shared"
    assert ring.current_key_id("symmetric-256") == "shared"
    # a namespaced rotation does not retire the shared key
    assert ring.get_symmetric_key("shared", KeyUse.ENCRYPT).key_id == "shared"


def test_purposes_rotate_independently() -> None:
    recs = [new_key_record("proc-a", "ml-kem-768", created=T0, purpose="order-processor"),
            new_key_record("proc-b", "ml-kem-768", created=T0 + timedelta(days=1), purpose="billing-consumer")]
    ring = FileKeyring(recs, clock=Clock(T0 + timedelta(days=30)))
    assert ring.current_key_id("order-processor") == "proc-a"
    assert ring.current_key_id("billing-consumer") == "proc-b"
    assert ring.get_public_key("proc-a").key_id == "proc-a"
    with pytest.raises(UnknownKeyError, match="no ml-kem-768 key"):
        ring.current_key_id("ml-kem-768")


# --------------------------------------------------------------------------- provider contract


def test_public_key_ids_lookup_and_public_only_view(ring: FileKeyring) -> None:
    kid = ring.list_key_ids("ml-kem-1024")[0]
    pub_id = ring.records[kid].public_key_id
    ref = ring.get_public_key(pub_id)
    assert (ref.key_id, ref.public_key_id, ref.key_type) == (kid, pub_id, "ml-kem-1024")
    producer = ring.public_only()
    assert producer.list_key_ids("symmetric-256") == []
    assert producer.get_public_key(kid).key == ref.key
    with pytest.raises(KeyNotUsableError, match="has no private key"):
        producer.get_private_key(kid)
    assert set(producer.to_mapping()["keys"][0]) & {"private_pem", "private_seed", "x25519_private"} == set()


def test_wrong_kind_and_unknown_ids(ring: FileKeyring) -> None:
    rsa_id = ring.list_key_ids("rsa-3072")[0]
    sym_id = ring.list_key_ids("symmetric-256")[0]
    with pytest.raises(KeyNotUsableError, match="is a rsa-3072 key, not a symmetric one"):
        ring.get_symmetric_key(rsa_id, KeyUse.ENCRYPT)
    with pytest.raises(KeyNotUsableError, match="without a public key"):
        ring.get_public_key(sym_id)
    with pytest.raises(UnknownKeyError, match="'ghost' is not in keyring"):
        ring.get_private_key("ghost")


def test_nothing_prints_key_material(ring: FileKeyring) -> None:
    sym_id = ring.list_key_ids("symmetric-256")[0]
    secret = ring.get_symmetric_key(sym_id, KeyUse.DECRYPT).secret
    texts = [repr(ring), repr(ring.records[sym_id]), repr(ring.get_symmetric_key(sym_id, KeyUse.DECRYPT))]
    hyb_id = ring.list_key_ids("x25519-ml-kem-1024")[0]
    texts += [repr(ring.get_private_key(hyb_id)), repr(ring.get_private_key(hyb_id).key)]
    for text in texts:
        assert base64.b64encode(secret).decode() not in text and secret.hex() not in text
    assert "<redacted>" in texts[2]


def test_records_carry_rotation_groups() -> None:
    rec = KeyRecord("a", "symmetric-256", T0, T0, secret=SECRET_A)
    assert rec.group == ("symmetric-256", None)


# --------------------------------------------------------------------------- AWS KMS (moto server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def kms_endpoint() -> Iterator[str]:
    """moto's KMS as a real HTTP server on loopback; boto3 talks to it over the wire."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def kms_client(endpoint: str):
    return boto3.client("kms", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5))


@pytest.fixture(scope="module")
def kms_key(kms_endpoint: str) -> dict[str, str]:
    client = kms_client(kms_endpoint)
    meta = client.create_key(Description="prism test key")["KeyMetadata"]
    alias = f"alias/prism-orders-{uuid.uuid4().hex[:12]}"  # moto's backend is shared by every server in the process
    client.create_alias(AliasName=alias, TargetKeyId=meta["KeyId"])
    return {"arn": meta["Arn"], "alias": alias}


def test_kms_provider_generates_and_unwraps_data_keys(kms_endpoint: str, kms_key: dict[str, str]) -> None:
    kms = AwsKmsProvider(default_key_id=kms_key["alias"], encryption_context={"environment": "test"},
                         client=kms_client(kms_endpoint))
    assert isinstance(kms, DataKeyProvider) and not isinstance(kms, KeyProvider)
    ctx = {"prism:message_id": "m1", "prism:namespace": "orders", "prism:topic": "orders.created"}
    dk = kms.generate_data_key(kms.current_key_id("symmetric-256", "orders"), ctx)
    assert dk.key_id == kms_key["arn"]  # the alias resolves to the key ARN, which is what envelopes record
    assert len(dk.plaintext) == 32 and dk.wrapped != dk.plaintext
    assert kms.decrypt_data_key(dk.key_id, dk.wrapped, ctx) == dk.plaintext
    assert "<redacted>" in repr(dk) and dk.plaintext.hex() not in repr(dk)
    # the encryption context is authenticated by KMS
    with pytest.raises(DecryptionError, match="InvalidCiphertextException"):
        kms.decrypt_data_key(dk.key_id, dk.wrapped, {**ctx, "prism:message_id": "m2"})
    other_env = AwsKmsProvider(default_key_id=kms_key["alias"], encryption_context={"environment": "prod"},
                               client=kms_client(kms_endpoint))
    with pytest.raises(DecryptionError):
        other_env.decrypt_data_key(dk.key_id, dk.wrapped, ctx)
    tampered = bytearray(dk.wrapped)
    tampered[-3] ^= 0x01
    with pytest.raises(DecryptionError):
        kms.decrypt_data_key(dk.key_id, bytes(tampered), ctx)


def test_kms_provider_key_selection(kms_endpoint: str, kms_key: dict[str, str]) -> None:
    kms = AwsKmsProvider(namespace_keys={"orders": kms_key["alias"]}, client=kms_client(kms_endpoint))
    assert kms.current_key_id("symmetric-256", "orders") == kms_key["alias"]
    assert kms.list_key_ids() == [kms_key["alias"]] and kms.list_key_ids("rsa-4096") == []
    with pytest.raises(UnknownKeyError, match="no KMS key configured for namespace billing"):
        kms.current_key_id("symmetric-256", "billing")
    with pytest.raises(KeyNotUsableError, match="symmetric data keys only"):
        kms.current_key_id("ml-kem-1024", "orders")


def test_kms_errors_map_onto_the_hierarchy(kms_endpoint: str) -> None:
    kms = AwsKmsProvider(client=kms_client(kms_endpoint))
    with pytest.raises(UnknownKeyError, match="'alias/missing' does not exist"):
        kms.generate_data_key("alias/missing", {})
    dead = AwsKmsProvider(client=kms_client(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(KeyProviderError, match="could not be sent") as info:
        dead.generate_data_key("alias/anything", {})
    assert info.value.transient


def test_kms_provider_builds_its_own_client(kms_endpoint: str, kms_key: dict[str, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    kms = AwsKmsProvider(default_key_id=kms_key["arn"], region_name="us-east-1", endpoint_url=kms_endpoint)
    dk = kms.generate_data_key(kms_key["arn"], {"k": "v"})
    assert kms.decrypt_data_key(dk.key_id, dk.wrapped, {"k": "v"}) == dk.plaintext
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
