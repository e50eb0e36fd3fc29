"""What an authenticated producer may claim: the topology's `producers:` section, compiled.

A producer's credentials prove *who* sent a message (a verified JWT) and *which key* signed
it; they say nothing about which namespace and topic the message may claim. Without this
check, a valid token for the order service could publish an envelope claiming namespace
`billing`, and every sink and lake partition downstream would file it there.

Three bindings, each checked where its evidence is known:

* source topic -> envelope topic: always on, in the normalize stage (`Source.accepted_topics`);
* principal -> namespace and source topic: `check_principal`, called by the authenticate stage
  once the token is verified (or found absent: the message is anonymous);
* signing key id -> namespace and source topic: `check_key`, called by verify_signature once the
  signature verified with that key. The keyring's own `namespaces:` scope is checked there too.

Each way to break a binding has its own DLQ reason (app/errors.py, ProducerBindingError).
Rules are unions: a principal may claim (namespace, topic) if ANY entry that names it allows
both. Principal and key are checked independently: each credential is confined to its own
grants, so a stolen token and a stolen key each reach only what their owner could.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.errors import (
    ConfigError,
    KeyNamespaceError,
    KeyTopicError,
    NamespaceNotAllowedError,
    PrincipalNotAllowedError,
    TopicNotAllowedError,
)
from app.security.signing import SigningKeyring
from app.topology import ProducerSpec, Topology

ANONYMOUS = "(anonymous)"  # how messages without a verified token are named in DLQ messages


def principal_pattern(glob: str) -> re.Pattern[str]:
    """`*` matches any run of characters (including none); everything else is literal and
    case-sensitive, like the JWT `sub` it is compared with."""
    return re.compile("".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", glob)),
                      re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Rule:
    label: str
    principals: tuple[re.Pattern[str], ...]
    anonymous: bool
    key_ids: frozenset[str]
    namespaces: frozenset[str]
    topics: frozenset[str]


def _short(value: str) -> str:
    """An untrusted claim as it may appear in an error: repr-escaped and bounded."""
    return repr(value[:120] + ("..." if len(value) > 120 else ""))


class ProducerBindings:
    """The compiled `producers:` rules of one topology. Lookups are memoized per
    (principal, namespace, topic) and (signing key, namespace, topic): producers reuse one
    identity and one key for many messages."""

    def __init__(self, specs: Sequence[ProducerSpec], source_topics: Iterable[str]) -> None:
        every = frozenset(source_topics)
        self.rules = tuple(
            _Rule(label=s.name or f"producers[{i}]",
                  principals=tuple(principal_pattern(p) for p in s.principals or ()),
                  anonymous=s.anonymous, key_ids=frozenset(s.key_ids or ()), namespaces=frozenset(s.namespaces),
                  topics=frozenset(s.topics) if s.topics is not None else every)
            for i, s in enumerate(specs))
        #: key binding is on once any entry names key_ids (otherwise only the keyring's scope applies)
        self.binds_keys = any(r.key_ids for r in self.rules)
        self._seen: dict[tuple[str | None, str, str], None] = {}
        #: (key id, namespace, topic) that `check_key` allowed: its own memo, as a key id may
        #: spell the same as a principal (successes only; the rules never change)
        self._keys_seen: dict[tuple[str, str, str], None] = {}

    @classmethod
    def from_topology(cls, topology: Topology) -> ProducerBindings | None:
        if topology.producers is None:
            return None
        return cls(topology.producers, [s.topic for s in topology.sources])

    def declared_key_ids(self) -> frozenset[str]:
        return frozenset().union(*(r.key_ids for r in self.rules))

    # ------------------------------------------------------------------ per message

    def check_principal(self, principal: str | None, namespace: str, topic: str) -> None:
        """Raise unless `principal` (None: no verified token) may claim `namespace` on source
        `topic`. Raises PrincipalNotAllowedError, NamespaceNotAllowedError or TopicNotAllowedError."""
        memo = (principal, namespace, topic)
        if memo in self._seen:
            return
        if principal is None:
            rules = [r for r in self.rules if r.anonymous]
        else:
            rules = [r for r in self.rules if any(p.fullmatch(principal) for p in r.principals)]
        who = ANONYMOUS if principal is None else f"principal {_short(principal)}"
        if not rules:
            raise PrincipalNotAllowedError(
                f"{who} is not declared in the topology's producers", path="security.publisher_id",
                hint="add an entry for it under producers: (anonymous: true for producers without a token), "
                     "or give the producer a token for a declared principal")
        _allow(rules, who, namespace, topic, path="metadata.namespace", ns_error=NamespaceNotAllowedError,
               topic_error=TopicNotAllowedError)
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[memo] = None

    def check_key(self, key_id: str, namespace: str, topic: str) -> None:
        """Raise unless the verified signing key `key_id` may sign `namespace` on source `topic`.
        A no-op while no entry names key_ids."""
        if not self.binds_keys:
            return
        memo = (key_id, namespace, topic)
        if memo in self._keys_seen:
            return
        rules = [r for r in self.rules if key_id in r.key_ids]
        who = f"signing key {_short(key_id)}"
        if not rules:
            raise KeyNamespaceError(
                f"{who} is declared for no namespace in the topology's producers (envelope claims namespace "
                f"{_short(namespace)})", path="security.signature_key_id",
                hint="list the key under the key_ids of the producers entry for that namespace, "
                     "or sign with a key declared there")
        _allow(rules, who, namespace, topic, path="security.signature_key_id", ns_error=KeyNamespaceError,
               topic_error=KeyTopicError)
        if len(self._keys_seen) > 10_000:
            self._keys_seen.clear()
        self._keys_seen[memo] = None


def _allow(rules: list[_Rule], who: str, namespace: str, topic: str, *, path: str,
           ns_error: type[KeyNamespaceError] | type[NamespaceNotAllowedError],
           topic_error: type[KeyTopicError] | type[TopicNotAllowedError]) -> None:
    for_ns = [r for r in rules if namespace in r.namespaces]
    if not for_ns:
        allowed = sorted(set().union(*(r.namespaces for r in rules)))
        raise ns_error(f"{who} may claim namespaces {allowed}, not {_short(namespace)}", path=path,
                       hint="the producer must publish under its own namespace; if it really owns this one, "
                            "add the namespace to its producers entry")
    if not any(topic in r.topics for r in for_ns):
        allowed = sorted(set().union(*(r.topics for r in for_ns)))
        raise topic_error(f"{who} may claim namespace {_short(namespace)} on source topics {allowed}, "
                          f"not on {topic!r}", path="topic",
                          hint="produce to a topic declared for it, or add the topic to its producers entry")


def check_key_ids_known(bindings: ProducerBindings | None, known: Iterable[str],
                        scope: dict[str, frozenset[str] | None], topology: Topology) -> None:
    """At start-up: every key id in producers must be in the keyring, and its keyring scope (the
    key's `namespaces:`, None = unrestricted) must leave it at least one namespace the entry
    allows - otherwise the declaration could never verify anything, which hides a typo."""
    if bindings is None or topology.producers is None:
        return
    known = frozenset(known)
    problems: list[str] = []
    for i, spec in enumerate(topology.producers):
        for kid in spec.key_ids or ():
            if kid not in known:
                problems.append(f"producers[{i}].key_ids: {kid!r} is not a key in the signing keyring "
                                f"(keys: {sorted(known)})")
                continue
            scoped = scope.get(kid)
            if scoped is not None and not scoped & set(spec.namespaces):
                problems.append(f"producers[{i}].key_ids: {kid!r} is scoped in the keyring to {sorted(scoped)}, "
                                f"none of this entry's namespaces {spec.namespaces}; it could never verify here")
    if problems:
        raise ConfigError("producers name signing keys the keyring cannot use: " + "; ".join(problems),
                          path="producers", hint="fix the key id, or the key's `namespaces:` in the keyring file")


def check_keyring_scope(keyring: SigningKeyring, key_id: str, namespace: str) -> None:
    """A key the keyring knows but scopes (`namespaces:`) to other namespaces than the one the
    envelope claims: say so, rather than "unknown key" - the key is known, the claim is not its."""
    if key_id and key_id not in keyring.keys_for(namespace).keys and key_id in keyring.verify_all.keys:
        scoped = sorted(ns for ns, keys in keyring.by_namespace.items() if key_id in keys.keys)
        raise KeyNamespaceError(f"signing key {_short(key_id)} is scoped in the keyring to {scoped}, "
                                f"not to the claimed namespace {_short(namespace)}",
                                path="security.signature_key_id",
                                hint="a key of one namespace never verifies another's messages; sign with the "
                                     "claimed namespace's key, or add the namespace to the key's `namespaces:`")


def keyring_scopes(keyring: SigningKeyring) -> dict[str, frozenset[str] | None]:
    """key id -> the namespaces the keyring scopes it to (None: unrestricted)."""
    out: dict[str, frozenset[str] | None] = {}
    for kid in keyring.verify_all.keys:
        if kid in keyring.unrestricted.keys:
            out[kid] = None
        else:
            out[kid] = frozenset(ns for ns, keys in keyring.by_namespace.items() if kid in keys.keys)
    return out
