"""Resolve a namespace's schema config ONCE at start-up into an immutable ``ResolvedSchema``.

RFC-030's key principle is zero per-message overhead: the enrich stage attaches the
``SchemaContext`` (url, version, format, hash, name, compatibility) and ``contains_pii``
from a value computed here, never from a lookup per message. Sources:

- ``registry_type: prism``     — this registry's ``/v1`` API (``registry_url``, ``subject``, ``version``)
- ``registry_type: confluent`` — any Confluent-compatible registry (``url``, ``subject``, ``version``)
- ``registry_type: git``       — a file in a git repository (local path or ``file://`` URL, no
  network) pinned by ``ref`` (tag or commit); cached with a TTL and hash-checked on every load
- ``registry_type: local``     — a plain file (``path``)

``expected_hash`` (optional) pins the content: a mismatch raises :class:`SchemaTampered`.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SchemaReferencesError
from ..untrusted_json import read_json_response
from .canonical import schema_hash
from .model import CompatibilityMode, SchemaError, SchemaFormat, schema_json
from .pii import pii_fields as compute_pii_fields
from .protoparse import WIRE_LEN, iter_wire
from .references import FetchVersion, Reference, identity_suffix, resolve_fetched

#: The registry refuses a schema over 16 MiB (app/schema/cli.py reads files with the same bound)
MAX_SCHEMA_FILE_BYTES = 16 * 1024 * 1024


class SchemaResolutionError(RuntimeError):
    """The configured schema could not be fetched or parsed (fail at start-up, not per message)."""


class SchemaTampered(SchemaResolutionError):
    """The fetched content does not hash to the pinned/previously seen value."""


class ReferencesUnresolvable(SchemaReferencesError, SchemaResolutionError):
    """The schema's references cannot be resolved (missing, cyclic, too deep or too many, or
    not parsing). Both a typed :class:`app.errors.PrismError` and a
    :class:`SchemaResolutionError`, so every caller that handles a resolution failure (the
    worker's start-up, the SDK's resolver) handles this one too."""


# _Tree: field number -> (name, deprecated, child tree for message fields or None)
_Tree = dict[int, tuple[str, bool, "dict | None"]]


@dataclass(frozen=True)
class ResolvedSchema:
    """Everything the pipeline needs about a namespace's schema, computed once."""

    url: str
    version: str
    format: SchemaFormat
    hash: str
    name: str
    compatibility: str
    pii_fields: tuple[str, ...] = ()
    deprecated_fields: tuple[str, ...] = ()
    #: the schema as the checkers read it: the registered text, or for an Avro or JSON Schema
    #: with references the self-contained text (referenced definitions inlined)
    schema_text: str = field(default="", repr=False)
    _tree: Any = field(default=None, repr=False, compare=False)
    #: protobuf with references: the referenced files by import path (transitive), what
    #: ``compile_proto(schema_text, imports=imports)`` needs
    imports: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: the references (concrete versions) the schema was resolved with
    references: tuple[Any, ...] = field(default=(), repr=False)
    #: other hashes a producer may have stamped for this schema: the hash of the text alone,
    #: which Python stamped for an Avro or JSON Schema with references before references were
    #: resolved (and which the Go client's ``registry.TextHash`` accepts)
    alternate_hashes: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def contains_pii(self) -> bool:
        return bool(self.pii_fields)

    def schema_context(self, deprecated_fields_used: list[str] | None = None) -> dict[str, Any]:
        """Field values for the envelope's ``SchemaContext`` (RFC-031 field names)."""
        return {
            "schema_url": self.url, "schema_version": self.version, "schema_format": self.format.value.lower(),
            "schema_hash": self.hash, "schema_name": self.name, "compatibility_mode": self.compatibility,
            "deprecated_fields_used": list(deprecated_fields_used or []),
        }


# ---------------------------------------------------------------------------------------------
# protobuf helpers: root message, deprecated fields, payload walk


