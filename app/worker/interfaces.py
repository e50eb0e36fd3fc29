"""The typed seams between the worker's parts, so that dependencies point one way.

    pipeline (composition) --> batch_runner --> delivery (at_least_once | exactly_once)
         |                          \\--> size_fit, worker_state
         \\--> observe --> management
                   \\           \\
                    `--> interfaces <--'   (this module: protocols only, no worker imports)

`observe` and `management` read the running worker through `PipelineView` and the observer
through `ObserverView`; the worker tells its observer about batches through `BatchObserver`.
None of them imports `app.worker.pipeline` (they used to import each other in a circle, held
apart only by function-local and TYPE_CHECKING imports). `tests/worker/test_worker_imports.py`
checks that no import - top-level, function-local or TYPE_CHECKING - closes a circle again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import faust

    from app.agents.base import Message
    from app.agents.chain import Chain, Result
    from app.agents.publish import Publisher
    from app.observability.health import HealthState
    from app.topology import Topology
    from app.worker.continuity import HoleFetcher


@dataclass
class RunStats:
    """What the worker did, per outcome; the demo's summary and the tests read it."""

    read: int = 0
    emitted: int = 0
    written: Counter[str] = field(default_factory=Counter)  # per output topic
    publish_retries: int = 0
    sequence: Counter[str] = field(default_factory=Counter)
    #: source records the consumer skipped and the agent fetched itself (app/worker/continuity.py)
    holes_repaired: int = 0
    #: messages dead-lettered as `too_large` (input over the input limit or outputs over theirs)
    too_large: int = 0
    #: DLQ copies cut down to their topic's size limit
    dlq_truncated: int = 0
    #: batches abandoned unacknowledged at shutdown (read again on restart)
    abandoned_batches: int = 0
    #: writes sent again one record per batch after the broker refused a batch for its size
    batches_split: int = 0
    #: exactly_once transactions aborted for a size refusal and run again (split, fresh limits)
    size_retried_transactions: int = 0


class PipelineView(Protocol):
    """What the observer and the management API read of a running pipeline worker."""

    @property
    def topology(self) -> Topology: ...

    @property
    def app(self) -> faust.App: ...

    @property
    def stats(self) -> RunStats: ...

    @property
    def chains(self) -> dict[str, Chain]: ...

    @property
    def archive(self) -> Any: ...

    @property
    def hole_fetcher(self) -> HoleFetcher: ...

    @property
    def publisher(self) -> Publisher: ...

    def kafka_problem(self) -> str | None: ...

    def source_problems(self) -> list[str]: ...


class BatchObserver(Protocol):
    """What the worker tells its observer, once per batch (the hot path) and on blocking."""

    @property
    def paused(self) -> set[str]: ...

    def batch_started(self) -> None: ...

    def batch_done(self, chain: Chain, topic: str, observed: list[tuple[Message, Result]]) -> None: ...

    def batch_finished(self) -> None: ...

    def count_batches(self, chain: Chain, topic: str, observed: list[tuple[Message, Result]]) -> None: ...

    def batch_abandoned(self) -> None: ...

    def set_blocked(self, reason: str | None) -> None: ...


class ObserverView(Protocol):
    """What the management API reads and changes of the observer (app/worker/management.py)."""

    @property
    def pipeline(self) -> PipelineView | None: ...

    @property
    def health(self) -> HealthState: ...

    @property
    def paused(self) -> set[str]: ...

    @property
    def batches(self) -> int: ...

    @property
    def in_flight(self) -> int: ...

    def partition_status(self) -> list[dict[str, Any]]: ...

    def group_lag(self) -> dict[str, Any] | None: ...

    def table_sizes(self) -> dict[str, int]: ...

    async def wait_idle(self, timeout: float | None = None) -> bool: ...


__all__ = ["BatchObserver", "ObserverView", "PipelineView", "RunStats"]
