"""Schemas as a person reads them: Avro and JSON Schema indented, one field per line.

Why: both are stored as the producer sent them, often as one long line (Confluent clients
send compact JSON). A one-line schema is unreadable on a page and a line diff of two of them
is one removed and one added line - it shows *that* something changed, never *what*. The
registry's ``/v1/subjects/{s}/diff``, its ``/ui`` page and the operator console
(:mod:`app.console`) all diff the pretty forms. Protobuf is text already written for people
and is kept as it is.
"""

from __future__ import annotations

import difflib
import json

from app.schema.model import SchemaFormat
from app.untrusted_json import loads_untrusted


def pretty_schema(fmt: SchemaFormat | str, text: str) -> str:
    """``text`` indented by two spaces when it is Avro or JSON Schema that parses as JSON
    (key order kept: it is the author's); anything else - Protobuf, or JSON that does not
    parse - unchanged, so a pretty form never hides what was stored."""
    try:
        parsed_fmt = SchemaFormat.parse(fmt)
    except ValueError:
        return text
    if parsed_fmt is SchemaFormat.PROTOBUF:
        return text
    try:
        return json.dumps(loads_untrusted(text, what="schema"), indent=2, ensure_ascii=False)
    except ValueError:  # not JSON, or too large/deep (JsonInputError): shown as it is
        return text


def schema_diff(fmt: SchemaFormat | str, old: str, new: str, old_label: str, new_label: str) -> list[str]:
    """A unified diff (difflib) of the pretty forms of two schemas, one string per line."""
    return list(difflib.unified_diff(pretty_schema(fmt, old).splitlines(), pretty_schema(fmt, new).splitlines(),
                                     old_label, new_label, lineterm=""))
