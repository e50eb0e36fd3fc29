"""The second worker `bench_rebalance` starts: `prism run`'s app, with Faust's own revocation when
``BENCH_REVOCATION=stock`` - so one run can compare Prism's revocation with the stock one it
replaces without a product setting that exists only for a benchmark."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

#: "prism" (the worker as shipped) or "stock" (Faust 0.15.3's `Consumer.on_partitions_revoked`)
REVOCATION_ENV = "BENCH_REVOCATION"
VARIANTS = ("prism", "stock")


def apply(variant: str) -> Callable[[], None]:
    """Make the workers of this process revoke partitions as `variant` does; returns the undo."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown revocation {variant!r}; one of {', '.join(VARIANTS)}")
    from faust.transport.drivers.aiokafka import Consumer as FaustConsumer

    from app.worker import offsets

    consumer_cls = offsets._classes()[0].Consumer  # OffsetsProbeConsumer: every broker's consumer derives from it
    shipped = consumer_cls.__dict__["on_partitions_revoked"]
    if variant == "stock":
        consumer_cls.on_partitions_revoked = FaustConsumer.on_partitions_revoked

    def undo() -> None:
        consumer_cls.on_partitions_revoked = shipped

    return undo


@contextlib.contextmanager
def revocation(variant: str) -> Iterator[None]:
    """Within the block, workers built in this process revoke partitions as `variant` does."""
    undo = apply(variant)
    try:
        yield
    finally:
        undo()


def app_from_env() -> Any:
    from app.worker.pipeline import app_from_env as prism_app

    apply(os.environ.get(REVOCATION_ENV, "prism"))  # for the process's lifetime
    return prism_app()
