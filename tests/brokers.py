"""The broker a worker end-to-end test runs on: the embedded one (Tansu) or Apache Kafka.

Users deploy on Kafka clusters; the embedded broker is the zero-set-up default. The tests that
prove a guarantee (no loss on kill -9, clean SIGTERM drain, rebalances, offset continuity, DLQ
replay, the demo's reconciliation) take the ``any_broker`` fixture (tests/conftest.py) and run
once on each. The embedded broker's workarounds (docs/platform-notes.md) are switched on only
for it: a worker on Kafka is started exactly as ``prism run`` starts one against a cluster,
through ``PRISM_BROKER_URL``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BrokerUnderTest:
    """What a test needs to know of the broker: where it is and which kind it is."""

    kind: str  # "embedded" | "kafka"
    bootstrap: str
    #: The PRISM_* variables that reach it (SASL/TLS for a secured Kafka listener).
    client_env: dict[str, str] = field(default_factory=dict)

    @property
    def embedded(self) -> bool:
        return self.kind == "embedded"

    def worker_env(self) -> dict[str, str]:
        """Environment for a worker subprocess (``app_from_env``): the embedded broker's
        workarounds on the embedded broker only; ``PRISM_BROKER_URL`` (and credentials) on Kafka."""
        if self.embedded:
            return {"PRISM_EMBEDDED": "1"}
        return {"PRISM_BROKER_URL": self.bootstrap, **self.client_env}
