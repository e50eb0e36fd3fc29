"""`make bench`: the codec and pipeline benchmarks, results in bench/results/ (see BENCHMARKS.md).
The lake, registry, SDK, sink and observability benchmarks take longer or need the local
servers; run them individually (commands in BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

from bench import bench_codec, bench_pipeline

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    bench_codec.main(["--json", str(RESULTS / "codec.json")])
    bench_pipeline.main(["--json", str(RESULTS / "pipeline.json")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
