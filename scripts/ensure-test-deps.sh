#!/usr/bin/env bash
# System packages the integration tests need that pip cannot provide (Debian packages):
#   chromium, chromium-driver headless browser for the schema registry UI test
#   podman, runc, debootstrap  build and run the container image (tests/deploy/test_image.py)
#   postgresql, redis-server,  the servers the integration tests start themselves, on free ports
#   nats-server                with their own data directories (tests/servers.py); none is
#                              started as a system service
#   kcat                       an independent Kafka client for the Apache Kafka tests
#   maven, a Java JDK          fetch and run Apache Kafka and Kafka Connect (scripts/fetch-kafka.sh);
#                              javac builds the Connect parity test's connector
#   protobuf-compiler          protoc, for the Rust client's generated-types currency check
#                              (clients/rust/tests/generated_current.rs)
#   librdkafka-dev, pkg-config the Rust client's `kafka` feature links the system librdkafka
#                              (tests/clients/test_rust_client.py builds it)
#   prometheus                 evaluates every Grafana dashboard query against a running worker
#                              and registry (tests/worker/test_dashboard_prometheus.py); the test
#                              starts its own on a free port, never the system service
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need+=(nats-server)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
command -v podman >/dev/null 2>&1 || need+=(podman)
[ -x /usr/sbin/runc ] || [ -x /usr/bin/runc ] || need+=(runc)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists rdkafka 2>/dev/null || need+=(librdkafka-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} (Debian packages) for the integration tests"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # Debian's postinst scripts may start system services (where an init system runs them):
  # the tests never use those, they start their own instances on free ports.
else
  echo "missing ${need[*]}: install them (Debian/Ubuntu: apt-get install ${need[*]}); the tests that need them fail under CI=true" >&2
fi
