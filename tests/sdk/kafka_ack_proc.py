"""A consumer process for tests/sdk/test_kafka_backend.py's kill -9 test (not a test module).

    python -m tests.sdk.kafka_ack_proc URL TOPIC GROUP N COMMITTED

Subscribes `GROUP` to `TOPIC`, receives `N` messages, acks the first `COMMITTED` of them and
commits (`sub.commit()`), then acks the rest - which the background commit would send only
after `commit_interval_ms` (the test's URL makes that 5 minutes) - and prints one JSON line:
the message ids of both groups. Then it waits to be killed. The test kills it with SIGKILL at
that point, between the acks and their commit: no close(), no final commit, no LeaveGroup.
"""

from __future__ import annotations

import asyncio
import json
import sys

from app.sdk import PrismClient


async def main(url: str, topic: str, group: str, n: int, committed: int) -> None:
    client = PrismClient(url, namespace="acks")
    await client.connect()
    sub = client.subscribe(topic, group=group)
    got = []
    async with asyncio.timeout(60):
        while len(got) < n:
            got += await sub.receive_batch(n - len(got), timeout=5)
    for msg in got[:committed]:
        await msg.ack()
    await sub.commit()
    for msg in got[committed:]:
        await msg.ack()
    print(json.dumps({"committed": [m.message_id for m in got[:committed]],
                      "acked": [m.message_id for m in got[committed:]]}), flush=True)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    u, t, g, count, first = sys.argv[1:6]
    asyncio.run(main(u, t, g, int(count), int(first)))
