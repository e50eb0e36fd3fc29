"""What `/readyz` says while the Kafka cluster under a worker is (partly) down.

Why this exists: the readiness check used to ask only "is any broker connection alive?". When
one broker of three dies - kill -9 of the leader of the worker's source and output partitions -
the connections to the other two stay up, so `/readyz` said 200 all along, while the worker's
writes waited (aiokafka retries a batch for `producer_request_timeout`, 20 minutes in Faust) and
its fetches from the dead leader failed. The worker did not lose anything (the writes resume
once a new leader is elected; tests/kafka/test_broker_failures.py), but an operator saw nothing.

What is reported now, for as long as it lasts (then `/readyz` goes back to 200 by itself):

* ``writes failing: <error>`` - a write attempt failed and is being retried (`AtLeastOnce.write_all`);
* ``writes failing: a write has waited N s`` - the oldest unfinished write attempt is older than
  `WRITE_STALL_S` (aiokafka retries leader changes inside the producer, so a stalled write is
  how a lost leader usually shows), with the cause when the client's metadata names one:
* ``partition leader unavailable: <topic>[<p>]`` - no leader in the client's metadata for a
  partition the worker reads or writes;
* ``broker unreachable: <id> (<host:port>) leads <topic>[<p>]`` - the leader is known but the
  client holds no live connection to it.

The checks read the aiokafka clients' own metadata and connections (no request is sent), so a
probe costs microseconds and adds no load to a cluster that is already in trouble.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["WRITE_STALL_S", "WriteWatch", "leader_problems"]

#: A write attempt older than this is reported. A normal batch write takes milliseconds to a
#: few hundred (a busy 2-core machine); a leader election on a Kafka cluster takes seconds.
WRITE_STALL_S = 5.0


class WriteWatch:
    """The worker's write attempts in flight and the last failure, for `/readyz`.

    `AtLeastOnce.write_all` calls `begin()` before each attempt and `end(token, error)` after
    it; batches overlap (the next one writes while the previous one waits), hence tokens."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ids = itertools.count()
        self._started: dict[int, float] = {}
        #: the error of the last failed attempt, until an attempt succeeds
        self.failing: str | None = None

    def begin(self) -> int:
        token = next(self._ids)
        self._started[token] = self._clock()
        return token

    def end(self, token: int, error: BaseException | None) -> None:
        self._started.pop(token, None)
        if error is None:
            self.failing = None
        else:
            self.failing = f"{type(error).__name__}: {error}"[:200]

    def discard(self, token: int) -> None:
        """An attempt that ended without a verdict (abandoned at shutdown)."""
        self._started.pop(token, None)

    def oldest_age(self) -> float:
        """Seconds the oldest unfinished attempt has been waiting (0 when none is)."""
        if not self._started:
            return 0.0
        return max(0.0, self._clock() - min(self._started.values()))

    def problem(self, explain: Callable[[], list[str]], stall_after: float = WRITE_STALL_S) -> str | None:
        """One line for `/readyz`, or None when writes go through. `explain` names the cause
        (`leader_problems`); it is only called when there is something to explain."""
        age = self.oldest_age()
        if self.failing is None and age < stall_after:
            return None
        what = f"writes failing: {self.failing} (retrying)" if self.failing else \
            f"writes failing: a write has waited {age:.0f} s"
        causes = explain()
        return what + ("; " + "; ".join(causes[:4]) if causes else "")


def leader_problems(client: Any, partitions: Iterable[tuple[str, int]]) -> list[str]:
    """Partitions among `partitions` without a leader, or whose leader the aiokafka `client`
    cannot reach, from its cached metadata and connections; [] when it cannot tell."""
    try:
        cluster = client.cluster
        conns = dict(client._conns)
    except Exception:
        return []
    from aiokafka.client import ConnectionGroup
    from aiokafka.structs import TopicPartition

    no_leader: list[str] = []
    unreachable: dict[int, list[str]] = {}
    for topic, partition in sorted(set(partitions)):
        if cluster.partitions_for_topic(topic) is None:
            continue  # not in this client's metadata (e.g. a topic only the other client uses)
        leader = cluster.leader_for_partition(TopicPartition(topic, partition))
        if leader is None or leader < 0:
            no_leader.append(f"{topic}[{partition}]")
            continue
        conn = conns.get((leader, ConnectionGroup.DEFAULT))
        if conn is None or not conn.connected():
            unreachable.setdefault(leader, []).append(f"{topic}[{partition}]")
    out = [f"partition leader unavailable: {', '.join(no_leader[:6])}"] if no_leader else []
    for node, parts in sorted(unreachable.items()):
        meta = cluster.broker_metadata(node)
        where = f" ({meta.host}:{meta.port})" if meta is not None else " (not in the metadata)"
        out.append(f"broker unreachable: {node}{where} leads {', '.join(parts[:6])}")
    return out
