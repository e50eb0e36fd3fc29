"""Redaction canaries never reach captured log output, whoever logs them and however
(message args, extras, exception tracebacks, stack info), and audit records are complete."""

from __future__ import annotations

import base64
import io
import json
import logging

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.errors import AuthError, DecryptionError
from app.observability.logging import (
    AUDIT_LOGGER,
    JsonFormatter,
    RedactionFilter,
    audit_key_use,
    configure_logging,
    install_redaction,
    log_context,
    logging_dict_config,
)
from app.observability.redaction import MASK, Redactor, is_sensitive_key

JWT = "eyJhbGciOiJFZERTQSIsImtpZCI6ImszIn0.eyJzdWIiOiJjYW5hcnktcHJvZHVjZXItNDQyIn0.Q2FuYXJ5U2lnbmF0dXJlQnl0ZXM"
OPAQUE_TOKEN = "canary-opaque-token-5c1e0d"  # not JWT-shaped: only registration catches it
HMAC_KEY = bytes(range(100, 132))
PII_EMAIL = "canary.pii.bob@example.invalid"
PII_NAME = "Bobby Canaryson"
PEM = Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
PEM_BODY = PEM.splitlines()[1]
DB_PASSWORD = "canary-db-pass-77"

CANARIES = [JWT, OPAQUE_TOKEN, HMAC_KEY.hex(), base64.b64encode(HMAC_KEY).decode(), PII_EMAIL, PII_NAME, PEM_BODY,
            DB_PASSWORD, "Q2FuYXJ5U2lnbmF0dXJlQnl0ZXM"]

LOGGERS = ["aiokafka.consumer.fetcher", "faust.worker", "mode.services", "app.worker.stages", "prism.sdk", ""]


@pytest.fixture
def redactor():
    r = Redactor()
    for secret in (OPAQUE_TOKEN, HMAC_KEY, PII_EMAIL, PII_NAME):
        assert r.register_secret(secret)
    return r


@pytest.fixture
def captured(redactor):
    stream = io.StringIO()
    setup = configure_logging("DEBUG", stream=stream, redactor=redactor)
    yield stream
    setup.close()


def _assert_clean(text: str) -> None:
    for canary in CANARIES:
        assert canary not in text, f"canary leaked: {canary[:20]}..."


def _log_everything(log: logging.Logger) -> None:
    log.info("producer token %s accepted", JWT)
    log.info("opaque %s and key %r", OPAQUE_TOKEN, HMAC_KEY)
    log.warning("key hex=%s b64=%s", HMAC_KEY.hex(), base64.b64encode(HMAC_KEY).decode())
    log.info("Authorization: Bearer %s", OPAQUE_TOKEN[::-1] + "x")  # unregistered bearer value
    log.info("headers %s", {"authorization": f"Bearer {JWT}", "x-api-key": "k-123456"})
    log.info("connecting to postgresql://prism:%s@db:5432/test", DB_PASSWORD)
    log.info("loaded key\n%s", PEM)
    log.info("customer %s <%s> ordered", PII_NAME, PII_EMAIL)
    log.info("fields", extra={"auth_token": JWT, "payload": {"email": PII_EMAIL, "password": "pw-1"}})
    log.debug("stack", stack_info=True)
    try:
        raise AuthError(f"token {JWT} rejected", hint=f"for {PII_EMAIL}")
    except AuthError:
        log.exception("auth failed")
    try:
        try:
            raise KeyError(OPAQUE_TOKEN)
        except KeyError as inner:
            raise DecryptionError(f"cannot decrypt with key {HMAC_KEY!r}") from inner
    except DecryptionError:
        log.error("decrypt failed", exc_info=True)


