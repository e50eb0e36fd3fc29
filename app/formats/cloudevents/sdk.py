"""The boundary with the `cloudevents` SDK (2.x, `cloudevents.core`): validation and its errors.

The SDK validates every event we read or write (required attributes, attribute types,
extension names) and writes the attribute part of structured events and the headers of
binary ones. Reading is done in this package, not with the SDK's readers, because those
(a) invent an `id` and `time` when they are missing instead of refusing the event,
(b) re-encode JSON data, which would change the payload bytes, and (c) raise non-Prism errors.
Whatever the SDK refuses is raised here as a CloudEventError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent

from ...errors import CloudEventError
from .._fields import datetime_from_ms, ms_from_rfc3339


def _sdk_event(attributes: dict[str, Any], data: Any) -> CloudEvent:
    try:
        return CloudEvent(dict(attributes), data)
    except BaseCloudEventException as exc:
        raise CloudEventError(f"not a valid CloudEvent: {exc}", hint="fix the listed attributes") from None


def _validate_with_sdk(attrs: Mapping[str, Any], data: Any) -> None:
    """Let the SDK apply its checks too (extension names, optional attribute types)."""
    checked = {k: v for k, v in attrs.items() if v is not None}
    if isinstance(checked.get("time"), str):
        checked["time"] = datetime_from_ms(ms_from_rfc3339(checked["time"], "time", CloudEventError))
    _sdk_event(checked, data if data else None)