def _proto_tree(text: str, message: str | None, imports: Mapping[str, str] | None = None
                ) -> tuple[str, _Tree, list[str]]:
    from .protoparse import compile_proto, messages_by_name

    schema = compile_proto(text, imports=imports or None)
    main = schema.main
    by_name: dict[str, Any] = messages_by_name(schema.files)
    pkg = f"{main.package}." if main.package else ""
    if message:
        root_name = message if message in by_name else pkg + message
    elif main.message_type:
        root_name = pkg + main.message_type[0].name
    else:
        raise SchemaResolutionError("protobuf schema defines no message")
    if root_name not in by_name:
        raise SchemaResolutionError(f"message {message!r} not found in schema")
    deprecated: list[str] = []
    memo: dict[str, _Tree] = {}

    def build(full: str, path: str, depth: int) -> _Tree:
        if full in memo:
            return memo[full]
        tree: _Tree = {}
        memo[full] = tree  # recursion-safe: self-references share the same dict
        for f in by_name[full].field:
            child = None
            if f.type == f.TYPE_MESSAGE and f.type_name.lstrip(".") in by_name and depth < 16:
                child = build(f.type_name.lstrip("."), f"{path}{f.name}.", depth + 1)
            if f.options.deprecated:
                deprecated.append(f"{path}{f.name}")
            tree[f.number] = (f.name, f.options.deprecated, child)
        return tree

    tree = build(root_name, "", 0)
    return root_name, tree, sorted(set(deprecated))


def deprecated_fields_used(payload: bytes | memoryview, resolved: ResolvedSchema) -> list[str]:
    """Names (dotted paths) of ``[deprecated = true]`` fields this protobuf payload actually sets.

    Walks the wire records against the tree precomputed at resolution time — no message
    class, no full decode; cost is one pass over the payload's tags. Non-protobuf schemas
    and schemas without deprecated fields return ``[]`` without touching the payload.
    """
    if resolved._tree is None or not resolved.deprecated_fields:
        return []
    found: list[str] = []
    seen: set[str] = set()

    def walk(buf: bytes | memoryview, tree: _Tree, prefix: str, depth: int) -> None:
        for number, wt, value in iter_wire(buf):
            entry = tree.get(number)
            if entry is None:
                continue
            name, deprecated, child = entry
            path = prefix + name
            if deprecated and path not in seen:
                seen.add(path)
                found.append(path)
            if child and wt == WIRE_LEN and depth < 16 and isinstance(value, memoryview):
                walk(value, child, path + ".", depth + 1)

    try:
        walk(payload, resolved._tree, "", 0)
    except ValueError:
        return found  # malformed payload: report what was seen; validation is not this function's job
    return found


# ---------------------------------------------------------------------------------------------
# sources


def _http_json(url: str, timeout: float = 10.0) -> Any:
    """GET a registry document, with the registry credentials of ``PRISM_REGISTRY_TOKEN`` or
    ``PRISM_REGISTRY_USER``/``PRISM_REGISTRY_PASSWORD`` (never from the topology file)."""
    from ..security.client_auth import client_auth_from_env

    req = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json",
                                               **client_auth_from_env("PRISM_REGISTRY")})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return read_json_response(resp, what=f"GET {url}")
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise SchemaResolutionError(
                f"GET {url} refused (HTTP {e.code}); set PRISM_REGISTRY_USER and PRISM_REGISTRY_PASSWORD "
                "(or PRISM_REGISTRY_TOKEN) to credentials with the read role") from e
        raise SchemaResolutionError(f"GET {url} failed: {e}") from e
    except Exception as e:
        raise SchemaResolutionError(f"GET {url} failed: {e}") from e


class GitSchemaSource:
    """Schemas in a git repository (local path or ``file://`` URL), pinned by tag or commit.

    Loaded texts are cached for ``ttl`` seconds per (repo, ref, path). Tamper detection: the
    first load of a pinned ref records the content hash; every later load (cache hit or
    re-read after expiry) recomputes and compares it, so a moved tag or an edited cache
    entry raises :class:`SchemaTampered` instead of silently changing the schema.
    """

    def __init__(self, ttl: float = 3600.0) -> None:
        self.ttl = ttl
        self._cache: dict[tuple[str, str, str], tuple[float, str, str, str]] = {}  # -> (t, text, hash, commit)
        self._pinned: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _repo_path(repository: str) -> str:
        if repository.startswith("file://"):
            return urllib.parse.urlsplit(repository).path
        if "://" in repository or repository.startswith("git@"):
            raise SchemaResolutionError(f"only local git repositories are supported here: {repository}")
        return repository

    @staticmethod
    def _git(repo: str, *args: str) -> str:
        try:
            return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True,
                                  timeout=30).stdout
        except subprocess.CalledProcessError as e:
            raise SchemaResolutionError(f"git {' '.join(args)} failed: {e.stderr.strip()}") from e

    def load(self, repository: str, ref: str, path: str, fmt: SchemaFormat,
             expected_hash: str | None = None) -> tuple[str, str, str]:
        """(text, hash, commit) of ``path`` at ``ref``."""
        repo = self._repo_path(repository)
        if ref.startswith("-") or path.startswith("-"):  # would be read by git as an option
            raise SchemaResolutionError(f"git ref {ref!r} / path {path!r} may not start with '-'")
        key = (repo, ref, path)
        with self._lock:
            hit = self._cache.get(key)
            if hit and time.monotonic() - hit[0] < self.ttl:
                self.hits += 1
                _, text, _h, commit = hit
            else:
                self.misses += 1
                commit = self._git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()
                text = self._git(repo, "show", f"{commit}:{path}")
                hit = None
            h = schema_hash(fmt, text)  # recomputed on every load: the cache itself is not trusted
            pinned = expected_hash or self._pinned.get(key)
            if pinned and pinned != h:
                raise SchemaTampered(f"{repository}@{ref}:{path} hashes to {h}, expected {pinned}")
            self._pinned.setdefault(key, h)
            if hit is None:
                self._cache[key] = (time.monotonic(), text, h, commit)
            return text, h, commit


