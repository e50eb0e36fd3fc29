"""The SparkSession the lake jobs use: the caller's, spark-submit's, or a quiet local one.

Under `spark-submit` (or any running session) the cluster's configuration wins untouched;
only when Prism starts Spark itself does it pick the settings measured to start fast and
quietly on small machines (docs/platform-notes.md, "Spark and Delta Lake"): no UI, no console
progress bars, few shuffle partitions, UTC, loopback networking, log4j at ERROR, and the
current interpreter for Python workers (so executors import the same `app` package).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# PySpark counts as a REPL: without this, Spark lowers the root level to WARN and says so.
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""

#: SQL settings every lake job needs, applied to any session (they are runtime-settable).
JOB_SQL_CONF = {
    # INT96 timestamps carry no Parquet statistics; Delta data skipping needs them.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
}


def _log4j_file() -> str:
    digest = hashlib.sha1(_LOG4J2.encode()).hexdigest()[:8]
    path = os.path.join(tempfile.gettempdir(), f"prism-spark-log4j2-{digest}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(_LOG4J2)
        os.replace(tmp, path)
    return path


def get_spark(master: str | None = None, *, app_name: str = "prism-lake",
              extra_conf: dict[str, str] | None = None) -> SparkSession:
    """Return the active session, or start one (`local[*]` unless `master` says otherwise)."""
    from pyspark.sql import SparkSession

    active = existing_session()
    if active is not None:
        _apply_job_conf(active)
        return active
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit: we own the setup
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        resolved = master or os.environ.get("PRISM_SPARK_MASTER", "local[*]")
        if resolved.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        log4j = f"-Dlog4j2.configurationFile=file:{_log4j_file()}"
        builder = (
            builder.master(resolved)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 2))))
            .config("spark.driver.extraJavaOptions", log4j)
            .config("spark.executor.extraJavaOptions", log4j)
            # Spark's SQL catalog makes an empty warehouse folder in the working directory when
            # the Delta catalog starts; the lake job keeps no catalog tables, and a pod's root
            # is read-only (deploy/base: only the lake volume and /tmp are writable).
            .config("spark.sql.warehouse.dir", os.path.join(tempfile.gettempdir(), "prism-spark-warehouse"))
        )
    elif master:
        builder = builder.master(master)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _apply_job_conf(spark)
    return spark


def existing_session() -> SparkSession | None:
    """The session already running in this process (any thread), if there is one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()  # returns the running session, changes nothing
    return active


def _apply_job_conf(spark: SparkSession) -> None:
    for key, value in JOB_SQL_CONF.items():
        spark.conf.set(key, value)


def default_parallelism(spark: SparkSession) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions", "4")))
