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
proceeds. ``prism run --replace-topology`` (``PRISM_REPLACE_TOPOLOGY=1``) joins anyway, with one
warning naming the digests it replaces; set it for the rollout and remove it afterwards
(docs/operations.md, "One topology per consumer group"). Restarting members of the *same*
topology never needs it. Two workers that start at the same instant into an empty group cannot
see each other; the check is a guard against the mistake, not a lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.errors import BrokerError, PrismError

if TYPE_CHECKING:
    from app.broker.admin import BrokerSettings
    from app.topology import Topology

__all__ = ["REPLACE_ENV", "TopologyMismatch", "check_group_topology", "client_id_for", "digest_of_client_id", "digest_of_member",
           "group_digests", "topology_digest"]

log = logging.getLogger("prism.worker")

#: ``prism run --replace-topology``: join a group whose members run another topology (a rollout)
REPLACE_ENV = "PRISM_REPLACE_TOPOLOGY"
DIGEST_LEN = 12
_MARK = ".topology-"
_HEX = "[0-9a-f]"
_DIGEST_IN_ID = re.compile(re.escape(_MARK) + f"({_HEX}{{{DIGEST_LEN}}})$")
#: a broker-built member id: `<client id>-<uuid4>`
_DIGEST_IN_MEMBER = re.compile(re.escape(_MARK) + f"({_HEX}{{{DIGEST_LEN}}})-{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-"
                               f"{_HEX}{{4}}-{_HEX}{{12}}$")


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


def client_id_for(group: str, digest: str) -> str:
    """The Kafka client id of a worker of ``group`` running the topology ``digest``."""
    return f"{group}{_MARK}{digest}"


def digest_of_client_id(client_id: str) -> str | None:
    """The topology digest a member's client id carries; None for a client that is not a Prism
    worker of this version (an older worker, a tool): such members are not judged."""
    m = _DIGEST_IN_ID.search(client_id or "")
    return m.group(1) if m else None


def digest_of_member(client_id: str, member_id: str) -> str | None:
    """The digest of a member as DescribeGroups lists it: from its client id, else from its member
    id, which a broker builds as ``<client id>-<uuid>`` (the embedded broker answers an empty
    client id, Apache Kafka both)."""
    found = digest_of_client_id(client_id)
    if found is None:
        m = _DIGEST_IN_MEMBER.search(member_id or "")
        found = m.group(1) if m else None
    return found


async def group_digests(bootstrap: str, group: str, *, settings: BrokerSettings | None = None,
                        timeout_s: float = 15.0) -> dict[str, str]:
    """Live member -> topology digest, for the members of ``group`` whose client id carries one.

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
    found: dict[str, str] = {}
    for response in responses:
        for g in getattr(response, "groups", ()):
            # (error_code, group_id, state, protocol_type, protocol, members[, authorized_operations])
            if g[0] != 0 or str(g[1]) != group:
                continue
            for member in g[5]:
                # (member_id, [group_instance_id,] client_id, client_host, metadata, assignment)
                member_id, client_id, client_host = str(member[0]), str(member[-4]), str(member[-3])
                digest = digest_of_member(client_id, member_id)
                if digest is not None:
                    found[f"{client_host}/{member_id}"] = digest
    return found


async def check_group_topology(bootstrap: str, group: str, digest: str, *, settings: BrokerSettings | None = None,
                               replace: bool = False, topology_path: str | None = None) -> dict[str, str]:
    """Refuse (``TopologyMismatch``) when a live member of ``group`` runs another topology.

    With ``replace`` (a rollout to a new topology version) the other members are logged once
    and the start goes on. Returns the members with another digest (empty when all agree)."""
    members = await group_digests(bootstrap, group, settings=settings)
    others = {m: d for m, d in members.items() if d != digest}
    if not others:
        return others
    theirs = sorted(set(others.values()))
    if replace:
        log.warning("prism worker replaces topology %s in group %s: %d member(s) still run it; this worker runs %s",
                    ",".join(theirs), group, len(others), digest)
        return others
    raise TopologyMismatch(
        f"consumer group {group} has {len(others)} live member(s) running topology digest {','.join(theirs)}, "
        f"this worker's topology has digest {digest}: joining would run two policies on one group",
        path=topology_path or group,
        hint="start it with the topology file the running workers use, give this topology another `name:` "
             "(its own group), or, to roll every member to this version, start it with --replace-topology "
             f"({REPLACE_ENV}=1) and restart the others")
