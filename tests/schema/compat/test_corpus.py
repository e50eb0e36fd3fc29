"""One parametrized test over the whole compatibility corpus (tests/schema/corpus/*.yaml).

Every case states the expected verdict; cases may also pin the breaking rule ids (``rules``),
warning rule ids (``warn``) and finding paths (``paths``) so a verdict that is right for
the wrong reason still fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.schema.compat import CheckOptions, check
from app.schema.compat import diff as compat_diff
from app.schema.model import CompatibilityMode, SchemaFormat

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
FORMATS = {"protobuf.yaml": SchemaFormat.PROTOBUF, "avro.yaml": SchemaFormat.AVRO, "jsonschema.yaml": SchemaFormat.JSON}


def _cases() -> list:
    out = []
    for fname, fmt in FORMATS.items():
        for case in yaml.safe_load((CORPUS / fname).read_text()):
            out.append(pytest.param(fmt, case, id=f"{fmt.value.lower()}:{case['id']}"))
    return out


CASES = _cases()


def test_corpus_size_and_coverage() -> None:
    cases = [(p.values[0], p.values[1]) for p in CASES]
    assert len(cases) >= 60
    assert len({c["id"] for _, c in cases}) == len(cases), "duplicate case ids"
    modes = {c["mode"] for _, c in cases}
    assert modes == {m.value for m in CompatibilityMode}, modes
    for fmt in FORMATS.values():
        assert sum(1 for f, _ in cases if f is fmt) >= 15


@pytest.mark.parametrize(("fmt", "case"), CASES)
def test_corpus_case(fmt: SchemaFormat, case: dict) -> None:
    previous = case.get("previous") or [case["old"]]
    if "imports_old" in case:
        # imported files differ between versions: compare the two compiled sets directly
        from app.schema.compat.protobuf import diff as proto_diff
        from app.schema.protoparse import compile_proto

        old = compile_proto(case["old"], imports=case["imports_old"])
        new = compile_proto(case["new"], imports=case["imports_new"])
        changes = proto_diff(old, new)
        from app.schema.compat import _findings

        findings = _findings(changes, CompatibilityMode.parse(case["mode"]), None)
        breaking = [f for f in findings if f.severity.value == "breaking"]
        warnings = [f for f in findings if f.severity.value == "warning"]
        compatible = not breaking
    else:
        result = check(fmt, case["new"], [(f"v{i + 1}", t) for i, t in enumerate(previous)], case["mode"])
        breaking, warnings, compatible = result.breaking, result.warnings, result.is_compatible
    detail = "\n".join(f.render() for f in [*breaking, *warnings])
    assert compatible is case["compatible"], f"{case['id']}: expected compatible={case['compatible']}\n{detail}"
    for rule in case.get("rules", []):
        assert rule in {f.rule for f in breaking}, f"{case['id']}: missing breaking rule {rule}\n{detail}"
    for rule in case.get("warn", []):
        assert rule in {f.rule for f in warnings}, f"{case['id']}: missing warning {rule}\n{detail}"
    for path in case.get("paths", []):
        assert path in {f.path for f in breaking}, f"{case['id']}: no breaking finding at {path}\n{detail}"
    for f in breaking:
        assert f.reason and f.hint, f"finding without reason/hint: {f}"


def test_identical_schemas_have_no_findings() -> None:
    for p in CASES:
        fmt, case = p.values
        if "imports_old" in case:
            continue
        assert not check(fmt, case["new"], [case["new"]], "FULL").breaking, case["id"]


def test_diff_is_direction_annotated() -> None:
    changes = compat_diff(SchemaFormat.PROTOBUF, 'syntax="proto2"; message M { optional string a = 1; }',
                          'syntax="proto2"; message M { optional string a = 1; required string b = 2; }',
                          CheckOptions())
    [c] = [c for c in changes if c.rule == "REQUIRED_FIELD_ADDED"]
    assert c.breaks_backward and not c.breaks_forward


def test_plain_wire_semantics_option() -> None:
    old = 'syntax = "proto3"; message M { string a = 1; }'
    new = 'syntax = "proto3"; message M { string a = 1; string b = 2; }'
    assert not check("PROTOBUF", new, [old], "BACKWARD").is_compatible
    relaxed = check("PROTOBUF", new, [old], "BACKWARD", CheckOptions(implicit_presence_is_required=False))
    assert relaxed.is_compatible


def test_invalid_new_schema_raises() -> None:
    from app.schema.model import SchemaError

    with pytest.raises(SchemaError, match="Expected"):
        check("PROTOBUF", "syntax = 'proto3'; message X { int32 a = 1 }", [], "NONE")
    with pytest.raises(SchemaError):
        check("AVRO", '{"type":"record","name":"R","fields":[{"name":"a","type":"nope"}]}', [], "NONE")
    with pytest.raises(SchemaError):
        check("JSON", '{"type": 12}', [], "NONE")
