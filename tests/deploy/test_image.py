"""The container image (Dockerfile, scripts/build-image.sh) built and run for real with podman.

Why: the image is what an operator deploys; these tests prove that the image the repository
builds starts a worker that reaches ``/readyz`` against a real broker, serves the schema
registry, runs as a non-root user and carries no compiler. The build reuses podman's layer
cache, so after the first (cold, minutes) build a run takes well under a minute.

Needs podman + runc (Debian packages; ``make test`` installs them as root) and root or an
existing base image for the debootstrap step; under CI=true a missing tool fails the test.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from app.broker.embedded import EmbeddedBroker, find_free_port
from tests import servers
from tests.support import require

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("PRISM_IMAGE", "localhost/prism:latest")
LAKE_IMAGE = os.environ.get("PRISM_LAKE_IMAGE", "localhost/prism-lake:latest")
BASE_IMAGE = os.environ.get("BASE_IMAGE", "localhost/prism-base:bookworm")
#: Global podman flags: crun cannot set up cgroups on these hosts, runc + cgroupfs can.
PODMAN = ["podman", *shlex.split(os.environ.get("PRISM_PODMAN_ARGS", "--runtime runc --cgroup-manager cgroupfs"))]
#: Containers inherit the host's (huge) rlimits unless told; runc then refuses to set them.
RUN_FLAGS = ["--network", "host", "--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
BUILD_TIMEOUT = 1800  # a cold build (debootstrap + every wheel) takes minutes; cached, seconds
READY_TIMEOUT = 120.0


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")


def _podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def image() -> str:
    """Build (or reuse from cache) the worker image with the repository's own build script."""
    require(_which("podman") is not None and _which("runc") is not None,
            "podman and runc (Debian: apt-get install podman runc; `make test` installs them as root)")
    has_base = subprocess.run([*PODMAN, "image", "exists", BASE_IMAGE], capture_output=True).returncode == 0
    require(has_base or BASE_IMAGE != "localhost/prism-base:bookworm" or os.geteuid() == 0,
            f"root, to debootstrap the base image {BASE_IMAGE} (or build it once: sudo scripts/build-base-image.sh)")
    started = time.monotonic()
    proc = subprocess.run(["bash", "scripts/build-image.sh", "worker"], cwd=ROOT, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, env={**os.environ, "PRISM_IMAGE": IMAGE})
    assert proc.returncode == 0, f"scripts/build-image.sh worker failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    print(f"image {IMAGE} built in {time.monotonic() - started:.0f}s")
    return IMAGE


def uid_of_image(image: str) -> str:
    return _podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip().split(":")[0]


@pytest.fixture(scope="module")
def lake_image(image: str) -> str:
    """The `lake` target (the worker image + a JRE), built after the worker image it extends."""
    proc = subprocess.run(["bash", "scripts/build-image.sh", "lake"], cwd=ROOT, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, env={**os.environ, "PRISM_LAKE_IMAGE": LAKE_IMAGE})
    assert proc.returncode == 0, f"scripts/build-image.sh lake failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return LAKE_IMAGE


@pytest.fixture
def container_name() -> Iterator[str]:
    """A unique container name, removed (with the container) whatever the test did."""
    name = f"prism-test-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "5", name], capture_output=True, timeout=60)
        subprocess.run([*PODMAN, "volume", "rm", "--force", f"{name}-var"], capture_output=True, timeout=60)


