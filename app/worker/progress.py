"""A stall is never silent: messages waiting on this worker's partitions and none processed.

Why: every known way for the pipeline to stop has its own report - a write that keeps failing
(`writes failing` in `/readyz`, app/worker/kafka_health.py), a DLQ that cannot be written
(`writes` blocked), a lost partition leader, table recovery, a paused connector. A stall
*without* a known cause showed nothing: `/healthz` and `/readyz` stayed 200, the metrics went
flat, and the broker's lag grew (seen once on Apache Kafka after a kill -9 restart, and in a
benchmark). This watch turns that state into a readiness failure and one WARNING line that
carries the diagnosis (app/worker/diagnose.py: consumer snapshot and the await chain of every
task), so the next one is both noticed and explained.

The rule, checked every second: the group's committed offsets are behind the log end on
partitions assigned to *this* worker (the broker's own numbers, `app/worker/lag.py`), no batch
has finished for `PRISM_STALL_S` seconds (default 60), and nothing already explains it
(paused, blocked, Kafka trouble, a rebalance or table recovery, shutdown). Progress - one
batch - clears it.

A stall never persists (issue 31): at the first report the worker rewinds its source
partitions to their committed offsets (`Action.RESEEK`: records a fetch dropped are read
again); if that does not bring progress within another `PRISM_STALL_S`, it exits with an
error (`Action.EXIT`, exit code 1) so that its supervisor - `prism run --processes`, a
StatefulSet - starts it afresh. Nothing is lost either way: offsets are never committed past
an unprocessed record, so the next consumer reads from there. The bound is 2 x `PRISM_STALL_S`
(120 s by default) from the last progress.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping

__all__ = ["DEFAULT_STALL_S", "ENV_STALL_S", "Action", "ProgressWatch", "stall_after_from_env"]


class Action(enum.Enum):
    """What the worker does about a stall (module docstring)."""

    NONE = "none"
    RESEEK = "reseek"  # once, when the stall is first reported
    EXIT = "exit"      # the re-seek did not help within another stall period

#: Seconds without a finished batch, while messages wait, before the worker reports a stall.
#: Far above a normal batch (milliseconds) and a rebalance (seconds), below what an operator
#: would tolerate as "silently stuck".
DEFAULT_STALL_S = 60.0
ENV_STALL_S = "PRISM_STALL_S"


def stall_after_from_env(env: Mapping[str, str] | None = None) -> float:
    """`PRISM_STALL_S` as seconds (>= 1), else the default; a bad value is a start-up error."""
    from app.errors import ConfigError

    raw = (os.environ if env is None else env).get(ENV_STALL_S, "").strip()
    if not raw:
        return DEFAULT_STALL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 1.0:  # also refuses NaN
        raise ConfigError(f"{ENV_STALL_S}={raw!r} is not a number of seconds >= 1", path=ENV_STALL_S,
                          hint=f"unset it for the default {DEFAULT_STALL_S:.0f} s, or give e.g. 120")
    return value


class ProgressWatch:
    """Decides, from what the worker counts and what the broker says, whether it is stalled."""

    def __init__(self, stall_after_s: float = DEFAULT_STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._processed = -1
        self._since = clock()
        #: the current stall's description, None while the worker makes progress
        self.stalled: str | None = None
        self._reseeked = False

    def check(self, *, processed: int, waiting: int | None, excuse: str | None) -> str | None:
        """`processed`: messages accounted so far (only grows); `waiting`: the broker's lag summed
        over the partitions this worker owns (None: unknown); `excuse`: a reason already reported
        elsewhere. Returns the stall's description, or None."""
        now = self._clock()
        if processed != self._processed or not waiting or excuse is not None:
            self._processed, self._since = processed, now
            self.stalled = None
            self._reseeked = False
            return None
        idle = now - self._since
        if idle < self.stall_after_s:
            return None
        self.stalled = (f"stalled: {waiting} message(s) wait on this worker's partitions and none was processed "
                        f"for {idle:.0f} s (no known cause: not paused, writes not failing, no rebalance)")
        return self.stalled

    def action(self) -> Action:
        """What to do about the current state (call after :meth:`check`): `RESEEK` once per stall,
        `EXIT` once the stall has lasted twice `stall_after_s`, else `NONE`."""
        if self.stalled is None:
            return Action.NONE
        if self._clock() - self._since >= 2 * self.stall_after_s:
            return Action.EXIT
        if not self._reseeked:
            self._reseeked = True
            return Action.RESEEK
        return Action.NONE
