"""One consumer group, one topology: a worker refuses to join a group whose members run another.

Why: a second worker started with a different topology file but the same ``name:`` joined the
running group silently and took partitions of it, so two policies ran on one consumer group (a
message's fate depended on which partition it landed in). Now every worker's group client id
carries a digest of its topology, and ``prism run`` reads the group's live members before it
joins: a member with another digest stops the start with one line,
``error [topology_mismatch] ...; fix: ...``.

Why the client id, and not a compacted ``<group>-topology`` topic or the assignor's userdata:

* the client id is sent in every JoinGroup and DescribeGroups returns it for each *live* member
  (the embedded broker leaves it empty but, like Kafka, starts the member id with it),
  so the answer is exactly "what the members of this group run now" - a member that stopped or
  whose session expired is gone from it, nothing has to be cleaned up, and a crashed worker's
  stale record cannot block a restart (a compacted topic would need liveness of its own);
* no change to Faust's assignor or the group protocol: the embedded broker and Apache Kafka
  answer DescribeGroups as they do for any consumer, and tools (``kafka-consumer-groups
  --describe``) show the digest to an operator too.

The digest covers the parsed topology (every key, defaults included), not the file's bytes: a
comment or a re-indented file is the same policy; the key *files* a topology names are not in it
(rotating a key is not a new policy).

Rolling to a new topology version: a deployment that updates every member would otherwise
deadlock - the first new member meets the old ones and refuses, so a StatefulSet's rollout never
proceeds. Two ways through, one for each way workers are started:

* **A controller's rolling update** (Kubernetes): each worker may carry a *rollout owner* - the
  one object its topology comes from, ``<namespace>/<StatefulSet>``, derived from the pod's
  ``controller-revision-hash`` label (``PRISM_ROLLOUT_REVISION``, downward API; the label is
  ``<StatefulSet name>-<revision hash>``) and ``metadata.namespace`` (``PRISM_ROLLOUT_NAMESPACE``),
  or given as ``PRISM_ROLLOUT_OWNER`` (a Deployment, whose ``pod-template-hash`` names no owner).
  Its 8-hex digest is appended to the client id (``<group>.topology-<digest>-<owner>``). A member
  with another topology digest but *this worker's* owner is the same StatefulSet at another
  revision - its own rolling update, in either direction (a new pod meeting old ones, or an old
  pod restarted mid-rollout meeting new ones) - and the worker joins with one warning. A member
  of another owner (a second Deployment, a copy of the manifests in another namespace or under
  another name) or of none (a worker started by hand) with another digest is still refused:
  that is the accident the check exists for. The owner is derived from the label Kubernetes
  sets, not from a literal in the manifest, so a copied manifest cannot claim the original's.
* **By hand**: ``prism run --replace-topology`` (``PRISM_REPLACE_TOPOLOGY=1``) joins anyway, with
  one warning naming the digests it replaces; set it for the rollout and remove it afterwards
  (docs/operations.md, "One topology per consumer group").

Restarting members of the *same* topology never needs either. Two workers that start at the same
instant into an empty group cannot see each other; the check is a guard against the mistake, not
a lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.errors import BrokerError, ConfigError, PrismError

if TYPE_CHECKING:
    from app.broker.admin import BrokerSettings
    from app.topology import Topology

__all__ = ["REPLACE_ENV", "Member", "TopologyMismatch", "check_group_topology", "client_id_for", "digest_of_client_id",
           "digest_of_member", "group_digests", "group_members", "judge_members", "member_of", "rollout_owner",
           "topology_digest"]

log = logging.getLogger("prism.worker")

#: ``prism run --replace-topology``: join a group whose members run another topology (a rollout)
REPLACE_ENV = "PRISM_REPLACE_TOPOLOGY"
#: the rollout owner: explicit, or derived from the pod's controller-revision-hash label and namespace
OWNER_ENV = "PRISM_ROLLOUT_OWNER"
REVISION_ENV = "PRISM_ROLLOUT_REVISION"
NAMESPACE_ENV = "PRISM_ROLLOUT_NAMESPACE"
DIGEST_LEN = 12
OWNER_LEN = 8
_MARK = ".topology-"
_HEX = "[0-9a-f]"
_IDS = f"({_HEX}{{{DIGEST_LEN}}})(?:-({_HEX}{{{OWNER_LEN}}}))?"
_DIGEST_IN_ID = re.compile(re.escape(_MARK) + _IDS + "$")
#: a broker-built member id: `<client id>-<uuid4>`
_DIGEST_IN_MEMBER = re.compile(re.escape(_MARK) + _IDS + f"-{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-"
                               f"{_HEX}{{4}}-{_HEX}{{12}}$")
#: `<controller name>-<revision hash>`: a DNS-1123 name, a dash, the hash
_REVISION = re.compile(r"^([a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?)-([a-z0-9]{1,63})$")
_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Member:
    """What a live group member says it runs: its topology digest and, when a controller started
    it, the digest of its rollout owner."""

    digest: str
    owner: str | None = None


def rollout_owner(env: Mapping[str, str] | None = None) -> str | None:
    """This worker's rollout owner (module docs) as an 8-hex digest, or None when it has none.

    ``PRISM_ROLLOUT_OWNER`` wins; else ``PRISM_ROLLOUT_REVISION`` (the StatefulSet's
    ``controller-revision-hash`` label, ``<name>-<hash>``) gives ``<namespace>/<name>`` with
    ``PRISM_ROLLOUT_NAMESPACE``. A revision that is not of that form is a ``ConfigError``: a
    worker that silently had no owner would deadlock its own rollouts."""
    env = os.environ if env is None else env
    explicit = env.get(OWNER_ENV, "").strip()
    revision = env.get(REVISION_ENV, "").strip()
    namespace = env.get(NAMESPACE_ENV, "").strip()
    if explicit:
        if len(explicit) > 512 or not explicit.isprintable():
            raise ConfigError(f"{OWNER_ENV}={explicit[:64]!r} must be 1-512 printable characters", path=OWNER_ENV,
                              hint="name the one object the topology comes from, e.g. prism/Deployment/prism-worker")
        identity = explicit
    elif revision:
        m = _REVISION.match(revision)
        if m is None:
            raise ConfigError(f"{REVISION_ENV}={revision[:80]!r} is not a controller revision (<name>-<hash>)",
                              path=REVISION_ENV,
                              hint="set it from the pod's label: fieldRef metadata.labels['controller-revision-hash'] "
                                   "(a StatefulSet; deploy/base/worker.yaml), or set PRISM_ROLLOUT_OWNER instead")
        if namespace and not _NAMESPACE.match(namespace):
            raise ConfigError(f"{NAMESPACE_ENV}={namespace[:80]!r} is not a Kubernetes namespace", path=NAMESPACE_ENV,
                              hint="set it from fieldRef metadata.namespace")
        identity = f"{namespace}/StatefulSet/{m.group(1)}"
    else:
        return None
    return hashlib.sha256(identity.encode()).hexdigest()[:OWNER_LEN]


class TopologyMismatch(PrismError):
    """Live members of the consumer group run a topology with another digest."""

    code = "topology_mismatch"


def topology_digest(topology: Topology) -> str:
    """The first 12 hex digits of SHA-256 over the topology's parsed settings (canonical JSON).

    ``base_dir`` (where the file happens to live) is left out: the same file deployed under two
    paths is the same policy."""
    doc = topology.model_dump(mode="json", by_alias=True, exclude={"base_dir"})
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LEN]


_FROM_ENV = object()


def client_id_for(group: str, digest: str, owner: str | object | None = _FROM_ENV) -> str:
    """The Kafka client id of a worker of ``group`` running the topology ``digest``, with its
    rollout owner (default: this process's, ``rollout_owner()``) when it has one."""
    who = rollout_owner() if owner is _FROM_ENV else owner
    return f"{group}{_MARK}{digest}" + (f"-{who}" if who else "")


def digest_of_client_id(client_id: str) -> str | None:
    """The topology digest a member's client id carries; None for a client that is not a Prism
    worker of this version (an older worker, a tool): such members are not judged."""
    m = _DIGEST_IN_ID.search(client_id or "")
    return m.group(1) if m else None


def member_of(client_id: str, member_id: str) -> Member | None:
    """What a member runs as DescribeGroups lists it: from its client id, else from its member
    id, which a broker builds as ``<client id>-<uuid>`` (the embedded broker answers an empty
    client id, Apache Kafka both). None for a member that is not a Prism worker."""
    m = _DIGEST_IN_ID.search(client_id or "") or _DIGEST_IN_MEMBER.search(member_id or "")
    return Member(m.group(1), m.group(2)) if m else None


def digest_of_member(client_id: str, member_id: str) -> str | None:
    """The topology digest of a member (``member_of``), or None."""
    found = member_of(client_id, member_id)
    return found.digest if found is not None else None


async def group_digests(bootstrap: str, group: str, *, settings: BrokerSettings | None = None,
                        timeout_s: float = 15.0) -> dict[str, str]:
    """Live member -> topology digest (``group_members`` without the owners)."""
    members = await group_members(bootstrap, group, settings=settings, timeout_s=timeout_s)
    return {k: m.digest for k, m in members.items()}


async def group_members(bootstrap: str, group: str, *, settings: BrokerSettings | None = None,
                        timeout_s: float = 15.0) -> dict[str, Member]:
    """Live member -> what it runs, for the members of ``group`` whose client id carries a digest.

    The member key is ``client_host/member_id`` (what an operator needs to find the process).
    A group that does not exist yet, or is empty, has none. Raises ``BrokerError`` when the
    broker cannot be asked."""
    from aiokafka.admin import AIOKafkaAdminClient

    kwargs: Mapping[str, Any] = settings.aiokafka_kwargs() if settings is not None and not settings.embedded else {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=f"{group}-topology-check",
                                request_timeout_ms=int(timeout_s * 1000), **kwargs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        while True:  # a fresh cluster answers COORDINATOR_NOT_AVAILABLE until __consumer_offsets exists
            try:
                responses = await asyncio.wait_for(admin.describe_consumer_groups([group]), timeout_s)
                break
            except Exception as exc:
                if not getattr(exc, "retriable", False) or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.5)
    except Exception as exc:  # TimeoutError included
        raise BrokerError(f"cannot describe consumer group {group!r} to compare topologies: {exc!r}",
                          path=bootstrap, hint="check that the broker is reachable and that this principal may "
                                               "Describe the group") from exc
    finally:
        await admin.close()
    found: dict[str, Member] = {}
    for response in responses:
        for g in getattr(response, "groups", ()):
            # (error_code, group_id, state, protocol_type, protocol, members[, authorized_operations])
            if g[0] != 0 or str(g[1]) != group:
                continue
            for member in g[5]:
                # (member_id, [group_instance_id,] client_id, client_host, metadata, assignment)
                member_id, client_id, client_host = str(member[0]), str(member[-4]), str(member[-3])
                seen = member_of(client_id, member_id)
                if seen is not None:
                    found[f"{client_host}/{member_id}"] = seen
    return found


def judge_members(members: Mapping[str, Member], digest: str, owner: str | None, *, replace: bool = False,
                  group: str = "", topology_path: str | None = None) -> dict[str, str]:
    """The decision of ``check_group_topology`` on the members it found (module docs): return the
    members with another digest (empty when all agree) when this worker may join - all agree,
    ``replace``, or every differing member has this worker's rollout owner (its controller's
    rolling update) - else raise ``TopologyMismatch``."""
    others = {m: seen for m, seen in members.items() if seen.digest != digest}
    if not others:
        return {}
    found = {m: seen.digest for m, seen in others.items()}
    theirs = sorted(set(found.values()))
    if replace:
        log.warning("prism worker replaces topology %s in group %s: %d member(s) still run it; this worker runs %s",
                    ",".join(theirs), group, len(others), digest)
        return found
    strangers = {m: seen for m, seen in others.items() if owner is None or seen.owner != owner}
    if not strangers:
        log.warning("prism worker joins group %s during a rolling update of its own deployment (owner %s): %d "
                    "member(s) still run topology %s, this worker runs %s", group, owner, len(others),
                    ",".join(theirs), digest)
        return found
    their_owners = sorted({s.owner or "none" for s in strangers.values()})
    why = (f"they belong to another deployment (rollout owner {','.join(their_owners)}, this worker's {owner})"
           if owner is not None else "this worker belongs to no deployment that could be rolling them")
    raise TopologyMismatch(
        f"consumer group {group} has {len(strangers)} live member(s) running topology digest "
        f"{','.join(sorted({s.digest for s in strangers.values()}))}, this worker's topology has digest {digest}, and "
        f"{why}: joining would run two policies on one group",
        path=topology_path or group,
        hint="start it with the topology file the running workers use, give this topology another `name:` "
             "(its own group), or, to roll every member to this version by hand, start it with --replace-topology "
             f"({REPLACE_ENV}=1) and restart the others (a Kubernetes StatefulSet's own rollout needs nothing: "
             f"{REVISION_ENV}, docs/operations.md)")


async def check_group_topology(bootstrap: str, group: str, digest: str, *, settings: BrokerSettings | None = None,
                               replace: bool = False, topology_path: str | None = None,
                               owner: str | object | None = _FROM_ENV) -> dict[str, str]:
    """Refuse (``TopologyMismatch``) when a live member of ``group`` runs another topology and is
    not part of this worker's own rolling update (``judge_members``).

    With ``replace`` (a rollout by hand) the other members are logged once and the start goes on.
    ``owner``: this worker's rollout owner (default: ``rollout_owner()``). Returns the members with
    another digest (empty when all agree)."""
    who = rollout_owner() if owner is _FROM_ENV else owner
    members = await group_members(bootstrap, group, settings=settings)
    return judge_members(members, digest, who if isinstance(who, str) else None, replace=replace, group=group,
                         topology_path=topology_path)
