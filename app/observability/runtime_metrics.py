"""The process and runtime metrics every Prometheus client exports by default (`process_*`,
`python_*`), for the private registries Prism serves.

Why this module: the worker (`PipelineMetrics`) and the schema registry (`RegistryMetrics`)
keep their metrics in registries of their own, never prometheus_client's global one (isolation
between workers and tests). Only the global registry gets `ProcessCollector`,
`PlatformCollector` and `GCCollector` automatically, so without these collectors `/metrics`
had no CPU, memory, file descriptor or GC series: an SRE's first panel (CPU and memory per pod)
and the memory alert had nothing to read. `add_runtime_collectors` registers the three on a
private registry.

The registry with `--workers N` is one uvicorn supervisor plus N worker processes, and a scrape
is answered by whichever worker gets it. Per-process `process_*` series would then jump from one
process to another between scrapes (a counter that goes backwards reads as a reset).
`ProcessTreeCollector` instead reports the pod's server as one process: CPU seconds, memory and
open descriptors summed over the supervisor and all its children, the supervisor's start time
and descriptor limit. `python_gc_*` is per process by nature and is left out there;
`python_info` is the same in every process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

#: summed over the processes of a tree; the others come from the root process
_SUMMED = frozenset({"process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_open_fds"})


def add_runtime_collectors(registry: CollectorRegistry) -> None:
    """Register `process_*`, `python_info` and `python_gc_*` on `registry` (this process)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def add_process_tree_collectors(registry: CollectorRegistry, root_pid: Callable[[], int] = os.getppid) -> None:
    """Register `process_*` of the process tree under `root_pid()` and `python_info` on `registry`
    (several server processes answering one scrape target: module docs)."""
    registry.register(ProcessTreeCollector(root_pid))
    PlatformCollector(registry=registry)


def _children(pid: int, proc: str = "/proc") -> list[int]:
    """Direct children of `pid` (scanning /proc: `task/*/children` needs a kernel option)."""
    out = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat"), "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


class ProcessTreeCollector:
    """`process_*` for the tree rooted at `root_pid()`: the root and its direct children."""

    def __init__(self, root_pid: Callable[[], int], proc: str = "/proc") -> None:
        self.root_pid = root_pid
        self.proc = proc

    def collect(self) -> Iterable[Metric]:
        root = self.root_pid()
        pids = [root, *_children(root, self.proc)]
        values: dict[str, float] = {}
        docs: dict[str, tuple[str, str]] = {}
        for pid in pids:
            collector = ProcessCollector(registry=None, pid=lambda pid=pid: pid, proc=self.proc)
            for fam in collector.collect():
                (sample,) = fam.samples
                docs.setdefault(fam.name, (fam.documentation, fam.type))
                if fam.name in _SUMMED:
                    values[fam.name] = values.get(fam.name, 0.0) + sample.value
                elif pid == root:
                    values[fam.name] = sample.value
        for name, value in values.items():
            doc, kind = docs[name]
            if kind == "counter":
                yield CounterMetricFamily(name, doc, value=value)
            else:
                yield GaugeMetricFamily(name, doc, value=value)
