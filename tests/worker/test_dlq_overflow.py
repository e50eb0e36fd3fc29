"""`dlq.overflow`: a truncated DLQ copy's whole value stored by reference, and replayed from it.

What this guards: a DLQ copy cut to fit its topic kept only a digest and a length, and the whole
message lived only as long as the source topic kept it (24 h by default); `prism dlq replay`
skipped such copies. Now the whole value is written - content-addressed by the SHA-256 already
in the header - before the DLQ record is built, the record names it (`prism.errors.value.ref`),
and replay reads it back, verifies the digest and the source topic's limit, and replays it whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.agents.base import Message
from app.agents.dlq import VALUE_LENGTH, VALUE_REF, VALUE_SHA256, VALUE_TRUNCATED, build_dlq_record, fit_dlq_record
from app.demo.runner import read_all
from app.errors import ConfigError, PrismError, SizeLimitError
from app.topology import load_topology
from app.worker.dlq_overflow import OverflowStore, RefRefused, RefTooLarge, build_overflow, read_ref
from app.worker.limits import MAX_REQUEST_ENV, max_request_from_env, record_size
from tests.cli.test_dlq_cli import _seed
from tests.worker.conftest import make_topology

LIMIT = 8 * 1024


def _dlq(topic: str, value: bytes, offset: int = 7) -> Any:
    msg = Message(topic=topic, partition=0, offset=offset, value=value, key=b"k-1",
                  headers=[("trace", b"t-1")], timestamp_ms=1_700_000_000_000)
    return build_dlq_record(msg, stage="normalize", stage_class="Normalize",
                            error=SizeLimitError("too big", path="value"), dlq_topic=topic + ".dlq")


def test_the_whole_value_is_stored_before_the_record_and_named_in_it(tmp_path: Path) -> None:
    store = OverflowStore(f"file://{tmp_path}/overflow")
    value = b"v" * (5 * LIMIT)
    rec = _dlq("orders", value)
    written: list[str] = []
    real_put = store.put

    def put(digest: str, data: bytes) -> str | None:
        ref = real_put(digest, data)
        written.append(ref or "")
        return ref

    fitted = fit_dlq_record(rec, LIMIT, put)
    h = dict(fitted.headers)
    digest = hashlib.sha256(value).hexdigest()
    assert h[VALUE_TRUNCATED] == b"true" and h[VALUE_SHA256] == digest.encode() and h[VALUE_LENGTH] == b"40960"
    ref = h[VALUE_REF].decode()
    assert written == [ref] and ref == f"file://{tmp_path}/overflow/sha256/{digest[:2]}/{digest}"
    assert record_size(fitted.key, fitted.value, fitted.headers) <= LIMIT  # the reference fits too
    assert read_ref(ref, digest, store) == value
    with pytest.raises(RefRefused, match=r"no dlq\.overflow store is configured"):
        read_ref(ref, digest)  # read only from the store: none given, nothing is opened
    # the same value again (a redelivery) is stored once; a value that fits needs no reference
    assert fit_dlq_record(rec, LIMIT, store.put).headers == fitted.headers and store.stored == 2
    small = _dlq("orders", b"s" * 100)
    assert fit_dlq_record(small, LIMIT, store.put) is small
    with pytest.raises(ValueError, match="not the recorded"):
        read_ref(ref, "0" * 64, store)


def test_a_reference_is_read_no_further_than_the_limit(tmp_path: Path) -> None:
    """The reference is a header anyone who writes to the DLQ topic controls: `file:///dev/zero`
    must end in a refusal after `max_bytes` + 1 bytes, not in reading until memory runs out (it
    did: `prism dlq replay --dry-run` grew to gigabytes), through the configured store too."""
    store = OverflowStore(f"file://{tmp_path}/overflow")
    for where in (None, store):  # and now not even opened: it is not in the store
        with pytest.raises(RefRefused):
            read_ref("file:///dev/zero", "0" * 64, where, max_bytes=4096)
    value = b"v" * 5000
    digest = hashlib.sha256(value).hexdigest()
    ref = store.put(digest, value)
    assert ref is not None
    with pytest.raises(RefTooLarge):
        read_ref(ref, digest, store, max_bytes=4999)
    assert read_ref(ref, digest, store, max_bytes=5000) == value  # exactly the limit is taken


def test_a_store_that_fails_leaves_digest_and_length(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from app.errors import ArchiveError

    store = OverflowStore(f"file://{tmp_path}/o")

    def refuse(rel: str, data: bytes) -> None:
        raise ArchiveError(f"cannot write {rel!r}: No space left on device")

    monkeypatch.setattr(store.store, "write_atomic", refuse)
    with caplog.at_level(logging.ERROR, logger="prism.worker"):
        fitted = fit_dlq_record(_dlq("orders", b"v" * (3 * LIMIT)), LIMIT, store.put)
    h = dict(fitted.headers)
    assert VALUE_REF not in h and VALUE_SHA256 in h and store.failed == 1
    assert "keeps only its digest and length" in caplog.text


def test_the_option_is_checked_at_start_up(tmp_path: Path, dev_keys: Any, caplog: pytest.LogCaptureFixture) -> None:
    topo = make_topology(tmp_path, dev_keys)
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        assert build_overflow(topo) is None
    assert "dlq.overflow is not set" in caplog.text and "SHA-256 and length" in caplog.text
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    for bad in ("relative/dir", "file://relative", "http://host/x", "s3://"):
        doc["dlq"] = {"overflow": {"path": bad}}
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError, match="overflow"):
            load_topology(tmp_path / "bad.yaml")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    doc["dlq"] = {"overflow": {"path": f"file://{blocker}/sub"}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"dlq\.overflow"):
        build_overflow(load_topology(tmp_path / "bad.yaml"))
    doc["dlq"] = {"overflow": {"path": f"file://{tmp_path}/ok"}}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(doc))
    store = build_overflow(load_topology(tmp_path / "ok.yaml"))
    assert store is not None and (tmp_path / "ok").is_dir()


def test_max_request_bytes_has_one_reader() -> None:
    assert max_request_from_env({}) is None
    assert max_request_from_env({MAX_REQUEST_ENV: "1048576"}) == 1048576
    for bad in ("1k", "-5", "1000"):
        with pytest.raises(ConfigError, match=MAX_REQUEST_ENV):
            max_request_from_env({MAX_REQUEST_ENV: bad})


async def test_replay_reads_the_whole_value_back(broker: Any, tmp_path: Path, dev_keys: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from app.broker.admin import ensure_topics
    from app.cli.dlq import replay

    monkeypatch.setenv(MAX_REQUEST_ENV, str(256 * 1024))  # the source topic's limit, for the too_large case
    topo = make_topology(tmp_path, dev_keys, partitions=1,
                         dlq={"overflow": {"path": f"file://{tmp_path}/overflow"}})
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    store = build_overflow(topo)
    assert store is not None
    whole = b'{"order_id": "whole", "pad": "' + b"x" * (100 * 1024) + b'"}'
    tampered = b'{"order_id": "tampered", "pad": "' + b"y" * (50 * 1024) + b'"}'
    huge = b'{"order_id": "huge", "pad": "' + b"z" * (300 * 1024) + b'"}'
    recs = [fit_dlq_record(_dlq(src, v, offset=i), LIMIT, store.put)
            for i, v in enumerate([whole, tampered, huge])]
    no_ref = fit_dlq_record(_dlq(src, b"n" * (3 * LIMIT), offset=3), LIMIT)  # written without dlq.overflow
    cut_headers = replace(recs[0], headers=[*recs[0].headers, ("prism.errors.headers.truncated", b"d")])
    t_digest = hashlib.sha256(tampered).hexdigest()
    Path(store.ref(t_digest).removeprefix("file://")).write_bytes(tampered + b"!")  # changed behind our back
    await _seed(broker.bootstrap, [*recs, no_ref, cut_headers], [0] * 5)

    report = await replay(topo, broker.bootstrap)
    by_offset = {o.dlq_offset: o for o in report.outcomes}
    assert by_offset[0].action == "replayed" and "SHA-256 verified" in by_offset[0].detail
    assert (by_offset[1].action, by_offset[1].why) == ("skipped", "ref_mismatch")
    assert (by_offset[2].action, by_offset[2].why) == ("skipped", "too_large")
    assert "262144-byte limit" in by_offset[2].detail
    assert (by_offset[3].why, by_offset[4].why) == ("truncated", "truncated")
    assert "no whole copy was stored" in by_offset[3].detail and "headers or key" in by_offset[4].detail
    out = (await read_all(broker.bootstrap, {src: 1}, expected_total=1, timeout=20))[src]
    assert [r.value for r in out] == [whole]  # the whole value, not the truncated copy
    assert out[0].key == b"k-1" and not any(k.startswith("prism.errors.") for k, _ in out[0].headers)
    again = await replay(topo, broker.bootstrap)
    assert again.skipped_by_why()["already_replayed"] == 1


# --------------------------------------------------------------------------- references from outside the store
# DLQ records written before the worker dropped producers' `prism.errors.*` headers may carry a
# forged `prism.errors.value.ref`; `read_ref` read whatever file or bucket it named (and replay
# re-produced it when the forged digest matched). Each attack below names bytes whose SHA-256 is
# the recorded one, so only the refusal stops it.

SECRET = b"outside the store: " + b"s" * 100
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / SECRET_SHA).write_bytes(SECRET)
    return outside / SECRET_SHA


def _named(store: OverflowStore, digest: str = SECRET_SHA) -> Path:
    """Where the store keeps `digest` (its directory made)."""
    path = Path(store.store.root) / store.rel(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_reference_outside_the_store_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    secret = _outside(tmp_path)
    store = OverflowStore(f"file://{tmp_path}/overflow")
    base, rel = store.base, store.rel(SECRET_SHA)
    root = store.store.root
    forged = {
        "another file": f"file://{secret}",
        "dot-dot": f"{base}/sha256/../../outside/{SECRET_SHA}",
        "dot-dot after the name": f"{base}/{rel}/../../../../outside/{SECRET_SHA}",
        "percent-encoded dot-dot": f"{base}/sha256/%2e%2e/%2e%2e/outside/{SECRET_SHA}",
        "percent-encoded slash": f"{base}%2f..%2foutside%2f{SECRET_SHA}",
        "a host": f"file://localhost{root}/{rel}",
        "a query string": f"{base}/{rel}?x=1",
        "a fragment": f"{base}/{rel}#x",
        "a longer root": f"{base}-evil/{rel}",
        "upper-case hex": f"{base}/sha256/{SECRET_SHA[:2]}/{SECRET_SHA.upper()}",
        "prefix not the digest's": f"{base}/sha256/00/{SECRET_SHA}",
        "a doubled slash": f"{base}//{rel}",
        "a plain path": str(secret),
        "another scheme": f"http://example.invalid/{SECRET_SHA}",
        "a newline": f"{base}/{rel}\nfile:///etc/passwd",
    }
    for what, ref in forged.items():
        with pytest.raises(RefRefused, match=r"is not a file of the dlq\.overflow store") as exc:
            read_ref(ref, SECRET_SHA, store)
        err = str(exc.value)
        assert "\n" not in err and "was not opened" in err and "fix: if the record is genuine, move the file" in err, what
        assert exc.value.path == "prism.errors.value.ref" and exc.value.code == "ref_refused"
        assert not store.owns(ref), what
    _named(store).write_bytes(SECRET)  # the same bytes, in the store, under their name: read
    assert read_ref(f"{base}/{rel}", SECRET_SHA, store) == SECRET and store.owns(f"{base}/{rel}")
    with pytest.raises(RefRefused, match=r"no dlq\.overflow store is configured") as exc:
        read_ref(f"file://{secret}", SECRET_SHA)
    assert "set dlq.overflow.path" in str(exc.value)


def test_a_reference_naming_another_digest_is_a_mismatch_unread(tmp_path: Path) -> None:
    store = OverflowStore(f"file://{tmp_path}/overflow")
    other = hashlib.sha256(b"other").hexdigest()
    _named(store, other).write_bytes(b"other")
    with pytest.raises(ValueError, match=f"names SHA-256 {other}, not the recorded {SECRET_SHA}"):
        read_ref(store.ref(other), SECRET_SHA, store)


def test_no_symbolic_link_below_the_root_is_followed(tmp_path: Path) -> None:
    """`realpath` then `open` could be raced; the file is opened a component at a time with
    O_NOFOLLOW instead. A link is refused wherever it is: the file itself, its directory, the
    `sha256` directory - even one that leads back inside the store (the worker writes none)."""
    secret = _outside(tmp_path)
    store = OverflowStore(f"file://{tmp_path}/overflow")
    ref, root = store.ref(SECRET_SHA), Path(store.store.root)
    named = _named(store)
    named.symlink_to(secret)
    with pytest.raises(RefRefused, match=rf"is a symbolic link \(to '{secret}'\), which is never followed"):
        read_ref(ref, SECRET_SHA, store)
    named.unlink()
    inside = root / "elsewhere"
    inside.write_bytes(SECRET)
    named.symlink_to(inside)
    with pytest.raises(RefRefused, match="symbolic link"):
        read_ref(ref, SECRET_SHA, store)
    named.unlink()
    named.parent.rmdir()
    named.parent.symlink_to(secret.parent, target_is_directory=True)  # sha256/<2 hex> -> outside/
    with pytest.raises(RefRefused, match=rf"/sha256/{SECRET_SHA[:2]} is a symbolic link"):
        read_ref(ref, SECRET_SHA, store)
    named.parent.unlink()
    (root / "sha256").rmdir()
    (tmp_path / "outside" / SECRET_SHA[:2]).mkdir()
    (tmp_path / "outside" / SECRET_SHA[:2] / SECRET_SHA).write_bytes(SECRET)
    (root / "sha256").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(RefRefused, match=r"/sha256 is a symbolic link"):
        read_ref(ref, SECRET_SHA, store)


def test_the_stores_own_root_may_be_a_link(tmp_path: Path) -> None:
    """The root is the operator's configuration, not the record's: a store configured through a
    link (/var/lib/prism -> /data/prism) reads as before."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    store = OverflowStore(f"file://{tmp_path}/link")
    ref = store.put(SECRET_SHA, SECRET)
    assert ref is not None and read_ref(ref, SECRET_SHA, store) == SECRET


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    """A FIFO under the right name is refused at once (opened non-blocking), never waited on."""
    store = OverflowStore(f"file://{tmp_path}/overflow")
    os.mkfifo(_named(store))
    with pytest.raises(RefRefused, match="not a regular file"):
        read_ref(store.ref(SECRET_SHA), SECRET_SHA, store, max_bytes=4096)
    _named(store).unlink()
    _named(store).mkdir()
    with pytest.raises(RefRefused, match="not a regular file"):
        read_ref(store.ref(SECRET_SHA), SECRET_SHA, store)
    _named(store).rmdir()
    with pytest.raises(PrismError, match=r"does not exist under the dlq\.overflow store"):
        read_ref(store.ref(SECRET_SHA), SECRET_SHA, store)


