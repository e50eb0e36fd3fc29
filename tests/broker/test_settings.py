"""BrokerSettings.from_env: parsing, validation messages, aiokafka/Faust conversion (no broker)."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.broker.admin import BrokerSettings, BrokerSettingsError
from app.errors import ConfigError


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prism test CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = tmp_path / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def problems_of(env: dict[str, str]) -> list[str]:
    with pytest.raises(BrokerSettingsError) as info:
        BrokerSettings.from_env(env)
    assert isinstance(info.value, ConfigError)
    return info.value.problems


def test_empty_environment_means_embedded_plaintext() -> None:
    settings = BrokerSettings.from_env({})
    assert settings.embedded and settings.bootstrap == ""
    assert settings.security_protocol == "PLAINTEXT"
    assert settings.aiokafka_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert settings.faust_credentials() is None
    assert settings.ssl_context() is None


@pytest.mark.parametrize("url, servers", [
    ("broker:9092", ("broker:9092",)),
    ("kafka://a:1;b", ("a:1", "b:9092")),
    ("a:9093, b:9094", ("a:9093", "b:9094")),
    ("kafka://[::1]:9095", ("[::1]:9095",)),
    ("  kafka://host/  ", ("host:9092",)),
])
def test_broker_url_forms(url: str, servers: tuple[str, ...]) -> None:
    settings = BrokerSettings.from_env({"PRISM_BROKER_URL": url})
    assert settings.bootstrap_servers == servers
    assert not settings.embedded


@pytest.mark.parametrize("url, fragment", [
    ("http://broker:9092", "has scheme 'http'"),
    ("broker:notaport", "invalid port 'notaport'"),
    ("broker:70000", "invalid port '70000'"),
    (":9092", "has no host name"),
])
def test_bad_broker_url(url: str, fragment: str) -> None:
    problems = problems_of({"PRISM_BROKER_URL": url})
    assert len(problems) == 1
    assert problems[0].startswith("PRISM_BROKER_URL:") and fragment in problems[0]


def test_sasl_ssl_reports_every_missing_variable_at_once() -> None:
    problems = problems_of({"PRISM_BROKER_URL": "k:9092", "PRISM_SECURITY_PROTOCOL": "SASL_SSL"})
    assert [p.split(":")[0] for p in problems] == ["PRISM_SASL_MECHANISM", "PRISM_SASL_USERNAME",
                                                  "PRISM_SASL_PASSWORD"]
    assert all("required with PRISM_SECURITY_PROTOCOL=SASL_SSL" in p for p in problems)


def test_unknown_protocol_and_unsupported_mechanism() -> None:
    assert "is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL" in problems_of(
        {"PRISM_BROKER_URL": "k", "PRISM_SECURITY_PROTOCOL": "TLS"})[0]
    problems = problems_of({"PRISM_BROKER_URL": "k", "PRISM_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                            "PRISM_SASL_MECHANISM": "GSSAPI", "PRISM_SASL_USERNAME": "u",
                            "PRISM_SASL_PASSWORD": "p"})
    assert problems == ["PRISM_SASL_MECHANISM: 'GSSAPI' is not supported; use one of PLAIN, SCRAM-SHA-256, "
                        "SCRAM-SHA-512"]


def test_sasl_variables_without_sasl_protocol_are_rejected() -> None:
    problems = problems_of({"PRISM_BROKER_URL": "k", "PRISM_SASL_USERNAME": "u"})
    assert problems == ["PRISM_SASL_USERNAME: set, but PRISM_SECURITY_PROTOCOL=PLAINTEXT does not use SASL; "
                        "use SASL_PLAINTEXT or SASL_SSL, or unset it"]


def test_security_settings_with_the_embedded_broker_are_rejected() -> None:
    problems = problems_of({"PRISM_SECURITY_PROTOCOL": "SSL"})
    assert len(problems) == 1 and "PRISM_BROKER_URL is empty" in problems[0]


def test_cafile_checks(tmp_path: Path, ca_file: Path) -> None:
    missing = tmp_path / "nope.pem"
    assert "does not exist" in problems_of({"PRISM_BROKER_URL": "k", "PRISM_SECURITY_PROTOCOL": "SSL",
                                            "PRISM_SSL_CAFILE": str(missing)})[0]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    assert "is not a readable PEM CA bundle" in problems_of(
        {"PRISM_BROKER_URL": "k", "PRISM_SECURITY_PROTOCOL": "SSL", "PRISM_SSL_CAFILE": str(garbage)})[0]
    assert "does not use TLS" in problems_of({"PRISM_BROKER_URL": "k", "PRISM_SSL_CAFILE": str(ca_file)})[0]


def test_ssl_settings_convert_for_aiokafka_and_faust(ca_file: Path) -> None:
    from faust.auth import SSLCredentials

    settings = BrokerSettings.from_env({"PRISM_BROKER_URL": "k:9093", "PRISM_SECURITY_PROTOCOL": "ssl",
                                        "PRISM_SSL_CAFILE": str(ca_file)})
    kwargs = settings.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SSL"
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert isinstance(settings.faust_credentials(), SSLCredentials)


def test_sasl_ssl_settings_convert_for_aiokafka_and_faust(ca_file: Path) -> None:
    from faust.auth import SASLCredentials

    settings = BrokerSettings.from_env({
        "PRISM_BROKER_URL": "k:9093", "PRISM_SECURITY_PROTOCOL": "SASL_SSL",
        "PRISM_SASL_MECHANISM": "scram-sha-512", "PRISM_SASL_USERNAME": "prism",
        "PRISM_SASL_PASSWORD": "s3cret pass", "PRISM_SSL_CAFILE": str(ca_file)})
    assert "s3cret" not in repr(settings)
    kwargs = settings.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "prism" and kwargs["sasl_plain_password"] == "s3cret pass"
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    credentials = settings.faust_credentials()
    assert isinstance(credentials, SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512"


def test_sasl_plaintext_has_no_ssl_context() -> None:
    settings = BrokerSettings.from_env({
        "PRISM_BROKER_URL": "k", "PRISM_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "PRISM_SASL_MECHANISM": "PLAIN", "PRISM_SASL_USERNAME": "u", "PRISM_SASL_PASSWORD": "p"})
    kwargs = settings.aiokafka_kwargs()
    assert "ssl_context" not in kwargs and kwargs["sasl_mechanism"] == "PLAIN"
    assert settings.faust_credentials().protocol.value == "SASL_PLAINTEXT"


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PRISM_SECURITY_PROTOCOL", "PRISM_SASL_MECHANISM", "PRISM_SASL_USERNAME",
                 "PRISM_SASL_PASSWORD", "PRISM_SSL_CAFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRISM_BROKER_URL", "from-env:9092")
    assert BrokerSettings.from_env().bootstrap == "from-env:9092"


def _client_cert(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "worker-1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "client.crt", tmp_path / "client.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_client_certificate_loads_into_the_context(tmp_path: Path, ca_file: Path) -> None:
    cert, key = _client_cert(tmp_path)
    settings = BrokerSettings.from_env({"PRISM_BROKER_URL": "b:9093", "PRISM_SECURITY_PROTOCOL": "SSL",
                                        "PRISM_SSL_CAFILE": str(ca_file), "PRISM_SSL_CERTFILE": str(cert),
                                        "PRISM_SSL_KEYFILE": str(key)})
    assert settings.ssl_certfile == cert and settings.ssl_keyfile == key
    assert isinstance(settings.ssl_context(), ssl.SSLContext)
    assert settings.principal == "User:CN=worker-1"


def test_client_certificate_problems_are_listed_at_once(tmp_path: Path) -> None:
    _, key = _client_cert(tmp_path)
    other_cert, _ = _client_cert(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path)
    problems = problems_of({"PRISM_BROKER_URL": "b", "PRISM_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                            "PRISM_SASL_MECHANISM": "PLAIN", "PRISM_SASL_USERNAME": "u", "PRISM_SASL_PASSWORD": "p",
                            "PRISM_SSL_CERTFILE": str(tmp_path / "missing.crt")})
    assert any(p.startswith("PRISM_SSL_CERTFILE/PRISM_SSL_KEYFILE: set, but") for p in problems)
    assert any(p.startswith("PRISM_SSL_KEYFILE: required") for p in problems)
    assert any(p.startswith("PRISM_SSL_CERTFILE: ") and "does not exist" in p for p in problems)
    mismatched = problems_of({"PRISM_BROKER_URL": "b", "PRISM_SECURITY_PROTOCOL": "SSL",
                              "PRISM_SSL_CERTFILE": str(other_cert), "PRISM_SSL_KEYFILE": str(key)})
    assert len(mismatched) == 1 and "not a matching pair" in mismatched[0]
    assert problems_of({"PRISM_BROKER_URL": "b", "PRISM_SECURITY_PROTOCOL": "SSL",
                        "PRISM_SSL_KEY_PASSWORD": "x"})[0].startswith("PRISM_SSL_KEY_PASSWORD: set, but")


@pytest.mark.parametrize("url, problem", [
    ("no such:1", "'no such:1' contains whitespace"),
    ("a:1,b c:2", "'b c:2' contains whitespace"),
    ("bad/host:1", "invalid host 'bad/host'"),
    ("-x:1", "invalid host '-x'"),
])
def test_a_bootstrap_entry_is_never_split_at_whitespace_or_taken_with_a_bad_host(url: str, problem: str) -> None:
    """`no such:1` was parsed as `no:9092,such:1` and the connection error named hosts nobody
    wrote; now it is the one settings problem, with a fix hint."""
    problems = problems_of({"PRISM_BROKER_URL": url})
    assert len(problems) == 1 and problem in problems[0], problems
