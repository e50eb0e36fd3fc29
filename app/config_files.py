"""The one reader of the configuration files operators write: topologies, users files, JWT
settings, signing keyrings and key directories.

Why not ``yaml.safe_load(path.read_text())``, as each of them did? A configuration file is
input Prism did not write, and that call has six ways to fail that are not a `PrismError`
with the file and line:

* text that is not UTF-8 raised ``UnicodeDecodeError`` (a traceback from `prism run`);
* YAML nested a few thousand levels deep raised ``RecursionError`` in PyYAML's composer;
* a value PyYAML reads as a date or number but cannot build (``2001-13-01``) raised
  ``ValueError``;
* a key written twice was silently resolved to its last value - `name:` twice, or two
  `stages:` lists, of which the first was then never run;
* aliases can stand for far more values than the file holds (nine anchors of nine
  references each are 387 million strings), which whatever walks the value then expands, or
  for the part they stand in (`a: &a [*a]`, a list that contains itself).

`read_config` refuses each of them with the file, line and column where it can, as the
caller's own error type, and parses JSON files (``.json``) with the bounded JSON decoder
(`app.untrusted_json`). tests/test_config_files.py checks with hypothesis that arbitrary bytes
end in a value or that error, never another exception.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from .errors import ConfigError, JsonInputError, PrismError
from .untrusted_json import loads_untrusted

#: Far above any real configuration file (the largest in topologies/ is a few KiB).
MAX_BYTES = 4 * 1024 * 1024
#: Deeper than any topology or keyring (they stay under 10 levels), and far from the
#: interpreter's recursion limit, which PyYAML's composer would otherwise meet.
MAX_DEPTH = 64
#: Values a document may stand for once its aliases are expanded.
MAX_VALUES = 1_000_000


class _Refused(yaml.YAMLError):
    """A document `_BoundedLoader` will not build, with where it stopped."""

    def __init__(self, problem: str, mark: Any, hint: str) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark, self.hint = problem, mark, hint


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with a depth limit while it composes and no key twice in a mapping."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark,
                               "flatten the document; no Prism configuration needs that many levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # PyYAML's constructors raise whatever their Python raises: ValueError for `2001-13-01`,
        # `!!int x`, `0x_` or an int of more than 4,300 digits, IndexError for an empty `!!int`,
        # AttributeError for `!!timestamp x` (the last two found by tests/test_config_files.py's
        # hypothesis). A constructor only turns the document's text into a value, so anything
        # it raises but its own YAMLError means this node cannot be built: refused with its place.
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:
            raise _Refused(f"{str(node.value)[:64]!r} cannot be read as its type ({exc})"
                           if isinstance(node, yaml.ScalarNode) else f"cannot be read ({exc})", node.start_mark,
                           "quote the value to keep it a string, or correct it") from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    twice = key in seen
                except TypeError:  # an unhashable key: the constructor below refuses it
                    break
                if twice:
                    raise _Refused(f"key {str(key)[:64]!r} is given twice in this mapping", key_node.start_mark,
                                   "keep one of them: YAML would silently use the last one")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(value: Any, most: int) -> int | None:
    """How many values `value` stands for with every shared (aliased) part counted each time it
    is used, capped at `most` + 1; None when it contains itself (`a: &a [*a]`, which PyYAML
    builds as a recursive list - anything walking it would never end). Linear in the distinct
    objects: one total per object, a depth-first walk with no recursion."""
    totals: dict[int, int] = {}
    open_: set[int] = set()  # the objects whose parts are being counted: the current path
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        obj, children_done = stack.pop()
        key = id(obj)
        children = list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else (
            obj if isinstance(obj, list) else ())
        if children_done:
            open_.discard(key)
            totals[key] = min(most + 1, 1 + sum(totals[id(c)] for c in children))
            continue
        if key in totals:
            continue
        if key in open_:
            return None
        if not children:
            totals[key] = 1
            continue
        open_.add(key)
        stack.append((obj, True))
        stack.extend((c, False) for c in children if id(c) not in totals)
    return totals[id(value)]


def parse_config_text(text: str, *, what: str, source: str, json: bool = False,
                      error: type[PrismError] = ConfigError) -> Any:
    """`text` (YAML, or JSON when `json`) as a value, or `error` naming `what` and `source`
    (the file, with line and column where the parser knows them)."""
    if json:
        try:
            return loads_untrusted(text, what=what, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, reject_duplicate_keys=True)
        except JsonInputError as exc:
            raise error(f"{what} is not valid JSON: {exc.message.removeprefix('not valid JSON: ')}", path=source,
                        hint="fix the JSON there (a validator or `python -m json.tool FILE` shows where)") from None
    try:
        loader = _BoundedLoader(text)
        try:
            value = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        hint = getattr(exc, "hint", None) or (
            # `!vault x`, `!!python/object ...`: the safe loader builds no tags (never code)
            "remove the tag: configuration files take plain YAML values; quote the value if the ! is part of it"
            if problem.startswith("could not determine a constructor") else
            "check indentation and quoting at that line")
        raise error(f"{what} is not valid YAML: {problem}", path=where, hint=hint) from None
    size = _expanded_size(value, MAX_VALUES)
    if size is None:
        raise error(f"{what} contains itself through a YAML alias", path=source,
                    hint="an alias (*name) must not stand inside the part its anchor (&name) names")
    if size > MAX_VALUES:
        raise error(f"{what} stands for more than {MAX_VALUES:,} values once its YAML aliases are expanded",
                    path=source, hint="write the repeated parts out, or use fewer levels of aliases")
    return value


#: How many keys and items `key_lines` records at most (it runs on a document already parsed
#: within `MAX_VALUES`; this bounds the walk of a document whose aliases repeat large parts).
_MAX_LINES = 100_000


def key_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Where each key and list item of a YAML document starts: key path -> 1-based line, e.g.
    ``("sources", 0, "partitions") -> 17``, so a problem found in the parsed value can name the
    line it is on. For a document `parse_config_text` accepted (the same bounded loader); {}
    for one it would not. Aliased parts are not followed: a problem in one is on its anchor."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError:
        return {}
    finally:
        loader.dispose()
    out: dict[tuple[str | int, ...], int] = {}
    seen: set[int] = set()
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), root)] if root is not None else []
    while stack and len(out) < _MAX_LINES:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        children: list[tuple[tuple[str | int, ...], Any]] = []
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    children.append(((*path, key_node.value), value_node))
                    out.setdefault(children[-1][0], key_node.start_mark.line + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                children.append(((*path, i), item))
                out.setdefault((*path, i), item.start_mark.line + 1)
        stack.extend(reversed(children))  # in document order: an anchor is walked before its aliases
    return out


def read_config(path: str | Path, *, what: str, error: type[PrismError] = ConfigError,
                missing_hint: str | None = None, by_suffix: bool = True) -> Any:
    """The document in the file at `path`: JSON when it ends in ``.json`` and `by_suffix`, YAML
    otherwise (JSON is YAML too: a file that always took either keeps `by_suffix=False`). Every failure is `error` with `what` ("topology file", "users file", ...),
    the path and a fix: unreadable, over `MAX_BYTES`, not UTF-8, not valid, nested deeper than
    `MAX_DEPTH`, a key twice in a mapping, or more than `MAX_VALUES` once aliases expand."""
    p = Path(path)
    text = read_text(p, what=what, error=error, missing_hint=missing_hint)
    return parse_config_text(text, what=what, source=str(p), json=by_suffix and p.suffix.lower() == ".json",
                             error=error)


#: How long a named pipe may take to bring its first bytes (`open_for_reading`).
PIPE_WAIT_S = 10.0


def open_for_reading(path: str | Path, *, pipe_wait_s: float = PIPE_WAIT_S) -> BinaryIO:
    """`open(path, "rb")` that cannot hang on a named pipe nothing writes to.

    Why: opening a FIFO for reading waits for a writer, forever - `prism topics create -t
    pipe.yaml` or `prism envelope inspect pipe` hung without a word. It is opened without
    waiting; a pipe then has `pipe_wait_s` to bring its first bytes (or its end) - what
    `-t <(cat topology.yaml)` or a writer started next to the command does at once - or it is an
    `OSError` saying so, which each caller reports as its one error line.
    (The client distribution ships this module: where there is no `fcntl`, a plain open.)"""
    try:
        import fcntl
    except ImportError:  # Windows: no FIFOs in the file system
        return open(path, "rb")  # the caller closes it
    import select
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and not select.select([fd], [], [], pipe_wait_s)[0]:
            raise OSError(errno.ETIMEDOUT, f"nothing wrote to this named pipe within {pipe_wait_s:g} s")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | Path, *, what: str, error: type[PrismError] = ConfigError, missing_hint: str | None = None,
              max_bytes: int = MAX_BYTES, size_hint: str | None = None) -> str:
    """The UTF-8 text of a file an operator names, read no further than `max_bytes` + 1: every
    failure - unreadable, a directory, too large, not UTF-8 - is `error` with `what`, the path
    and a fix. `read_config` parses what this returns; files that are not configuration (the
    schema files `prism schema` reads) use it alone.

    Why one reader: `prism schema validate --file /dev/zero` read until memory ran out (7 GB),
    and a schema that was not UTF-8 was a `UnicodeDecodeError` traceback."""
    p = Path(path)
    try:
        with open_for_reading(p) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}", path=str(p),
                    hint=missing_hint or "check the path and its permissions") from None
    if len(data) > max_bytes:
        size = f"{max_bytes // (1024 * 1024)} MiB" if max_bytes >= 1024 * 1024 else f"{max_bytes} bytes"
        raise error(f"{what} is over {size}", path=str(p),
                    hint=size_hint or "a configuration file is a few KiB; check that the path names the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text (byte {exc.start})", path=str(p),
                    hint="save it as UTF-8") from None
