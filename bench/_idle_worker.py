"""The worker `bench_idle` runs: `prism run`'s app, with the worker consumer's fetch long poll
on Apache Kafka taken from ``BENCH_FETCH_MAX_WAIT_MS`` - so that one run can compare Prism's
bound with Faust's own 1.5 s without a product setting that exists only for a benchmark."""

from __future__ import annotations

import os
from typing import Any


def app_from_env() -> Any:
    from app.worker import offsets
    from app.worker.pipeline import app_from_env as prism_app

    offsets.KAFKA_FETCH_MAX_WAIT_MS = int(os.environ["BENCH_FETCH_MAX_WAIT_MS"])
    return prism_app()
