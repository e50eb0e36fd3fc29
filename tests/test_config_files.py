"""The one reader of operators' configuration files (app/config_files.py): every file ends in a
value or the caller's typed error with the file, line and a fix - never a traceback, and never
a key silently given twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config_files import MAX_BYTES, MAX_DEPTH, MAX_VALUES, parse_config_text, read_config
from app.errors import ConfigError, KeyringError

BOMB = "\n".join([f"l0: &l0 [{', '.join(['x'] * 9)}]"]
                 + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)])


def _error(tmp_path: Path, data: bytes, name: str = "t.yaml", **kw) -> ConfigError:
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        read_config(f, what="topology file", **kw)
    return info.value


@pytest.mark.parametrize(("data", "said", "at"), [
    (b"name: x\nname: y\n", "key 'name' is given twice in this mapping", "t.yaml:2:1"),
    (b"stages:\n  - {a: 1, a: 2}\n", "key 'a' is given twice", "t.yaml:2:12"),
    (b"a: " + b"[" * 100_000 + b"]" * 100_000, f"nested deeper than {MAX_DEPTH} levels", "t.yaml:1:"),
    (b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, 80)), "nested deeper than", "t.yaml:"),
    (b"\xff\xfe bad", "is not UTF-8 text (byte 0)", "t.yaml"),
    (b"a: [1,\n", "is not valid YAML", "t.yaml:2:1"),
    (b"a: !!python/object/apply:os.system [echo]\n", "could not determine a constructor", "t.yaml:1:4"),
    (b"a:\n  b: 2001-13-01\n", "'2001-13-01' cannot be read as its type (month must be in 1..12)", "t.yaml:2:6"),
    (b"a: !!int x\n", "'x' cannot be read as its type", "t.yaml:1:4"),
    (b"a: !!int\n", "'' cannot be read as its type", "t.yaml:1:4"),
    (b"a: 1" + b"0" * 5000, "cannot be read as its type (Exceeds the limit", "t.yaml:1:4"),
    (b"a: &a [1, [2, *a]]\n", "contains itself through a YAML alias", "t.yaml"),  # was an endless walk
    (b"a: &a {b: *a}\n", "contains itself through a YAML alias", "t.yaml"),
    (BOMB.encode(), f"more than {MAX_VALUES:,} values once its YAML aliases are expanded", "t.yaml"),
])
def test_a_bad_file_is_one_config_error_with_where(tmp_path: Path, data: bytes, said: str, at: str) -> None:
    err = _error(tmp_path, data)
    assert said in err.message and err.path.startswith(str(tmp_path / at)), (err.message, err.path)
    assert err.message.startswith("topology file ") and err.hint


def test_a_missing_or_oversized_file_names_the_path_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_config(tmp_path / "none.yaml", what="users file", missing_hint="make one")
    assert info.value.message.startswith("cannot read users file") and info.value.hint == "make one"
    err = _error(tmp_path, b"#" * (MAX_BYTES + 1))
    assert "is over 4 MiB" in err.message


def test_merge_keys_and_repeated_aliases_within_bounds_are_fine() -> None:
    doc = parse_config_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: [*b, *b, [*b]]\n", what="t",
                            source="s")
    assert doc["other"] == {"x": 1, "y": 3} and doc["list"] == [{"x": 1, "y": 2}] * 2 + [[{"x": 1, "y": 2}]]


def test_json_files_are_read_strictly_by_suffix_and_yaml_otherwise(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(ConfigError, match="is not valid JSON"):
        read_config(tmp_path / "a.json", what="users file")
    with pytest.raises(ConfigError, match="given twice"):  # the same text read as YAML
        read_config(tmp_path / "a.json", what="signing keyring", by_suffix=False)
    (tmp_path / "b.json").write_text('{"keys": [1, 2]}')
    assert read_config(tmp_path / "b.json", what="k") == read_config(tmp_path / "b.json", what="k", by_suffix=False)


def test_the_error_is_the_callers_type(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_bytes(b"\x80")
    with pytest.raises(KeyringError, match="keyring file is not UTF-8"):
        read_config(tmp_path / "k.yaml", what="keyring file", error=KeyringError)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300),
                 st.lists(st.sampled_from([*"ab:- []{}&*!<>,\n\"'#|?019", "  ", "\t", "x: ", "&a ", "*a", "!!int ",
                                                                             "!!timestamp ", "2001-", "13-", "0x", "<<: ", "!!float ", "!!binary "]),
                          max_size=80).map(lambda parts: "".join(parts).encode())))
def test_arbitrary_bytes_end_in_a_value_or_a_config_error(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # read_config's own check, tested above
    try:
        parse_config_text(text, what="topology file", source="t.yaml")
    except ConfigError as exc:
        assert exc.message.startswith("topology file ") and exc.path.startswith("t.yaml")


def test_read_text_stops_one_byte_past_its_limit(tmp_path: Path) -> None:
    """`read_text` is the bounded reader for files that are not configuration (`prism schema`'s
    schema files): an endless file ends in the caller's error, not in reading until memory runs
    out; exactly the limit is taken."""
    from app.config_files import read_text

    with pytest.raises(ConfigError, match="schema file is over 1024 bytes"):
        read_text("/dev/zero", what="schema file", max_bytes=1024)
    (tmp_path / "s.proto").write_text("x" * 1024)
    assert read_text(tmp_path / "s.proto", what="schema file", max_bytes=1024) == "x" * 1024


def test_a_named_pipe_without_a_writer_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """Opening a FIFO waits for a writer: `prism topics create -t pipe.yaml` hung forever. Now a
    pipe that brings nothing within the wait is the caller's error, and one whose writer comes
    along - what `-t <(cat topology.yaml)` passes, or a writer started just after - is read."""
    import os
    import subprocess
    import sys

    from app.config_files import open_for_reading

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    script = ("import sys\nfrom app.config_files import read_config\n"
              "try:\n    read_config(sys.argv[1], what='topology file')\nexcept Exception as e:\n    print(e)\n")
    # in a child with a timeout: without the fix this open never returns
    res = subprocess.run([sys.executable, "-c", script, str(fifo)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.stdout.startswith("cannot read topology file: nothing wrote to this named pipe within 10 s"), res
    with pytest.raises(OSError, match=r"within 0\.2 s"):
        open_for_reading(fifo, pipe_wait_s=0.2)
    writer = subprocess.Popen(["sh", "-c", f"sleep 0.3; printf 'name: x\\n' > {fifo}"])
    try:
        assert read_config(fifo, what="topology file") == {"name": "x"}
    finally:
        writer.wait(timeout=30)


def test_key_lines_maps_key_paths_to_their_lines() -> None:
    """What `load_topology` names a problem's line with: each key and list item's first line;
    an aliased part is not walked again; a document the loader refuses maps to nothing."""
    from app.config_files import key_lines

    text = "name: x\nsources:\n  - topic: a\n    partitions: 4\n  - topic: b\nbase: &b {k: 1}\nuse: *b\n"
    assert key_lines(text) == {("name",): 1, ("sources",): 2, ("sources", 0): 3, ("sources", 0, "topic"): 3,
                               ("sources", 0, "partitions"): 4, ("sources", 1): 5, ("sources", 1, "topic"): 5,
                               ("base",): 6, ("base", "k"): 6, ("use",): 7}
    assert key_lines("a: [") == {} and key_lines("") == {}


def test_a_yaml_tag_says_to_remove_it(tmp_path: Path) -> None:
    """`!vault x` and `!!python/object/...`: the safe loader builds no tag; the fix said "check
    indentation and quoting", which is not what is wrong."""
    for text in ("name: !vault secret\n", "name: !!python/object/apply:os.system ['id']\n"):
        with pytest.raises(ConfigError, match="could not determine a constructor") as err:
            parse_config_text(text, what="topology file", source="t.yaml")
        assert err.value.path == "t.yaml:1:7" and (err.value.hint or "").startswith("remove the tag")
