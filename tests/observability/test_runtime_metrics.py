"""What an SRE expects on every `/metrics` besides Prism's own series: `process_*` and `python_*`
of the worker and of the registry (one process, or a supervisor with workers), the archive tap's
totals, and stage latency as a per-message histogram rather than batch means."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.agents.base import Message
from app.agents.chain import STAGE_TIMING_EVERY, Chain, LatencySamples
from app.observability.archive_metrics import ArchiveCollector
from app.observability.metrics import PipelineMetrics
from app.observability.runtime_metrics import add_process_tree_collectors
from app.schema.metrics import RegistryMetrics
from app.worker.observe import CHAIN_STAGE, Observer

RUNTIME = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds",
           "process_open_fds", "python_info")


def _values(text: str) -> dict[str, float]:
    """sample name -> value (label sets summed)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_the_worker_registry_exports_process_and_python_metrics():
    values = _values(PipelineMetrics().exposition().decode())
    for name in RUNTIME:
        assert name in values, name
    assert "python_gc_objects_collected_total" in values
    assert values["process_resident_memory_bytes"] > 1e6 and values["process_start_time_seconds"] > 1e9


def test_the_registry_exports_process_and_python_metrics(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    values = _values(RegistryMetrics().exposition().decode())
    for name in RUNTIME:
        assert name in values, name


def test_several_registry_processes_are_one_process_tree(monkeypatch, tmp_path: Path):
    """`--workers N`: whichever worker answers, `process_*` is the supervisor and its children
    summed, so the series does not jump between processes from one scrape to the next."""
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        time.sleep(1.0)  # the child has its 64 MiB
        alone = CollectorRegistry()
        from app.observability.runtime_metrics import add_runtime_collectors

        add_runtime_collectors(alone)
        tree = CollectorRegistry()
        add_process_tree_collectors(tree, root_pid=os.getpid)  # this test process is the "supervisor"
        own, summed = _values(generate_latest(alone).decode()), _values(generate_latest(tree).decode())
        assert summed["process_resident_memory_bytes"] >= own["process_resident_memory_bytes"] + (60 << 20)
        assert summed["process_open_fds"] >= own["process_open_fds"]
        assert summed["process_start_time_seconds"] == own["process_start_time_seconds"]
        assert "python_gc_objects_collected_total" not in summed  # per process by nature: left out
        # and the registry's multiprocess exposition carries it
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        values = _values(RegistryMetrics().exposition().decode())
        assert "process_cpu_seconds_total" in values and "python_info" in values
    finally:
        child.kill()
        child.wait()


def test_archive_totals_are_read_from_the_sink_at_scrape_time(tmp_path: Path):
    from app.lake.archive import ArchiveSink
    from tests.lake.conftest import make_traffic

    registry = CollectorRegistry()
    sink: list[ArchiveSink] = []
    registry.register(ArchiveCollector(lambda: sink[0] if sink else None))
    text = generate_latest(registry).decode()
    assert "# TYPE prism_archive_records_total counter" in text
    assert "\nprism_archive_records_total " not in text, "no archive tap: families, but no samples"
    traffic = make_traffic(7, seed=3)
    with ArchiveSink(str(tmp_path / "archive"), writer_id="prism-worker-0") as s:
        sink.append(s)
        s.write(traffic.records)
    values = _values(generate_latest(registry).decode())
    assert values["prism_archive_records_total"] == len(traffic.records) == s.stats.records_written
    assert values["prism_archive_rolls_total"] >= 1 and values["prism_archive_bytes_total"] > 0
    assert values["prism_archive_buffered_records"] == 0


class _Sleep:
    """A stage taking a known time on some messages (its duration is what the histogram must see)."""

    def __init__(self, name: str, slow_every: int) -> None:
        self.name = name
        self.slow_every = slow_every

    def process(self, msg: Message) -> None:
        if msg.offset % self.slow_every == 0:
            time.sleep(0.02)


def test_stage_latency_is_observed_per_message_not_per_batch():
    """One batch of 64 messages, one in 8 of them 20 ms slow in the chain: a batch mean would be
    one observation of ~2.5 ms; per message, the histogram holds 64 chain observations of which
    8 are >= 20 ms, so the p99 shows the slow ones."""
    chain = Chain([_Sleep("normalize", 8)], dlq_topic_for=lambda t: t + ".dlq")
    chain.latency_samples = LatencySamples()
    obs = Observer(metrics=PipelineMetrics())
    n = 64
    observed = [(msg, chain.run(msg)) for msg in (Message(topic="t", partition=0, offset=i, value=b"x")
                                                  for i in range(n))]
    obs._count_batch(chain, "t", observed)
    samples = {(s.name, s.labels.get("stage"), s.labels.get("le")): s.value
               for fam in text_string_to_metric_families(obs.metrics.exposition().decode()) for s in fam.samples}
    assert samples[("prism_stage_latency_seconds_count", CHAIN_STAGE, None)] == n
    # messages at 0.01 s or faster: all but the 8 slow ones
    assert samples[("prism_stage_latency_seconds_bucket", CHAIN_STAGE, "0.01")] == n - n // 8
    timed = -(-n // STAGE_TIMING_EVERY)  # the chain times the stages of one message in STAGE_TIMING_EVERY
    assert samples[("prism_stage_latency_seconds_count", "normalize", None)] == timed
    assert chain.latency_samples.drain() == ([], []), "drained by the batch"


def test_a_chain_without_an_observer_keeps_no_samples():
    chain = Chain([_Sleep("normalize", 1_000_000)], dlq_topic_for=lambda t: t + ".dlq")
    for i in range(100):
        chain.run(Message(topic="t", partition=0, offset=i + 1, value=b"x"))
    assert chain.latency_samples is None and chain.stats.chain_calls == 100
