"""app/native.py, the one place that chooses the compiled hot path: it is used only when
installed, of the expected ABI and not switched off; every fault the native walk reports is
worded as the `PrismError` the Python walk raises. These run without the native module too (a
stand-in module plays it), so a machine without cargo checks the fallback logic."""

from __future__ import annotations

import sys
import types

import pytest

from app import native
from app.envelope import wire
from app.errors import DecodeError, LengthError, PrismError, TruncatedError, WireTypeError


def _fake(monkeypatch: pytest.MonkeyPatch, abi: object) -> None:
    mod = types.ModuleType("prism_native")
    mod.ABI = abi  # type: ignore[attr-defined]
    mod.__version__ = "9.9.9"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prism_native", mod)


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_prism_native_0_forces_pure_python(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    _fake(monkeypatch, native.ABI)
    monkeypatch.setenv(native.ENV, value)
    module, reason = native._load()
    assert module is None and reason.startswith("off (PRISM_NATIVE=")


def test_a_matching_module_is_used_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, native.ABI)
    monkeypatch.delenv(native.ENV, raising=False)
    module, reason = native._load()
    assert module is sys.modules["prism_native"] and reason == f"prism_native 9.9.9 (ABI {native.ABI})"


def test_a_stale_build_falls_back_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, native.ABI + 1)
    monkeypatch.delenv(native.ENV, raising=False)
    module, reason = native._load()
    assert module is None and "stale build" in reason and "make native" in reason


@pytest.mark.parametrize("abi", [4, 5, 6, 7, 8, 9, 10])
def test_an_older_build_is_stale(
        monkeypatch: pytest.MonkeyPatch, abi: int) -> None:
    """A wheel built before `DocPlan` (ABI 4) would lack the class `payload_check` builds its
    compiled check from, one built before `finish_batch` (ABI 5) a function `signing` takes at
    import, one built before `pair_copies` returned the envelope headers (ABI 6) a tuple
    `prepare_batch` would unpack wrongly, and an ABI 7 build has one of `security_span` and
    those headers but not both (two branches took 7; merged as 8), and an ABI 8 build lacks
    `murmur2`, which `app.bindings.partitioner` takes at import, and an ABI 9 build lacks
    `record_batch` and `seal_batch`, with which `app.worker.batch_send` writes the output
    batches, and an ABI 10 build lacks `record_tail`, which the size fit takes at import, and
    its `record_batch` would not read a record's tail: each is ignored, and the reason names
    both versions."""
    _fake(monkeypatch, abi)
    monkeypatch.delenv(native.ENV, raising=False)
    module, reason = native._load()
    assert native.ABI == 11
    assert module is None and f"ABI {abi} is not 11" in reason and "stale build" in reason


def test_a_missing_module_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prism_native", None)  # makes `import prism_native` raise ImportError
    monkeypatch.delenv(native.ENV, raising=False)
    module, reason = native._load()
    assert module is None and reason.startswith("not installed")


def test_status_reports_the_choice_made_at_import() -> None:
    assert native.status() == {"active": native.ACTIVE, "detail": native.reason}
    assert (wire.scan is wire._py_scan) is (not native.ACTIVE)


def _python_error(buf: bytes) -> PrismError:
    with pytest.raises(PrismError) as info:
        wire._py_scan(buf)
    return info.value


@pytest.mark.parametrize(("args", "buf", "cls"), [
    (("varint_past_end", 1, None, None, None, None), b"\x08", TruncatedError),
    (("varint_too_long", 11, None, None, None, None), b"\x08" + b"\xff" * 10, LengthError),
    (("invalid_field", 0, 0, None, None, None), b"\x00\x01", WireTypeError),
    (("length_past_end", 0, 2, None, 5, 2), b"\x12\x05ab", LengthError),
    (("fixed_past_end", 0, 1, None, None, None), b"\x09\x01\x02", TruncatedError),
    (("bad_wire_type", 0, 1, 3, None, None), b"\x0b", WireTypeError),
])
def test_each_fault_is_worded_as_the_python_walk_words_it(args: tuple[object, ...], buf: bytes,
                                                          cls: type[PrismError]) -> None:
    err = native.scan_fault(args)
    expected = _python_error(buf)
    assert type(err) is type(expected) is cls
    assert (str(err), err.path, err.hint, err.code) == (str(expected), expected.path, expected.hint, expected.code)


def test_an_unknown_fault_is_still_a_typed_error_that_says_how_to_get_around_it() -> None:
    err = native.scan_fault(("internal", 3, None, None, None, None))
    assert type(err) is DecodeError and err.path == "byte 3" and "PRISM_NATIVE=0" in str(err)
