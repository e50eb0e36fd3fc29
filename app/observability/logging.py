"""Structured JSON logs with redaction at the handler, and RFC-031 crypto audit records.

Design:

* `RedactionFilter` is attached to HANDLERS, not loggers: a handler filter sees every record
  that reaches it, whichever logger (ours, aiokafka, faust, mode, a dependency) emitted it
  and whether it propagated there or not. It rewrites the record in place - message with
  its args merged, exception traceback, stack info and extra fields - so every formatter
  downstream, JSON or Faust's own, prints redacted text. `install_redaction()` puts it on
  handlers someone else created (Faust configures its own).
* `JsonFormatter` writes one JSON object per line with `ts`, `level`, `logger`, `msg`, the
  pipeline context (`message_id`, `topic`, `stage`, `partition`) bound by
  `log_context()` / `stage_span`, and `trace_id`/`span_id` of the current OpenTelemetry span.
  It redacts again while rendering (extras may be objects whose `str()` was never seen by
  the filter); redaction is idempotent.
* Audit (RFC-031 rev2, "Audit Logging": every encryption/decryption MUST be audited with
  timestamp, key_id, algorithm, success/failure, message_id) goes to the `prism.audit`
  logger at INFO, which `configure_logging` pins to INFO so the usual WARNING root level of
  a tuned worker does not silence it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from opentelemetry import trace

from app.observability.redaction import MASK, Redactor, default_redactor, is_sensitive_key

AUDIT_LOGGER = "prism.audit"
#: Fields that are identifiers by definition (audit records need them intact): only
#: registered secrets are removed from them, not the name=value heuristics.
IDENTIFIER_FIELDS = frozenset({"key_id", "public_key_id", "signature_key_id", "algorithm", "operation", "event",
                               "timestamp", "message_id", "error_code"})
CONTEXT_FIELDS = ("message_id", "topic", "stage", "partition", "trace_id", "span_id")
#: Prism's own loggers; records of any other logger have their bytes arguments replaced by a size.
_OWN_LOGGERS = ("prism", "app.")

_LOG_CONTEXT: ContextVar[Mapping[str, Any] | None] = ContextVar("prism_log_context", default=None)
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


# --------------------------------------------------------------------------- context


def bind_log_context(fields: Mapping[str, Any]) -> Token[Mapping[str, Any] | None]:
    """Merge `fields` into the current task's log context; returns the token for `reset_log_context`.
    (The fast path `stage_span` uses; `log_context()` is the friendly form.)"""
    current = _LOG_CONTEXT.get()
    return _LOG_CONTEXT.set({**current, **fields} if current else dict(fields))


def reset_log_context(token: Token[Mapping[str, Any] | None]) -> None:
    _LOG_CONTEXT.reset(token)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Every record logged inside carries these fields (per asyncio task, via contextvars)."""
    token = bind_log_context(fields)
    try:
        yield
    finally:
        _LOG_CONTEXT.reset(token)


def current_log_context() -> Mapping[str, Any]:
    return _LOG_CONTEXT.get() or {}


# --------------------------------------------------------------------------- redaction filter


def _redact_field(r: Redactor, name: str, value: Any) -> Any:
    if name in IDENTIFIER_FIELDS and isinstance(value, str):
        return r.redact(value, patterns=False)
    return MASK if is_sensitive_key(name) else r.redact_value(value)