_DEFAULT_GIT = GitSchemaSource()


def resolve_schema_config(config: Mapping[str, Any], *, git: GitSchemaSource | None = None) -> ResolvedSchema:
    """Fetch, parse and summarize a namespace's ``schema:`` block. Raises at start-up on any problem."""
    kind = str(config.get("registry_type", "prism")).lower()
    version = str(config.get("version", "latest"))
    compatibility = str(config.get("compatibility", "")).upper() or None
    expected = config.get("expected_hash")
    if kind in ("prism", "confluent"):
        base = str(config.get("registry_url") or config.get("url") or "").rstrip("/")
        subject = config.get("subject") or config.get("topic")
        if not base or not subject:
            raise SchemaResolutionError(f"{kind} schema config needs registry_url/url and subject")
        q = urllib.parse.quote(str(subject), safe="")
        if kind == "prism":
            v = _http_json(f"{base}/v1/subjects/{q}/versions/{urllib.parse.quote(version, safe='')}")
            text, fmt, number = v["schema"], SchemaFormat.parse(v["format"]), str(v["version"])
            fetch = _version_fetcher(f"{base}/v1/subjects/")
            label = v.get("label") or f"v{number}"
            url = f"{base}/v1/subjects/{subject}/versions/{number}"
            if compatibility is None:  # the subject's effective policy (subject -> namespace -> global),
                # the one its registrations are checked with - not only its namespace's
                compatibility = _http_json(f"{base}/v1/policies/{q}").get("compatibility", "BACKWARD")
        else:
            v = _http_json(f"{base}/subjects/{q}/versions/{urllib.parse.quote(version, safe='')}")
            text, fmt, number = v["schema"], SchemaFormat.parse(v.get("schemaType")), str(v["version"])
            fetch = _version_fetcher(f"{base}/subjects/")
            label = f"v{number}"
            url = f"{base}/subjects/{subject}/versions/{number}"
            if compatibility is None:
                compatibility = _http_json(f"{base}/config/{q}?defaultToGlobal=true").get(
                    "compatibilityLevel", "BACKWARD")
        refs = v.get("references") or None
        if refs:  # the hash covers the references too (as the registry's): resolved in build_resolved
            resolved = build_resolved(text, fmt, url=url, version=label, compatibility=compatibility or "BACKWARD",
                                      message=config.get("message"), references=refs, fetch=fetch,
                                      root=(str(subject), int(number)))
            if expected and expected not in (resolved.hash, *resolved.alternate_hashes):
                raise SchemaTampered(f"{url} hashes to {resolved.hash}, expected {expected}")
            return resolved
        h = schema_hash(fmt, text)
        if expected and expected != h:
            raise SchemaTampered(f"{url} hashes to {h}, expected {expected}")
    elif kind in ("git", "github"):
        repository = config.get("repository") or config.get("repo")
        path = config.get("path") or config.get("url")
        ref = str(config.get("ref") or config.get("tag") or config.get("commit") or config.get("branch") or "HEAD")
        if not repository or not path:
            raise SchemaResolutionError("git schema config needs repository and path")
        fmt = SchemaFormat.parse(config["format"]) if config.get("format") else SchemaFormat.from_filename(path)
        text, h, commit = (git or _DEFAULT_GIT).load(str(repository), ref, str(path), fmt, expected)
        label = version if version != "latest" else ref
        url = f"{repository}@{commit}#{path}"
    elif kind in ("local", "file"):
        path = Path(str(config.get("path") or config.get("url")))
        fmt = SchemaFormat.parse(config["format"]) if config.get("format") else SchemaFormat.from_filename(path.name)
        from ..config_files import read_text
        from ..errors import PrismError

        try:  # the one bounded reader: `path.read_text()` read a schema symlinked to /dev/zero until
            # memory ran out, and waited for ever on a named pipe
            text = read_text(path, what="schema file", error=PrismError, max_bytes=MAX_SCHEMA_FILE_BYTES,
                             size_hint="a schema is far smaller; check that the path names the schema file")
        except PrismError as e:
            raise SchemaResolutionError(f"{e.message} ({path})") from None
        h = schema_hash(fmt, text)
        if expected and expected != h:
            raise SchemaTampered(f"{path} hashes to {h}, expected {expected}")
        label, url = version, f"file://{path.resolve()}"
    else:
        raise SchemaResolutionError(f"unknown registry_type {kind!r}")
    return build_resolved(text, fmt, url=url, version=label, compatibility=compatibility or "BACKWARD",
                          message=config.get("message"), schema_hash_value=h)


