"""Child process for tests/lake/test_delta_spark.py: ONE Spark session with the Delta jars (a JVM
start with them costs 15-20 s on the test machines, and the test session's own Spark has no jars
and cannot get them after its start), in which `prism lake compact` runs once per job given as
JSON argv. Prints one JSON line: per job its exit code, stdout and stderr. Not a test module."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from app.lake.cli import lake_app
from app.lake.delta_jars import resolve
from app.lake.spark import get_spark

if __name__ == "__main__":
    jobs: list[list[str]] = json.loads(sys.argv[1])
    spark = get_spark("local[2]", app_name="prism-lake-delta-child", extra_conf=resolve().spark_conf())
    results = []
    for args in jobs:
        res = CliRunner().invoke(lake_app, args)
        results.append({"args": args, "exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
                        "exception": repr(res.exception) if res.exception and res.exit_code not in (0, 3) else None})
    spark.stop()
    print(json.dumps(results), flush=True)
