"""PII-aware payload access: reading a field the schema tags as PII emits a warning.

RFC-030 tags personal data in the schema (`(prism.pii)`, `x-prism-pii`, `prism.pii`);
RFC-031 asks consumers to know when they touch it. The SDK cannot stop a consumer from
reading its own data, but it can make every read of a tagged field visible: a
`PiiAccessWarning` (shown once per call site by Python's default filter, turned into an
error by `-W error::app.sdk.pii.PiiAccessWarning` in tests that must not touch PII) and an
INFO line on the `prism.sdk.pii` logger with the topic, message id and field path - never
the value.

Field paths are the registry's (`app.schema.pii.pii_fields`):

* JSON payloads: dotted key paths, `[]` for array items - `customer.email`, `items[].ssn`;
* protobuf payloads: `Message.field` with the message's name inside its package
  (`Order.email`, `Order.Customer.email`); the package-qualified form also works.

JSON payloads come back as `PiiDict`/`PiiList` (subclasses of `dict`/`list`, so
`json.dumps` and `isinstance` behave), protobuf payloads as a `PiiMessage` proxy whose
`.unwrap()` returns the real message.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf.message import Message

log = logging.getLogger("prism.sdk.pii")


class PiiAccessWarning(UserWarning):
    """A field tagged as PII was read from a received payload."""


class PiiPolicy:
    """Which fields are PII for one subscription, and where to report reads of them.

    The warning names the field and the topic, never the message: Python's default filter shows
    a warning once per call site and text, and a message id in the text made every message's read
    a new warning - a consumer saw one per `payload()` read. The audit log line (INFO,
    `prism.sdk.pii`) still names every message."""

    __slots__ = ("_flag_warned", "contains_pii_flag", "fields", "message_id", "topic")

    def __init__(self, fields: Iterable[str], *, topic: str = "", message_id: str = "",
                 contains_pii_flag: bool = False, _flag_warned: set[str] | None = None) -> None:
        self.fields = frozenset(fields)
        self.topic = topic
        self.message_id = message_id
        self.contains_pii_flag = contains_pii_flag
        #: topics whose contains_pii flag was already warned about, shared by the subscription's messages
        self._flag_warned: set[str] = set() if _flag_warned is None else _flag_warned

    def for_message(self, topic: str, message_id: str, contains_pii: bool) -> PiiPolicy:
        return PiiPolicy(self.fields, topic=topic, message_id=message_id, contains_pii_flag=contains_pii,
                         _flag_warned=self._flag_warned)

    def first_flag_on(self, topic: str) -> bool:
        """True the first time a flagged message of `topic` is read without a field list (then False)."""
        if topic in self._flag_warned:
            return False
        self._flag_warned.add(topic)
        return True

    def report(self, path: str) -> None:
        log.info("read PII field %r of message %s on topic %r", path, self.message_id, self.topic,
                 extra={"prism_pii": {"field": path, "topic": self.topic, "message_id": self.message_id}})
        text = f"read PII field {path!r} on topic {self.topic!r}"
        # Point the warning at the consumer's line, not at this module's wrappers.
        frame, level = sys._getframe(0), 1
        while frame.f_back is not None and frame.f_code.co_filename == __file__:
            frame, level = frame.f_back, level + 1
        warnings.warn(text, PiiAccessWarning, stacklevel=level)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _wrap(value: Any, path: str, policy: PiiPolicy) -> Any:
    if isinstance(value, dict) and not isinstance(value, PiiDict):
        return PiiDict(value, path, policy)
    if isinstance(value, list) and not isinstance(value, PiiList):
        return PiiList(value, path, policy)
    return value


class PiiDict(dict):
    """A JSON object whose tagged keys warn when read (see the module docstring)."""

    __slots__ = ("_path", "_policy")

    def __init__(self, data: dict, path: str, policy: PiiPolicy) -> None:
        super().__init__(data)
        self._path = path
        self._policy = policy

    def _check(self, key: Any) -> None:
        if isinstance(key, str):
            full = _join(self._path, key)
            if full in self._policy.fields:
                self._policy.report(full)

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)  # a key the payload lacks raises KeyError without a PII report
        self._check(key)
        return _wrap(value, _join(self._path, str(key)), self._policy)

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return default

    def values(self) -> Any:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> Any:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self._check(key)
        return super().pop(key, *default)

    def unwrap(self) -> dict:
        """A plain dict (reads of it no longer warn)."""
        return dict(super().items())


class PiiList(list):
    """A JSON array whose items are wrapped with the `[]` path (see the module docstring)."""

    __slots__ = ("_path", "_policy")

    def __init__(self, data: list, path: str, policy: PiiPolicy) -> None:
        super().__init__(data)
        self._path = path + "[]"
        self._policy = policy
        if self._path in policy.fields:
            policy.report(self._path)

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        if isinstance(index, slice):
            return [_wrap(v, self._path, self._policy) for v in value]
        return _wrap(value, self._path, self._policy)

    def __iter__(self) -> Iterator[Any]:
        for v in super().__iter__():
            yield _wrap(v, self._path, self._policy)


def _proto_names(msg: Message) -> tuple[str, str]:
    full = msg.DESCRIPTOR.full_name
    package = msg.DESCRIPTOR.file.package
    local = full[len(package) + 1:] if package and full.startswith(package + ".") else full
    return local, full


class PiiMessage:
    """A read-only proxy of a protobuf message whose tagged fields warn when read."""

    __slots__ = ("_local", "_msg", "_pkg", "_policy")

    def __init__(self, msg: Message, policy: PiiPolicy) -> None:
        object.__setattr__(self, "_msg", msg)
        object.__setattr__(self, "_policy", policy)
        local, full = _proto_names(msg)
        object.__setattr__(self, "_local", local)
        object.__setattr__(self, "_pkg", full)

    def __getattr__(self, name: str) -> Any:
        msg = self._msg
        value = getattr(msg, name)
        if name in msg.DESCRIPTOR.fields_by_name:
            for path in (f"{self._local}.{name}", f"{self._pkg}.{name}"):
                if path in self._policy.fields:
                    self._policy.report(path)
                    break
            if isinstance(value, Message):
                return PiiMessage(value, self._policy)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a received payload is read-only; copy it with unwrap() to change it")

    def unwrap(self) -> Message:
        """The real protobuf message (reads of it no longer warn)."""
        return self._msg

    def __eq__(self, other: object) -> bool:
        return self._msg == (other.unwrap() if isinstance(other, PiiMessage) else other)

    def __hash__(self) -> int:
        return id(self._msg)

    def __repr__(self) -> str:
        return f"PiiMessage({self._pkg}, {len(self._policy.fields)} PII field(s) tagged)"


def guard(value: Any, policy: PiiPolicy | None) -> Any:
    """Wrap a decoded payload so reads of tagged fields are reported; identity without fields."""
    if policy is None or not policy.fields:
        return value
    if isinstance(value, Message):
        return PiiMessage(value, policy)
    return _wrap(value, "", policy)
