"""Archive writer ids and shards (app/worker/archive_service.py): replicas that share an archive
location never share a writer id, and N shards archive each partition exactly once."""

from __future__ import annotations

import pytest

from app.errors import ConfigError
from app.lake.archive import _WRITER_RE, ArchiveSink
from app.worker.archive_service import default_writer_id, parse_shard, shard_partitions


def test_default_is_host_and_pid() -> None:
    assert default_writer_id(host="node-7", pid=4242, env={}) == "node-7-4242"
    assert default_writer_id(host="node-7", pid=4242, suffix="p3", env={}) == "node-7-4242-p3"


def test_two_processes_on_one_host_differ() -> None:
    ids = {default_writer_id(host="h", pid=pid, env={}) for pid in (100, 101)}
    ids |= {default_writer_id(host="h", pid=100, suffix=f"p{i}", env={}) for i in range(3)}
    assert len(ids) == 5


@pytest.mark.parametrize("host", ["", "-", "..", "a/b c", "x" * 300, "ünïcødé.example", "_lead", "ok.host-1",
                                  "\x1b[31mred", "../../etc"])
def test_any_host_name_gives_a_valid_id(host: str) -> None:
    wid = default_writer_id(host=host, pid=2_147_483_647, suffix="p1023", env={})
    assert _WRITER_RE.fullmatch(wid), wid
    assert wid.endswith("-2147483647-p1023")  # the unique part is never cut off


def test_explicit_id_wins_and_is_validated_by_the_sink(tmp_path) -> None:
    assert default_writer_id(host="h", pid=1, env={"PRISM_ARCHIVE_WRITER_ID": "pod-0"}) == "pod-0"
    with pytest.raises(Exception, match="writer_id"):
        ArchiveSink(str(tmp_path), writer_id=default_writer_id(env={"PRISM_ARCHIVE_WRITER_ID": "a/../b"}))


def test_shards_cover_every_partition_once() -> None:
    topics = {"orders.v3": 4, "payments.v3": 3}
    for n in (1, 2, 3, 5):
        parts = [tp for i in range(n) for tp in shard_partitions(topics, (i, n)) or []]
        assert sorted(parts) == sorted((t, p) for t, c in topics.items() for p in range(c))
    assert shard_partitions(topics, None) is None
    assert shard_partitions({"t": 2}, (2, 3)) == []  # more shards than partitions: an idle one


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "1/0", "1/2/3", "99999/100000", " / "])
def test_bad_shard_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"i/n with 0 <= i < n"):
        parse_shard(text)


def test_shard_parsing() -> None:
    assert parse_shard(None) is None and parse_shard("  ") is None
    assert parse_shard("0/1") == (0, 1) and parse_shard(" 2 / 3 ") == (2, 3)