def _wait_for(name: str, url: str, ready: Callable[[int, bytes], bool], what: str) -> bytes:
    """Poll ``url`` until ``ready(status, body)``; fail early with the logs if the container died."""
    deadline = time.monotonic() + READY_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            status, body = _get(url)
            if ready(status, body):
                return body
            last = f"HTTP {status}: {body[:300]!r}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        state = _podman("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip()
        if state != "true":
            logs = _podman("logs", name, check=False)
            pytest.fail(f"{what}: container {name} exited before it was ready:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
        time.sleep(0.5)
    logs = _podman("logs", name, check=False)
    pytest.fail(f"{what} not ready in {READY_TIMEOUT}s (last: {last}):\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}")


@pytest.mark.timeout(BUILD_TIMEOUT + 300)
def test_worker_from_image_becomes_ready_non_root_without_compiler(
        image: str, broker: EmbeddedBroker, container_name: str) -> None:
    port = find_free_port()
    volume = f"{container_name}-var"  # /srv/prism/var: the keys (and tables), as in docker-compose.yml
    # A worker never makes its own keys: without them it refuses to start and names `prism keys init`.
    refused = _podman("run", "--rm", *RUN_FLAGS, "--volume", f"{volume}:/srv/prism/var",
                      "--env", f"PRISM_BROKER_URL={broker.bootstrap}",
                      image, "run", "--topology", "topologies/orders-created.yaml", check=False)
    assert refused.returncode == 2 and "error [no_keys]" in refused.stderr and "prism keys init" in refused.stderr, \
        refused.stdout + refused.stderr
    made = _podman("run", "--rm", *RUN_FLAGS, "--volume", f"{volume}:/srv/prism/var", image, "keys", "init",
                   check=False)
    assert made.returncode == 0 and "reads these files already" in made.stdout, made.stdout + made.stderr
    _podman("run", "--detach", "--name", container_name, *RUN_FLAGS, "--volume", f"{volume}:/srv/prism/var",
            "--env", f"PRISM_BROKER_URL={broker.bootstrap}",
            image, "run", "--topology", "topologies/orders-created.yaml", "--web-port", str(port))

    body = _wait_for(container_name, f"http://127.0.0.1:{port}/readyz",
                     lambda status, body: status == 200 and json.loads(body).get("status") == "ok", "worker /readyz")
    checks = json.loads(body)["checks"]
    assert checks["broker"]["ok"] and checks["assignment"]["partitions"] > 0, checks

    # docker-compose.yml's healthcheck for this service works inside the image (python on PATH, exit 0 when ready).
    probe = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["prism"]["healthcheck"]["test"]
    assert probe[0] == "CMD", probe
    argv = [arg.replace("127.0.0.1:6066/", f"127.0.0.1:{port}/") for arg in probe[1:]]
    assert _podman("exec", container_name, *argv, check=False).returncode == 0, f"compose healthcheck {argv} failed"
    # /srv/prism/var (compose's volume) belongs to the non-root user.
    owner = _podman("exec", container_name, "stat", "-c", "%u", "/srv/prism/var").stdout.strip()
    assert owner == uid_of_image(image), f"/srv/prism/var owned by {owner}"

    # The embedded broker (the worker's default without PRISM_BROKER_URL) ships in the image, with
    # setpriv, which ties the broker's life to the worker's.
    found = _podman("exec", container_name, "python", "-c",
                    "import os, shutil; from app.broker.embedded import resolve_broker_binary as r; "
                    "b = r(); print(os.access(b, os.X_OK), bool(shutil.which('setpriv')))").stdout.split()
    assert found == ["True", "True"], found

    # PID 1 is the prism process; it and the image's configured user must not be root.
    uid = _podman("exec", container_name, "stat", "-c", "%u", "/proc/1").stdout.strip()
    assert uid.isdigit() and uid != "0", f"the worker runs as uid {uid!r}"
    user = _podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user and user.split(":")[0] not in ("", "0", "root"), f"image user is {user!r}"
    # The entrypoint is prism itself (so `podman run IMAGE schema serve ...` works).
    entrypoint = _podman("image", "inspect", "--format", "{{json .Config.Entrypoint}}", image).stdout
    assert json.loads(entrypoint) == ["prism"]

    # The builder stage's compilers stay in the builder stage.
    found = _podman("exec", container_name, "sh", "-c",
                    "command -v gcc cc c++ g++ make; ls /usr/bin/gcc* /usr/bin/x86_64-linux-gnu-gcc* 2>/dev/null; "
                    "dpkg-query -W -f='${Status} ${Package}\\n' gcc gcc-12 cpp cpp-12 g++ libc6-dev python3-dev 2>/dev/null"
                    " | grep '^install ok' || true",
                    check=False).stdout.strip()
    assert found == "", f"the runtime image carries build tools: {found}"

    # `podman stop` / a Kubernetes rollout sends SIGTERM to PID 1: the worker stops cleanly (exit 0)
    # well before the grace period ends in a SIGKILL (exit 137).
    _podman("stop", "--time", "60", container_name, timeout=90)
    state = _podman("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
    assert state == "0", f"the worker exited with {state} on SIGTERM:\n{_podman('logs', container_name).stderr[-2000:]}"


@pytest.fixture(params=["sqlite", "postgres"])
def registry_store(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The registry's store: the default SQLite file in the image's working directory, and the
    PostgreSQL store docker-compose.yml uses (a fresh schema on the local server, dropped after)."""
    if request.param == "sqlite":
        yield []
        return
    import psycopg

    from app.schema.store import PostgresStore

    try:
        with psycopg.connect(servers.pg_dsn(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        require(False, f"PostgreSQL at {servers.pg_dsn()} (PRISM_TEST_PG_DSN): {exc}")
    schema = f"prism_image_test_{uuid.uuid4().hex[:10]}"
    try:
        yield ["--store", f"{servers.pg_dsn()}?schema={schema}"]
    finally:
        store = PostgresStore(servers.pg_dsn(), pg_schema=schema)
        store.drop()
        store.close()


@pytest.mark.timeout(BUILD_TIMEOUT + 300)
def test_registry_from_image_stores_and_serves_a_schema(image: str, container_name: str,
                                                        registry_store: list[str]) -> None:
    port = find_free_port()
    _podman("run", "--detach", "--name", container_name, *RUN_FLAGS,
            image, "schema", "serve", "--host", "127.0.0.1", "--port", str(port), *registry_store,
            "--allow-anonymous", "write")  # explicit, for this test only: the image serves and stores
    base = f"http://127.0.0.1:{port}"
    _wait_for(container_name, f"{base}/schemas/types", lambda status, _body: status == 200, "registry")

    # A write proves the store is writable by the non-root user (SQLite file) or reachable (PostgreSQL).
    schema = json.dumps({"type": "object", "properties": {"id": {"type": "string"}}})
    req = urllib.request.Request(f"{base}/subjects/image-test-value/versions", method="POST",
                                 data=json.dumps({"schemaType": "JSON", "schema": schema}).encode(),
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        assert isinstance(json.loads(resp.read())["id"], int)
    status, body = _get(f"{base}/subjects/image-test-value/versions/latest")
    assert status == 200 and json.loads(body)["version"] == 1, body


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 600)
def test_lake_job_from_lake_image_compacts_an_archive(lake_image: str, container_name: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from app.lake.archive import ArchiveSink
    from tests.lake.conftest import make_traffic

    traffic = make_traffic(120, dup_every=10)
    with ArchiveSink(str(tmp_path / "archive"), writer_id="w1", max_file_bytes=40_000) as sink:
        sink.write(traffic.records)
    for path in [tmp_path, *tmp_path.rglob("*")]:  # the container's non-root user writes the table
        path.chmod(0o777 if path.is_dir() else 0o666)

    proc = _podman("run", "--name", container_name, *RUN_FLAGS, "--volume", f"{tmp_path}:/lake",
                   lake_image, "lake", "compact", "/lake/archive", "/lake/table", "--json", timeout=600, check=False)
    assert proc.returncode == 0, f"lake compact in {lake_image} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout)
    assert sum(b["rows_written"] for b in report["batches"]) == len(traffic.ids), report
    ids = DeltaTable(str(tmp_path / "table")).to_pyarrow_table(columns=["message_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted(traffic.ids)
