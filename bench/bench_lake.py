"""Archive -> Delta throughput: `prism lake compact` against a plain Spark Parquet write.

    .venv/bin/python -m bench.bench_lake --n 1000000 [--rounds 2] [--master local[*]] [--json out.json]

1. Generates `--n` distinct envelopes (half reviewed, half draft layout; a third
   encrypted-looking; ~250-byte JSON payloads, half of it random; 2 namespaces x 2 topics; 4 source partitions)
   plus `--dup-rate` redeliveries, and archives them with `ArchiveSink` (timed too).
2. Starts one SparkSession, warms it up on a small slice, then in interleaved rounds (the
   machine is shared: A-then-B would let load drift bias the ratio):
   * plain  - the same decode (`mapInArrow`) + dedup, then `df.write.partitionBy(...).parquet()`:
              what a lake write costs without Delta;
   * delta  - the full compaction into a fresh Delta table (manifest planning, decode, dedup,
              anti-join, Spark Parquet write, footers -> AddActions, one delta-rs commit);
   * rerun  - the compaction again on the committed table (must find nothing to do).
3. Prints rows/s (archived rows in per second) for each, the delta/plain ratio (target
   >= 0.8) and the medians over rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from app.envelope import Layout, encode, new_envelope
from app.lake.archive import Archive, ArchiveRecord, ArchiveSink
from app.lake.schema import PARTITION_COLUMNS


def generate(n: int, dup_rate: float, seed: int = 1) -> list[ArchiveRecord]:
    rng = random.Random(seed)
    topics = [("orders", "orders.created"), ("orders", "orders.paid"),
              ("payments", "payments.settled"), ("payments", "payments.refunded")]
    offsets = [0, 0, 0, 0]
    out: list[ArchiveRecord] = []
    base_ms = int(time.time() * 1000) - 3_600_000
    recent: list[tuple[int, bytes]] = []
    for i in range(n):
        ns, topic = topics[i % 4]
        env = new_envelope(topic, {"order_id": i, "amount": rng.randint(1, 100_000), "currency": "EUR",
                                  "note": rng.randbytes(90).hex()},
                           namespace=ns, published_at_ms=base_ms + i, labels={"region": "eu" if i % 2 else "us"})
        sec = env.ensure_security()
        sec.publisher_id = f"svc-{i % 8}"
        if i % 3 == 0:
            enc = sec.encryption
            enc.key_id, enc.algorithm, enc.iv = "dek-1", "aes-256-gcm", rng.randbytes(12)
        data = encode(env, Layout.DRAFT if i % 2 else Layout.REVIEWED)
        part = i % 4
        out.append(ArchiveRecord(data, "prism.archive", part, offsets[part]))
        offsets[part] += 1
        if rng.random() < dup_rate:
            recent.append((part, data))
        if len(recent) > 50:
            p, d = recent.pop(0)
            out.append(ArchiveRecord(d, "prism.archive", p, offsets[p]))
            offsets[p] += 1
    for p, d in recent:
        out.append(ArchiveRecord(d, "prism.archive", p, offsets[p]))
        offsets[p] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="distinct envelopes (default 1M)")
    ap.add_argument("--dup-rate", type=float, default=0.1, help="share of envelopes delivered twice")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--master", default=None, help="Spark master (default local[*])")
    ap.add_argument("--workdir", default=None, help="where archive and tables go (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix="prism-bench-lake-")
    os.makedirs(work, exist_ok=True)
    archive = os.path.join(work, "archive")
    shutil.rmtree(archive, ignore_errors=True)
    res: dict[str, Any] = {"n": args.n, "dup_rate": args.dup_rate, "cpus": os.cpu_count()}

    t0 = time.perf_counter()
    records = generate(args.n, args.dup_rate)
    res["generate_s"] = round(time.perf_counter() - t0, 2)
    res["archived_rows"] = len(records)
    t0 = time.perf_counter()
    with ArchiveSink(archive, writer_id="bench") as sink:
        sink.write(records)
    res["archive_s"] = round(time.perf_counter() - t0, 2)
    res["archive_rows_per_s"] = round(len(records) / res["archive_s"])
    res["archive_files"] = sink.stats.files
    res["archive_mb"] = round(sink.stats.bytes / 1e6, 1)
    del records
    print(f"archived {res['archived_rows']} rows in {res['archive_s']} s ({res['archive_rows_per_s']}/s), "
          f"{res['archive_files']} files, {res['archive_mb']} MB", flush=True)

    from app.lake.compact import Compactor, dedup
    from app.lake.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark(args.master, app_name="prism-bench-lake")
    res["spark_start_s"] = round(time.perf_counter() - t0, 2)
    res["spark_master"] = spark.sparkContext.master
    manifests = Archive(archive).manifests("bench")

    # Warm-up: both code paths once on the smallest archive file (JIT, Python workers, imports).
    smallest = min((f for m in manifests for f in m.files), key=lambda f: f.rows)
    tiny = [dataclasses.replace(manifests[0], files=(smallest,))]
    comp = Compactor(spark, archive, os.path.join(work, "warm"))
    dedup(comp.decoded("bench", tiny)[0]).write.mode("overwrite").parquet(os.path.join(work, "warm-plain"))
    comp.run(plan=[("bench", [tiny])])

    def plain(round_no: int) -> float:
        out = os.path.join(work, f"plain-{round_no}")
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        df, _ = Compactor(spark, archive, os.path.join(work, "unused")).decoded("bench", manifests)
        dedup(df).write.mode("overwrite").partitionBy(*PARTITION_COLUMNS).parquet(out)
        return time.perf_counter() - t

    def delta(round_no: int) -> tuple[float, float, int]:
        table = os.path.join(work, f"delta-{round_no}")
        shutil.rmtree(table, ignore_errors=True)
        t = time.perf_counter()
        summary = Compactor(spark, archive, table).run()
        first = time.perf_counter() - t
        t = time.perf_counter()
        again = Compactor(spark, archive, table).run()
        rerun = time.perf_counter() - t
        assert again.batches == [], "a re-run must find nothing new"
        return first, rerun, summary.total("rows_written")

    plain_s, delta_s, rerun_s = [], [], []
    for r in range(args.rounds):
        if r % 2:  # alternate the order so that neither side always runs first
            d, rr, written = delta(r)
            p = plain(r)
        else:
            p = plain(r)
            d, rr, written = delta(r)
        plain_s.append(p)
        delta_s.append(d)
        rerun_s.append(rr)
        print(f"round {r}: plain {p:.1f} s ({res['archived_rows'] / p:,.0f} rows/s) | delta {d:.1f} s "
              f"({res['archived_rows'] / d:,.0f} rows/s, {written} rows written) | rerun {rr:.2f} s "
              f"| delta/plain {p / d:.2f}", flush=True)
        res["rows_written"] = written
    p, d = statistics.median(plain_s), statistics.median(delta_s)
    res.update({
        "plain_s": [round(x, 2) for x in plain_s], "delta_s": [round(x, 2) for x in delta_s],
        "rerun_s": [round(x, 3) for x in rerun_s],
        "plain_rows_per_s": round(res["archived_rows"] / p), "delta_rows_per_s": round(res["archived_rows"] / d),
        "delta_vs_plain": round(p / d, 3),
    })
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    spark.stop()
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
