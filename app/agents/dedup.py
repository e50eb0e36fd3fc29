"""dedup: drop a message whose id was already processed inside the window.

The window lives in a RocksDB-backed Faust table with a changelog (`app.tables.dedup`),
partitioned like the source topic, so it survives restarts and rebalances. On the
embedded broker delivery is at-least-once; this stage is what turns redelivered input
into "duplicate" instead of a second output.
"""

from __future__ import annotations

import time

from app.agents.base import Message, Stage
from app.errors import DuplicateError
from app.tables.dedup import DedupWindow


class Dedup(Stage):
    name = "dedup"

    def __init__(self, window: DedupWindow) -> None:
        self.window = window

    def process(self, msg: Message) -> None:
        verdict = self.window.check(msg.env.message_id, time.time(), partition=msg.partition)
        if verdict.duplicate:
            raise DuplicateError(f"message id {msg.env.message_id} already processed", path="metadata.message_id")