@pytest.mark.parametrize("name", LOGGERS, ids=[n or "root" for n in LOGGERS])
def test_canaries_never_reach_json_output(captured, name):
    _log_everything(logging.getLogger(name))
    out = captured.getvalue()
    _assert_clean(out)  # everything captured, whoever logged it
    # Only this logger's lines are counted: threads left by earlier tests in the same process
    # (py4j's Spark gateway, at DEBUG) may log into the root handler meanwhile.
    lines = [rec for rec in map(json.loads, out.splitlines()) if rec["logger"] == (name or "root")]
    assert len(lines) == 12
    # the records are still useful: messages, types and tracebacks survive around the masks
    assert lines[0]["msg"] == f"producer token {MASK} accepted"
    assert lines[8]["auth_token"] == MASK and lines[8]["payload"]["password"] == MASK
    auth = lines[10]
    assert auth["exc_type"] == "AuthError" and "Traceback" in auth["exc"] and MASK in auth["exc"]
    chained = lines[11]
    assert "KeyError" in chained["exc"] and "DecryptionError" in chained["exc"]


def test_foreign_handlers_get_the_filter_via_install_redaction(redactor):
    """Faust installs its own handler and formatter: install_redaction covers it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    faust_logger = logging.getLogger("faust.test_foreign")
    faust_logger.addHandler(handler)
    faust_logger.setLevel(logging.DEBUG)
    faust_logger.propagate = False
    try:
        attached = install_redaction(redactor)
        assert any(h is handler for h, _ in attached)
        assert install_redaction(redactor) == []  # idempotent
        _log_everything(faust_logger)
    finally:
        faust_logger.removeHandler(handler)
        for h, f in attached:
            h.removeFilter(f)
    out = stream.getvalue()
    assert "Traceback" in out and "DecryptionError" in out
    _assert_clean(out)


def test_filter_protects_handlers_that_run_later_on_the_same_record(redactor):
    """Once a filtered handler has seen a record, the live exception is gone: a second,
    unfiltered handler can only print the redacted traceback."""
    first, second = io.StringIO(), io.StringIO()
    h1 = logging.StreamHandler(first)
    h1.addFilter(RedactionFilter(redactor))
    h2 = logging.StreamHandler(second)
    h2.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("app.order_of_handlers")
    log.addHandler(h1)
    log.addHandler(h2)
    log.propagate = False
    try:
        try:
            raise ValueError(f"bad {OPAQUE_TOKEN}")
        except ValueError:
            log.exception("boom %s", JWT)
    finally:
        log.removeHandler(h1)
        log.removeHandler(h2)
    _assert_clean(first.getvalue() + second.getvalue())
    assert "ValueError" in second.getvalue()


def test_log_context_fields(captured):
    with log_context(message_id="m-1", topic="orders", stage="verify", token=JWT):
        logging.getLogger("app").warning("checked")
    line = json.loads(captured.getvalue())
    assert (line["message_id"], line["topic"], line["stage"]) == ("m-1", "orders", "verify")
    assert line["token"] == MASK
    assert "trace_id" not in line  # no current span


def test_audit_records_have_the_rfc_fields_even_with_a_quiet_root(redactor):
    main, audit = io.StringIO(), io.StringIO()
    setup = configure_logging("WARNING", stream=main, redactor=redactor, audit_stream=audit)
    try:
        ok = audit_key_use("encrypt", key_id="arn:aws:kms:us-west-2:123456789:key/abc-def-123",
                           algorithm="aes-256-gcm", success=True, message_id="0190-aaaa")
        audit_key_use("decrypt", key_id="k-7", algorithm="ml-kem-768+aes-256-gcm", success=False,
                      message_id="0190-bbbb", error_code="decryption_failed")
        audit_key_use("frobnicate", key_id="hmac-key:2024", algorithm="ed25519", success=True, message_id=None)
    finally:
        setup.close()
    assert main.getvalue() == ""  # audit has its own stream
    records = [json.loads(line) for line in audit.getvalue().splitlines()]
    assert len(records) == 3
    first, second, third = records
    for rec in records:
        assert {"timestamp", "key_id", "algorithm", "success", "message_id"} <= rec.keys()
        assert rec["logger"] == AUDIT_LOGGER and rec["audit"] is True
        assert rec["timestamp"].endswith("Z")
    assert first["key_id"] == "arn:aws:kms:us-west-2:123456789:key/abc-def-123"  # key ids are not secrets
    assert first["event"] == "crypto.encrypt" and first["success"] is True
    assert ok["key_id"] == first["key_id"]
    assert second["success"] is False and second["error_code"] == "decryption_failed"
    assert third["operation"] == "key_use" and third["message_id"] is None
    assert third["key_id"] == "hmac-key:2024"  # identifiers are not run through name=value heuristics


def test_audit_goes_to_the_main_stream_without_an_audit_stream(captured):
    audit_key_use("sign", key_id="worker-ed", algorithm="ed25519", success=True, message_id="m")
    rec = json.loads(captured.getvalue())
    assert rec["event"] == "crypto.sign" and rec["key_id"] == "worker-ed"


def test_dict_config_builds_a_redacting_json_handler():
    import logging.config

    cfg = logging_dict_config("INFO")
    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        logging.config.dictConfig(cfg)
        (h,) = [h for h in root.handlers if h not in before[0]]
        assert isinstance(h.formatter, JsonFormatter)
        assert any(isinstance(f, RedactionFilter) for f in h.filters)
    finally:
        for h in list(root.handlers):
            if h not in before[0]:
                root.removeHandler(h)
        root.handlers[:] = before[0]
        root.setLevel(before[1])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("token=abc123 next", f"token={MASK} next"),
     ('{"client_secret": "a b c", "key_id": "k1"}', f'{{"client_secret": "{MASK}", "key_id": "k1"}}'),
     ("key_id=k1 signature_algorithm=ed25519", "key_id=k1 signature_algorithm=ed25519"),
     ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: {MASK}"),
     ("see Bearer abcdefgh", f"see Bearer {MASK}"),
     ("api.example.com and a.b.c stay", "api.example.com and a.b.c stay"),
     ("password: 'hunter2'", f"password: '{MASK}'"),
     ("-----BEGIN RSA PRIVATE KEY-----\nMIIE...cut off", MASK),
     ("amqp://guest:guest@rabbit/", f"amqp://guest:{MASK}@rabbit/")],
    ids=["kv", "json", "key_id_kept", "basic", "bearer", "dotted_names_kept", "quoted", "truncated_pem", "url"],
)
def test_redaction_rules(text, expected):
    assert Redactor().redact(text) == expected


def test_register_secret_rules():
    r = Redactor(min_secret_length=4, max_secrets=50)
    assert not r.register_secret("abc")  # too short to be useful, would wreck every line
    for i in range(200):  # forces recompiles and eviction
        r.register_secret(f"pii-value-{i:04d}")
    assert r.secret_count == 50
    assert r.redact("x pii-value-0199 y") == f"x {MASK} y"
    assert is_sensitive_key("X-Api-Key") and is_sensitive_key("auth_tokens") and not is_sensitive_key("key_id")


def test_redacted_record_still_formats_under_faust_worker_formatter() -> None:
    """Faust's worker logs through mode's ExtensionFormatter, which wraps a non-tuple
    ``record.args`` into a 1-tuple; the filter must leave args as an empty tuple, or every
    record (e.g. mode's own "Gathering service tasks...") fails with a logging error."""
    from mode.utils.logging import ExtensionFormatter

    for msg, args in (("Gathering service tasks...", ()), ("committed %s", ([("t", 1, 5)],))):
        record = logging.LogRecord("mode", logging.INFO, __file__, 1, msg, args, None)
        assert RedactionFilter().filter(record)
        out = ExtensionFormatter(stream=io.StringIO(), fmt="%(message)s").format(record)
        assert out == (msg % args if args else msg)


def test_dependencies_never_log_message_bytes() -> None:
    """aiokafka logs every record it sends at DEBUG ("Sending (key=%s value=%s)"): the bytes are
    replaced by their size before anything formats them; Prism's own records keep their args."""
    stream = io.StringIO()
    setup = configure_logging("DEBUG", stream=stream)
    try:
        payload = b'{"customer_email": "dave@example.invalid"}'
        logging.getLogger("aiokafka.producer.producer").debug("Sending (key=%s value=%s) to %s", b"k", payload, "tp")
        logging.getLogger("prism.worker").debug("read %s", "orders")
    finally:
        setup.close()
    out = stream.getvalue()
    assert "dave@example.invalid" not in out and f"value=<{len(payload)} bytes>" in out and "read orders" in out
