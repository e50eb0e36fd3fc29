#!/usr/bin/env bash
# Apache Kafka's jars, from Maven Central, for the tests that run a real Kafka (tests/kafka/).
#
#   scripts/fetch-kafka.sh [VERSION]             # default 4.4.0; 3.9.x works too
#   scripts/fetch-kafka.sh --connect [VERSION]   # Kafka Connect's worker instead (connect-libs)
#
# Why Maven and not the release tarball: Maven Central is the one Apache Kafka distribution
# point this project can rely on (the machines that run the tests reach Maven Central, not
# downloads.apache.org), and Maven verifies every artifact's published checksum (-C: a mismatch
# fails the fetch instead of warning).  A generated pom lists kafka_2.13 (the broker, KRaft, and
# kafka.tools.StorageTool, which formats the storage) and the logging binding the official
# distribution ships (log4j2 for 4.x, reload4j for 3.x) so the broker logs to a file.  The admin
# command-line tools (kafka-tools) are left out on purpose: they pull in Kafka Connect, Jetty and
# Jersey (~45 more jars) and the tests do their admin work (ACLs, SCRAM users) through the admin
# API of a Python client instead. `mvn dependency:copy-dependencies` copies the resolved jars into
#
#   ${PRISM_CACHE_DIR:-$HOME/.cache/prism}/kafka/<version>/libs
#
# with a SHA256SUMS manifest next to it.  Later runs verify the jars against the manifest
# (sha256sum -c) and fetch again if anything is missing or changed.  The Maven local repository
# lives in the same cache (kafka/m2), so nothing depends on ~/.m2.  Quiet when cached; the last
# line on stdout is always the libs path.  Concurrent runs are serialised with flock.
#
# --connect fetches Apache Kafka Connect of the same version instead, for the tests that compare
# Prism's management API with Connect's REST API (tests/kafka/connect.py): connect-runtime (the
# distributed worker, its Jetty/Jersey REST server, connect-json, connect-transforms) and the same
# logging binding, into a classpath of their own, <version>/connect-libs with
# <version>/connect-SHA256SUMS, verified the same way: the broker's classpath stays as small as it
# is.  No connector plugin: since 4.0 connect-runtime ships none, and connect-file, the usual
# stand-in, is not on Maven Central for 4.4.0 (its 4.3.1 calls a kafka-clients class 4.4.0 removed);
# the tests compile their own from tests/kafka/connect_plugin/.
set -euo pipefail

component=kafka
if [ "${1:-}" = "--connect" ]; then
  component=connect
  shift
fi
version="${1:-4.4.0}"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "fetch-kafka: version must look like 4.4.0, got ${version@Q}" >&2
  exit 2
fi
major="${version%%.*}"
if [ "$major" -lt 3 ]; then
  echo "fetch-kafka: Kafka $version has no KRaft-only broker the tests can start; use 3.9.x or 4.x" >&2
  exit 2
fi

cache="${PRISM_CACHE_DIR:-$HOME/.cache/prism}/kafka"
dest="$cache/$version"
if [ "$component" = connect ]; then
  libs="$dest/connect-libs"
  sums="$dest/connect-SHA256SUMS"
  # connect-runtime: the worker (ConnectDistributed) and its REST API.
  artifacts="connect-runtime"
  marker="connect-runtime-$version.jar"
else
  libs="$dest/libs"
  sums="$dest/SHA256SUMS"
  artifacts="kafka_2.13"
  marker="kafka_2.13-$version.jar"
fi
mkdir -p "$cache"

verified() {
  [ -s "$sums" ] && [ -d "$libs" ] || return 1
  # Every listed jar must match, and no jar may be on the classpath that the manifest does not name.
  (cd "$libs" && sha256sum --quiet --strict -c "$sums" >/dev/null 2>&1) || return 1
  [ "$(cd "$libs" && find . -maxdepth 1 -name '*.jar' | wc -l)" = "$(wc -l <"$sums")" ]
}

exec 9>"$cache/.lock"  # one lock for all versions: they share the Maven repository
flock 9

if verified; then
  printf '%s\n' "$libs"
  exit 0
fi

for tool in mvn java sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "fetch-kafka: $tool is needed (apt-get install maven openjdk-17-jdk-headless coreutils)" >&2; exit 3; }
done

if [ -e "$libs" ] || [ -e "$sums" ]; then
  # The jars may have been copied from a damaged local repository: Maven checks checksums only
  # when it downloads, so drop its repository too and download everything again under -C.
  echo "fetch-kafka: cached Kafka $component $version at $libs failed verification; fetching it again" >&2
  rm -rf "$cache/m2"
fi

if [ "$major" -ge 4 ]; then
  # Kafka 4 logs through slf4j-api 1.7 and ships log4j2 (libs/log4j-slf4j-impl, log4j-core).
  logging='
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.24.3</version></dependency>'
else
  # Kafka 3 logs through slf4j 1.7 and ships reload4j; kafka.utils.Log4jController needs org.apache.log4j.
  logging='
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>1.2.25</version></dependency>'
fi

deps=""
for artifact in $artifacts; do
  deps="$deps
    <dependency><groupId>org.apache.kafka</groupId><artifactId>$artifact</artifactId><version>$version</version></dependency>"
done

work="$(mktemp -d "$cache/.fetch-$component-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cat >"$work/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/fetch-kafka.sh: the jars of Apache Kafka $version ($component). -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>prism.tests</groupId>
  <artifactId>$component-libs</artifactId>
  <version>$version</version>
  <packaging>pom</packaging>
  <dependencies>$deps$logging
  </dependencies>
</project>
EOF

# An empty settings file: no user mirror, proxy or repository definitions leak in; Central only.
cat >"$work/settings.xml" <<'EOF'
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0"/>
EOF

echo "fetch-kafka: fetching Apache Kafka $component $version from Maven Central (checksums enforced)" >&2
if ! mvn -B -q -C -f "$work/pom.xml" -s "$work/settings.xml" \
      -Dmaven.repo.local="$cache/m2" \
      org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DoutputDirectory="$work/libs" -DincludeScope=runtime >"$work/mvn.log" 2>&1; then
  echo "fetch-kafka: Maven could not fetch Kafka $version; its output:" >&2
  tail -n 40 "$work/mvn.log" >&2
  exit 4
fi
if ! [ -f "$work/libs/$marker" ]; then
  echo "fetch-kafka: Maven finished but $marker is missing from the copy" >&2
  exit 4
fi

(cd "$work/libs" && sha256sum -- *.jar >"$work/SHA256SUMS")
rm -rf "$libs" "$sums"
mkdir -p "$dest"
mv "$work/libs" "$libs"
mv "$work/SHA256SUMS" "$sums"
verified || { echo "fetch-kafka: the fresh copy at $libs does not verify against its manifest" >&2; exit 5; }
printf '%s\n' "$libs"