def test_an_s3_reference_must_name_the_configured_bucket_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged S3 reference named another bucket - or the store's own key with
    `?endpoint_override=` a host of the forger's choosing, where the credentials went. Each is
    refused from the string alone: nothing is contacted."""
    store = OverflowStore("s3://prism-dlq/overflow?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1",
                          writable=False)
    rel = store.rel(SECRET_SHA)
    assert store.base == "s3://prism-dlq/overflow"
    read: list[str] = []
    monkeypatch.setattr(store.store, "read", lambda r, max_bytes=None: read.append(r) or SECRET)
    for ref in (f"s3://other-bucket/overflow/{rel}", f"s3://prism-dlq/elsewhere/{rel}",
                f"s3://prism-dlq/overflow/{rel}?endpoint_override=forger.example:443",
                f"s3://prism-dlq/overflow-x/{rel}", f"s3://prism-dlq/overflow/sha256/../../x/{rel}",
                f"s3a://prism-dlq/overflow/{rel}", f"file:///prism-dlq/overflow/{rel}"):
        with pytest.raises(RefRefused, match=r"is not a file of the dlq\.overflow store s3://prism-dlq/overflow"):
            read_ref(ref, SECRET_SHA, store)
    assert read == []
    assert read_ref(f"s3://prism-dlq/overflow/{rel}", SECRET_SHA, store) == SECRET and read == [rel]