class RedactionFilter(logging.Filter):
    """Redacts a record in place; never drops it. Attach to handlers (see module docstring)."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or default_redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_prism_redacted", False):
            return True
        r = self.redactor
        if isinstance(record.args, tuple) and record.args and not record.name.startswith(_OWN_LOGGERS):
            # Dependencies log the records they move (aiokafka: "Sending (key=%s value=%s)" at
            # DEBUG): message bytes - payloads with PII in them - never reach a log line.
            record.args = tuple(f"<{len(a)} bytes>" if isinstance(a, bytes | bytearray | memoryview) else a
                                for a in record.args)
        try:
            message = record.getMessage()
        except Exception:  # bad format args: keep the template, drop the args (they may be secret)
            message = f"{record.msg!s} [unformattable log arguments dropped]"
        record.msg = r.redact(message)
        record.args = ()  # not None: mode's formatter wraps a non-tuple into (None,) and breaks %-formatting
        if record.exc_info and record.exc_info[0] is not None:
            # Render the traceback now and drop the live exception: formatters then use
            # exc_text, and no later handler can re-render the secret-bearing message.
            if not record.exc_text:
                record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.prism_exc_type = record.exc_info[0].__name__
            record.exc_info = None
        if record.exc_text:
            record.exc_text = r.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = r.redact(record.stack_info)
        for name, value in list(record.__dict__.items()):
            if name in _STANDARD_ATTRS or name.startswith("_prism") or name == "prism_exc_type":
                continue
            record.__dict__[name] = _redact_field(r, name, value)
        record._prism_redacted = True
        return True


# --------------------------------------------------------------------------- JSON formatter


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record. Field order: ts, level, logger, msg, context, extras, exc."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or default_redactor()

    def format(self, record: logging.LogRecord) -> str:
        r = self.redactor
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": r.redact(record.getMessage()),
        }
        ctx = _LOG_CONTEXT.get()
        if ctx:
            for k, v in ctx.items():
                out[k] = _redact_field(r, k, v)
        if "trace_id" not in out:
            sc = trace.get_current_span().get_span_context()
            if sc.is_valid:
                out["trace_id"] = trace.format_trace_id(sc.trace_id)
                out["span_id"] = trace.format_span_id(sc.span_id)
        for name, value in record.__dict__.items():
            if name in _STANDARD_ATTRS or name.startswith("_prism") or name == "prism_exc_type":
                continue
            out[name] = _redact_field(r, name, value)
        exc_type = getattr(record, "prism_exc_type", None)
        if record.exc_info and record.exc_info[0] is not None:
            exc_type = record.exc_info[0].__name__
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if exc_type:
            out["exc_type"] = exc_type
        if record.exc_text:
            out["exc"] = r.redact(record.exc_text)
        if record.stack_info:
            out["stack"] = r.redact(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=lambda o: r.redact(str(o)))


# --------------------------------------------------------------------------- setup


@dataclass
class LoggingSetup:
    """What `configure_logging` installed, so tests and shutdown can take it back out."""

    handler: logging.Handler
    redactor: Redactor
    audit_handler: logging.Handler | None = None
    _previous_root_level: int = logging.WARNING
    _audit_previous: tuple[int, bool] = (logging.NOTSET, True)
    _extra_filters: list[tuple[logging.Handler, logging.Filter]] = field(default_factory=list)

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self._previous_root_level)
        audit = logging.getLogger(AUDIT_LOGGER)
        if self.audit_handler is not None:
            audit.removeHandler(self.audit_handler)
        audit.setLevel(self._audit_previous[0])
        audit.propagate = self._audit_previous[1]
        for h, f in self._extra_filters:
            h.removeFilter(f)


def configure_logging(
    level: int | str = "INFO",
    *,
    stream: IO[str] | None = None,
    redactor: Redactor | None = None,
    audit_stream: IO[str] | None = None,
) -> LoggingSetup:
    """JSON logs with redaction on the root logger (every library's records reach it).

    `audit_stream` sends `prism.audit` records to their own stream (and not to the main
    one); without it they go to the main stream, marked by `"logger": "prism.audit"`.
    """
    red = redactor or default_redactor()
    root = logging.getLogger()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(red))
    handler.addFilter(RedactionFilter(red))
    setup = LoggingSetup(handler, red, _previous_root_level=root.level)
    root.addHandler(handler)
    root.setLevel(level)
    audit = logging.getLogger(AUDIT_LOGGER)
    setup._audit_previous = (audit.level, audit.propagate)
    audit.setLevel(logging.INFO)
    if audit_stream is not None:
        ah = logging.StreamHandler(audit_stream)
        ah.setFormatter(JsonFormatter(red))
        ah.addFilter(RedactionFilter(red))
        audit.addHandler(ah)
        audit.propagate = False
        setup.audit_handler = ah
    return setup


def install_redaction(redactor: Redactor | None = None) -> list[tuple[logging.Handler, logging.Filter]]:
    """Attach a `RedactionFilter` to every handler that exists now (root and named loggers),
    e.g. the ones Faust installs at worker start. Call it again after anything adds handlers.
    Returns what was attached (for removal)."""
    red = redactor or default_redactor()
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    attached = []
    for lg in loggers:
        for h in lg.handlers:
            if not any(isinstance(f, RedactionFilter) for f in h.filters):
                f = RedactionFilter(red)
                h.addFilter(f)
                attached.append((h, f))
    return attached


def logging_dict_config(level: str = "INFO") -> dict[str, Any]:
    """A `logging.config.dictConfig` dict with the JSON formatter and the redaction filter
    (uses the process default redactor) - for Faust's `logging_config` worker setting."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": RedactionFilter}},
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "json": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["redact"],
                     "stream": "ext://sys.stderr"},
        },
        "loggers": {AUDIT_LOGGER: {"level": "INFO"}},
        "root": {"level": level, "handlers": ["json"]},
    }


# --------------------------------------------------------------------------- audit

CRYPTO_OPERATIONS = frozenset({
    "encrypt", "decrypt", "sign", "verify", "wrap", "unwrap", "encapsulate", "decapsulate",
    "key_fetch", "key_rotate", "key_use",
})


def audit_key_use(
    operation: str,
    *,
    key_id: str,
    algorithm: str,
    success: bool,
    message_id: str | None,
    error_code: str | None = None,
    logger: logging.Logger | None = None,
    **extra: str | int | bool | None,
) -> dict[str, Any]:
    """Write one audit record for a key use (RFC-031: timestamp, key_id, algorithm,
    success/failure, message_id). `error_code` is a `PrismError.code`, never a message.
    Returns the record's fields (handy for tests and for forwarding to another sink)."""
    if operation not in CRYPTO_OPERATIONS:
        operation = "key_use"
    fields: dict[str, Any] = {
        "event": f"crypto.{operation}",
        "timestamp": _iso(time.time()),
        "operation": operation,
        "key_id": key_id,
        "algorithm": algorithm,
        "success": bool(success),
        "message_id": message_id,
    }
    if error_code:
        fields["error_code"] = error_code
    for k, v in extra.items():
        fields.setdefault(k, v)
    (logger or logging.getLogger(AUDIT_LOGGER)).info(
        "crypto %s %s", operation, "ok" if success else "failed", extra={"audit": True, **fields},
    )
    return fields
