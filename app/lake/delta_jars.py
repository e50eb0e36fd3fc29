"""The Delta Lake jars for the native delta-spark writer: fetched once with Maven, then cached.

PyPI's `delta-spark` package is only the Python half; the JVM half (`io.delta:delta-spark_...`)
lives on Maven Central. `delta.configure_spark_with_delta_pip` would add it as
`spark.jars.packages`, i.e. Spark's Ivy resolves it at every session start (network round trips,
a few seconds, and it silently needs the network again when its cache expires). Here the jars
are resolved ONCE by Maven (`-C`: a checksum mismatch fails the fetch) into

    ${PRISM_CACHE_DIR:-~/.cache/prism}/delta/<artifact>-<version>-spark<spark version>/jars

with a SHA256SUMS manifest, the approach scripts/fetch-kafka.sh takes for Kafka. A later start
verifies the jars against the manifest and passes them as `spark.jars`: no network, the same jars
every time, and a machine without Maven or without Maven Central still runs from a cache copied
to it. Jars whose artifact pyspark already ships (Hadoop, Parquet, Jackson, Scala, log4j, ...) are
left out: Spark's class loader is parent-first, so a second, older copy could only shadow nothing
or, on a user-class-path-first cluster, break Spark itself.

Why the version is pinned: `configure_spark_with_delta_pip` asks for the pip package's own
version (4.4.1 here), but Maven Central has no 4.4.1 JVM release; 4.4.0 is the matching release
built against Spark 4.2 (`PRISM_DELTA_VERSION` overrides it, e.g. for a newer Delta).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.errors import LakeError

#: The Delta JVM release used with the installed pyspark (see the module docstring for why 4.4.0).
DELTA_JVM_VERSION = "4.4.0"
SCALA_BINARY = "2.13"
#: Session settings the native writer needs besides the jars (static: set before the JVM starts).
DELTA_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
_MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_JAR_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-\d[^/]*\.jar$")


class DeltaJarsUnavailable(LakeError):
    """The Delta jars are neither cached nor fetchable here (the reason says which)."""

    code = "delta_jars_unavailable"


@dataclass(frozen=True, slots=True)
class DeltaJars:
    """A verified set of jars to put on Spark's classpath for the native Delta writer."""

    coordinates: str        # io.delta:delta-spark_4.2_2.13:4.4.0
    directory: str          # the verified cache directory holding the jars
    jars: tuple[str, ...]   # absolute paths, sorted
    fetched: bool           # True when this call downloaded them (False: from the cache)
    seconds: float          # time spent verifying (and fetching)

    def spark_conf(self) -> dict[str, str]:
        """`spark.jars` plus the Delta session extension and catalog, for a session Prism starts.

        Delta rebuilds a table's snapshot with `snapshotPartitions` tasks (default 50): on a
        2-core machine the first read of a small table took 39-45 s that way and 13 s with as
        many tasks as Spark's shuffle partitions here, so a session Prism starts uses those.
        """
        return {"spark.jars": ",".join(self.jars), **DELTA_SESSION_CONF,
                "spark.databricks.delta.snapshotPartitions": str(max(4, 2 * (os.cpu_count() or 2)))}

    def describe(self) -> str:
        how = "fetched from Maven Central" if self.fetched else "cached"
        return f"{self.coordinates}, {len(self.jars)} jars {how} in {self.directory}"


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def delta_version() -> str:
    return os.environ.get("PRISM_DELTA_VERSION") or DELTA_JVM_VERSION