def _version_fetcher(prefix: str) -> FetchVersion:
    """``fetch(subject, version)`` for :func:`resolve_fetched`: GET ``<prefix><subject>/versions/<v>``
    (``prefix`` is ``<base>/v1/subjects/`` or, Confluent, ``<base>/subjects/``)."""

    def fetch(subject: str, version: str) -> Mapping[str, Any]:
        doc = _http_json(f"{prefix}{urllib.parse.quote(subject, safe='')}/versions/"
                         f"{urllib.parse.quote(version, safe='')}")
        if not isinstance(doc, Mapping):
            raise ValueError("the registry's answer is not an object")
        return doc

    return fetch


def build_resolved(text: str, fmt: SchemaFormat | str, *, url: str, version: str, compatibility: str = "BACKWARD",
                   message: str | None = None, schema_hash_value: str | None = None,
                   references: Sequence[Mapping[str, Any]] | None = None, fetch: FetchVersion | None = None,
                   root: tuple[str, int] | None = None) -> ResolvedSchema:
    """Summarize an already-fetched schema (also used by tests and the SDK).

    ``references`` (the registry answer's Confluent references) are fetched with ``fetch``,
    transitively and bounded (:func:`app.schema.references.resolve_fetched`; ``root`` is the
    subject version ``text`` was read from), so a protobuf schema compiles with its imports and
    an Avro or JSON Schema is made self-contained. The hash is then the registry's: the text
    compiled against its references plus the reference list (``Registry._hash``), because the
    same text with other references is another schema; the hash of the text alone is kept in
    ``alternate_hashes`` (Avro, JSON Schema) for envelopes stamped before. Raises
    :class:`ReferencesUnresolvable` when the references do not resolve."""
    fmt = SchemaFormat.parse(fmt)
    imports: Mapping[str, str] = {}
    refs: tuple[Reference, ...] = ()
    alternates: tuple[str, ...] = ()
    effective = text
    if references:
        if fetch is None:
            raise ReferencesUnresolvable(f"schema at {url} has {len(references)} reference(s) and no registry to "
                                         "read them from", path="schema.references")
        got = resolve_fetched(fmt, text, references, fetch, root=root)
        effective, imports, refs = got.text, got.imports, got.references
    try:
        compatibility = CompatibilityMode.parse(compatibility).value
        if refs:
            h = schema_hash_value or schema_hash(fmt, text, imports or None, identity_suffix(refs))
            if fmt is not SchemaFormat.PROTOBUF:
                alternates = (schema_hash(fmt, text),)
        else:
            h = schema_hash_value or schema_hash(fmt, text)
        pii = tuple(compute_pii_fields(fmt, effective, imports or None))
        tree, deprecated = None, ()
        if fmt is SchemaFormat.PROTOBUF:
            name, tree, dep = _proto_tree(text, message, imports)
            deprecated = tuple(dep)
        else:
            raw = schema_json(text, f"schema at {url}")
            name = (raw.get("name") or raw.get("title") or raw.get("$id") or "") if isinstance(raw, dict) else ""
            if isinstance(raw, dict) and raw.get("namespace") and "." not in name:
                name = f"{raw['namespace']}.{name}"
    except (SchemaError, ValueError) as e:
        if refs:
            raise ReferencesUnresolvable(f"schema at {url} does not compile with its references: {e}",
                                         path="schema.references") from e
        raise SchemaResolutionError(f"schema at {url} is invalid: {e}") from e
    return ResolvedSchema(url, version, fmt, h, name, compatibility, pii, deprecated, effective, tree,
                          imports=dict(imports), references=refs, alternate_hashes=alternates)
