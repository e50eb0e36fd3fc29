"""Value types shared by every layer of the schema registry.

Kept free of I/O and third-party imports so that the pipeline (which only needs
``ResolvedSchema``) and the checker can import them cheaply.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..errors import JsonInputError, JsonSyntaxError
from ..untrusted_json import loads_untrusted


class SchemaFormat(enum.StrEnum):
    """Schema languages the registry understands.

    Values are Confluent's ``schemaType`` names so the REST layer can pass them through.
    """

    PROTOBUF = "PROTOBUF"
    JSON = "JSON"
    AVRO = "AVRO"

    @classmethod
    def parse(cls, value: str | SchemaFormat | None) -> SchemaFormat:
        """Accept the spellings people actually type (``proto``, ``json-schema``, ``avsc``...)."""
        if isinstance(value, SchemaFormat):
            return value
        if value is None or value == "":
            return cls.AVRO  # Confluent's default when schemaType is omitted
        v = value.strip().upper().replace("-", "_")
        aliases = {
            "PROTO": cls.PROTOBUF, "PROTOBUF": cls.PROTOBUF, "PB": cls.PROTOBUF,
            "JSON": cls.JSON, "JSON_SCHEMA": cls.JSON, "JSONSCHEMA": cls.JSON,
            "AVRO": cls.AVRO, "AVSC": cls.AVRO,
        }
        if v not in aliases:
            raise ValueError(f"unknown schema format {value!r}; use PROTOBUF, JSON or AVRO")
        return aliases[v]

    @classmethod
    def from_filename(cls, name: str) -> SchemaFormat:
        """Guess the format from a file extension (CLI convenience)."""
        lower = name.lower()
        if lower.endswith(".proto"):
            return cls.PROTOBUF
        if lower.endswith((".avsc", ".avro")):
            return cls.AVRO
        if lower.endswith(".json"):
            return cls.JSON
        raise ValueError(f"cannot tell the schema format of {name!r}; pass --format")


class CompatibilityMode(enum.StrEnum):
    """Confluent's compatibility levels.

    BACKWARD: a reader using the NEW schema can read data written with the old one(s).
    FORWARD:  a reader using the OLD schema(s) can read data written with the new one.
    FULL:     both. ``*_TRANSITIVE`` checks every earlier version instead of only the latest.
    """

    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @classmethod
    def parse(cls, value: str | CompatibilityMode) -> CompatibilityMode:
        if isinstance(value, CompatibilityMode):
            return value
        try:
            return cls(value.strip().upper().replace("-", "_"))
        except ValueError:
            raise ValueError(f"unknown compatibility mode {value!r}") from None

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def checks_backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def checks_forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


class Severity(enum.StrEnum):
    BREAKING = "breaking"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference between two schemas that a human should know about.

    ``path`` names the element (``OrderCreated.payment_method``), ``rule`` is a stable
    identifier tests and CI can match on, ``reason`` is one line, ``hint`` says how to fix it.
    ``against`` is the earlier version the new schema was compared with (transitive checks).
    """

    severity: Severity
    path: str
    rule: str
    reason: str
    hint: str = ""
    against: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "severity": self.severity.value, "path": self.path, "rule": self.rule,
            "reason": self.reason, "hint": self.hint, "against": self.against,
        }

    def render(self) -> str:
        icon = "❌" if self.severity is Severity.BREAKING else "⚠️ "
        tail = f" (vs {self.against})" if self.against else ""
        text = f"{icon} {self.path}: {self.reason} [{self.rule}]{tail}"
        if self.hint:
            text += f"\n   ℹ️  {self.hint}"
        return text


@dataclass(frozen=True, slots=True)
class CompatResult:
    """Verdict of a compatibility check: compatible iff no finding is breaking."""

    mode: CompatibilityMode
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def is_compatible(self) -> bool:
        return not any(f.severity is Severity.BREAKING for f in self.findings)

    @property
    def breaking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.BREAKING]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode.value,
            "is_compatible": self.is_compatible,
            "breaking_changes": [f.to_dict() for f in self.breaking],
            "warnings": [f.to_dict() for f in self.warnings],
        }


class SchemaError(ValueError):
    """A schema that does not parse (bad syntax, unknown import, invalid Avro...)."""


def schema_json(text: str, kind: str) -> Any:
    """The JSON of an Avro or JSON Schema text, parsed by the bounded decoder
    (``app.untrusted_json``): a schema nested thousands of levels deep is a :class:`SchemaError`
    (the registry's 422), not a ``RecursionError`` in a compiler (its 500). `kind` names the
    text in the message ("Avro schema", "JSON Schema", "referenced schema 'x'")."""
    try:
        return loads_untrusted(text, what=kind)
    except JsonSyntaxError as e:
        raise SchemaError(f"{kind} is not JSON: {e.message}") from None
    except JsonInputError as e:
        raise SchemaError(f"{kind} is refused: {e.message}") from None
