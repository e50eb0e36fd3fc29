"""Prism schema registry (RFC-030): compatibility checking, PII governance, storage, REST service.

The package is layered so that each layer can be used without the ones above it:

- :mod:`app.schema.model`     formats, compatibility modes, findings (no dependencies)
- :mod:`app.schema.protoparse` real ``.proto`` parsing through ``protoc`` (grpcio-tools)
- :mod:`app.schema.compat`    compatibility checker for Protobuf, Avro and JSON Schema
- :mod:`app.schema.pii`       ``(prism.pii)`` annotations, PII-name detection, audit
- :mod:`app.schema.store`     SQLite / PostgreSQL storage
- :mod:`app.schema.registry`  the registry's rules (immutability, policy, approvals, audit log)
- :mod:`app.schema.authz`     who may call which route (one table) and the auth middleware
- :mod:`app.schema.service`   FastAPI app: Prism API + Confluent Schema Registry REST subset
- :mod:`app.schema.resolve`   start-up resolution into an immutable ``ResolvedSchema``
- :mod:`app.schema.cli`       ``prism schema ...`` (typer sub-app)
"""

from .model import CompatibilityMode, CompatResult, Finding, SchemaFormat, Severity

__all__ = ["CompatResult", "CompatibilityMode", "Finding", "SchemaFormat", "Severity"]
