"""Reading the delivery-audit topic (app.sdk.audit.records_from): anyone who can publish to the
topic can put anything there; a hostile record is counted as skipped, never a crash (issue 28)."""

from __future__ import annotations

from types import SimpleNamespace

from app.envelope.model import new_envelope
from app.sdk.audit import AUDIT_EVENT, records_from


def _raw(payload: bytes) -> SimpleNamespace:
    return SimpleNamespace(envelope=new_envelope("audit", payload, namespace="n", content_type="application/json"),
                           value=None)


def test_hostile_records_are_skipped_and_real_ones_kept() -> None:
    real = b'{"event":"%s","namespace":"n"}' % AUDIT_EVENT.encode()
    hostile = [b"[" * 200_000 + b"]" * 200_000, b'{"event":' * 5_000 + b"1" + b"}" * 5_000, b"NaN", b"\xff"]
    records, skipped = records_from([_raw(real), *map(_raw, hostile)])
    assert records == [{"event": AUDIT_EVENT, "namespace": "n"}] and skipped == len(hostile)