def coordinates(version: str | None = None, spark: str | None = None) -> str:
    """The Maven coordinates `configure_spark_with_delta_pip` uses: the artifact carries the Spark
    minor version (`delta-spark_4.2_2.13`), the version is Delta's JVM release."""
    spark_minor = ".".join((spark or spark_version()).split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_{SCALA_BINARY}:{version or delta_version()}"


def cache_root() -> Path:
    return Path(os.environ.get("PRISM_CACHE_DIR") or Path.home() / ".cache" / "prism") / "delta"


def _cache_dir(coords: str, spark: str) -> Path:
    _, artifact, version = coords.split(":")
    return cache_root() / f"{artifact}-{version}-spark{spark}"


def pyspark_artifacts() -> set[str]:
    """Artifact ids of the jars pyspark ships (`pyspark/jars/<artifact>-<version>.jar`)."""
    import pyspark

    jars_dir = Path(pyspark.__file__).parent / "jars"
    return {m["artifact"] for p in jars_dir.glob("*.jar") if (m := _JAR_ARTIFACT.match(p.name))}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified(directory: Path) -> tuple[str, ...] | None:
    """The jars when every one matches SHA256SUMS and no other jar is there; else None."""
    sums, jars = directory / "SHA256SUMS", directory / "jars"
    if not sums.is_file() or not jars.is_dir():
        return None
    listed = {}
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if not name:
            return None
        listed[name] = digest
    present = {p.name for p in jars.glob("*.jar")}
    if not listed or present != set(listed):
        return None
    if any(_sha256(jars / name) != digest for name, digest in listed.items()):
        return None
    return tuple(sorted(str(jars / name) for name in listed))


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One fetch at a time per machine (two compactions starting together share the download)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def resolve(*, fetch: bool = True, maven: str | None = None, timeout: float = 600) -> DeltaJars:
    """The verified Delta jars for the installed pyspark: from the cache, else fetched once.

    `fetch=False` only looks in the cache. Raises `DeltaJarsUnavailable` with the reason (no
    Maven, Maven Central unreachable, the version does not exist, ...) when they cannot be had.
    """
    started = time.perf_counter()
    spark = spark_version()
    coords = coordinates(spark=spark)
    directory = _cache_dir(coords, spark)
    with _locked(cache_root()):
        jars = _verified(directory)
        if jars is not None:
            return DeltaJars(coords, str(directory / "jars"), jars, False, time.perf_counter() - started)
        if not fetch:
            raise DeltaJarsUnavailable(f"the Delta jars {coords} are not in the cache {directory}",
                                       hint="run `prism lake compact` once where Maven Central is reachable")
        mvn = maven or os.environ.get("PRISM_MAVEN") or shutil.which("mvn")
        if not mvn or not (os.path.isfile(mvn) and os.access(mvn, os.X_OK)):
            raise DeltaJarsUnavailable(
                f"the Delta jars {coords} are not cached in {directory} and Maven (mvn) is not installed to fetch them",
                hint="apt-get install maven (and reach Maven Central once), or copy a verified cache directory")
        _fetch(mvn, coords, directory, timeout)
        jars = _verified(directory)
        if jars is None:
            raise DeltaJarsUnavailable(f"the freshly fetched Delta jars in {directory} do not verify")
        return DeltaJars(coords, str(directory / "jars"), jars, True, time.perf_counter() - started)


def _fetch(mvn: str, coords: str, directory: Path, timeout: float) -> None:
    group, artifact, version = coords.split(":")
    root = cache_root()
    if directory.exists():
        # Maven checks checksums only when it downloads: a damaged copy may have come from a damaged
        # local repository, so that goes too and everything is downloaded again under -C.
        shutil.rmtree(directory)
        shutil.rmtree(root / "m2", ignore_errors=True)
    shipped = pyspark_artifacts()
    # Not even downloaded: what pyspark ships (Hadoop alone is 50 MB). The copy below filters again.
    exclusions = "".join(f"\n        <exclusion><groupId>*</groupId><artifactId>{a}</artifactId></exclusion>"
                         for a in sorted(shipped))
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by app/lake/delta_jars.py: the Delta Lake jars for the native delta-spark writer. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>prism.lake</groupId>
  <artifactId>delta-jars</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
      <exclusions>{exclusions}
      </exclusions>
    </dependency>
  </dependencies>
</project>
""")
        # An empty settings file: no user mirror, proxy or repository leaks in; Central only.
        (work / "settings.xml").write_text('<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0"/>\n')
        cmd = [mvn, "-B", "-q", "-C", "-f", str(work / "pom.xml"), "-s", str(work / "settings.xml"),
               f"-Dmaven.repo.local={root / 'm2'}", f"{_MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
               f"-DoutputDirectory={work / 'out'}", "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeltaJarsUnavailable(f"Maven could not fetch the Delta jars {coords}: {exc}") from exc
        if proc.returncode != 0:
            errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln][:3]
            raise DeltaJarsUnavailable(
                f"Maven could not fetch the Delta jars {coords}: {' '.join(errors) or f'exit code {proc.returncode}'}",
                hint="check that Maven Central is reachable and the version exists (PRISM_DELTA_VERSION)")
        jars = work / "jars"
        jars.mkdir()
        for jar in sorted((work / "out").rglob("*.jar")):  # <group path>/<artifact>/<version>/<file>
            if jar.parent.parent.name not in shipped:
                shutil.copy2(jar, jars / jar.name)
        if not (jars / f"{artifact}-{version}.jar").is_file():
            raise DeltaJarsUnavailable(f"Maven finished but {artifact}-{version}.jar is missing from its copy")
        sums = "".join(f"{_sha256(j)}  {j.name}\n" for j in sorted(jars.glob("*.jar")))
        (work / "SHA256SUMS").write_text(sums)
        directory.mkdir(parents=True)
        (work / "jars").rename(directory / "jars")
        (work / "SHA256SUMS").rename(directory / "SHA256SUMS")


__all__ = ["DELTA_JVM_VERSION", "DELTA_SESSION_CONF", "DeltaJars", "DeltaJarsUnavailable", "coordinates",
           "pyspark_artifacts", "resolve"]
