"""A real Apache Kafka for the tests: KRaft brokers as JVM processes, started and stopped by the tests.

Why: the default test broker is the embedded Kafka-protocol broker (Tansu), which starts in well
under a second but is not Apache Kafka.  Behaviour that only a real Kafka has - replication and
leader election, ``acks=all`` with ``min.insync.replicas``, SASL/SCRAM, mutual TLS, ACLs enforced
by ``StandardAuthorizer`` - needs the real thing.  There is no Docker here, so Kafka runs from its
jars: ``scripts/fetch-kafka.sh`` resolves them from Maven Central (checksums verified, cached under
``${PRISM_CACHE_DIR:-~/.cache/prism}/kafka/<version>/libs``), and :class:`ApacheKafka` formats the
storage with ``kafka.tools.StorageTool`` and runs ``java -cp 'libs/*' kafka.Kafka server.properties``
per node.

Usage::

    with ApacheKafka(fetch_kafka(), tmp_path) as kafka:          # one combined broker+controller
        producer = AIOKafkaProducer(**aiokafka_kwargs(kafka.client_config()))

    ApacheKafka(libs, tmp_path, nodes=3)                              # 3-voter quorum, RF 3, min ISR 2
    ApacheKafka(libs, tmp_path, listeners=("SASL_SSL", "SSL"), acls=True)   # SCRAM + mTLS + ACLs

Every node listens on free loopback ports and keeps its data, ``server.properties`` and
``server.log`` (the broker's own log) in its own directory.  Readiness is polled (metadata
requests), never slept for.  A process is never left behind: :meth:`ApacheKafka.stop` sends
SIGTERM, then SIGKILL after a bound; an ``atexit`` hook kills whatever is still running when the
interpreter exits; and each JVM is started through ``setpriv --pdeathsig KILL`` so the kernel
kills it if the test process itself dies by SIGKILL (the signal follows the *thread* that started
the JVM: start clusters from the main thread, as pytest fixtures do).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = REPO_ROOT / "scripts" / "fetch-kafka.sh"

#: The Kafka the tests run by default (the newest 4.x release on Maven Central).
DEFAULT_VERSION = os.environ.get("PRISM_KAFKA_VERSION", "4.4.0")
#: The older line the smoke test keeps working (the last 3.x, still widely deployed).
LEGACY_VERSION = os.environ.get("PRISM_KAFKA_LEGACY_VERSION", "3.9.1")

#: The one SASL mechanism the SASL_SSL listener offers.
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The principal (certificate CN) brokers and controllers use among themselves; a super user.
BROKER_PRINCIPAL = "kafka-broker"
#: The administrative user: a SCRAM user and a client-certificate CN; a super user.
ADMIN_USER = "admin"
#: SCRAM users created at format time (name -> password) unless the caller passes its own.
DEFAULT_USERS: Mapping[str, str] = {ADMIN_USER: "admin-secret-1", "alice": "alice-secret-1", "bob": "bob-secret-1"}

Protocol = Literal["PLAINTEXT", "SSL", "SASL_SSL"]
_PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_SSL")

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaUnavailable(Exception):
    """Java or Kafka's jars cannot be had on this machine (fixtures skip, or fail under CI=true)."""


class KafkaStartError(RuntimeError):
    """A node did not start or did not become ready; the message carries the tail of its logs."""


class ClientConfig(TypedDict, total=False):
    """How a client reaches one listener; only the keys that listener needs are present.

    Plain data (paths, not SSL contexts) so that every client can be configured from it:
    :func:`aiokafka_kwargs`, :func:`librdkafka_config` (confluent-kafka), :func:`kcat_args`,
    :func:`prism_env` (the worker's ``PRISM_*`` variables).
    """

    bootstrap_servers: str  # "127.0.0.1:PORT,127.0.0.1:PORT,..."
    security_protocol: str  # PLAINTEXT | SSL | SASL_SSL
    sasl_mechanism: str  # SCRAM-SHA-512 (SASL_SSL only)
    sasl_username: str
    sasl_password: str
    ssl_cafile: str  # PEM CA that signed the brokers' certificate (SSL, SASL_SSL)
    ssl_certfile: str  # PEM client certificate (SSL: mutual TLS)
    ssl_keyfile: str  # PEM PKCS#8 key of ssl_certfile


# --------------------------------------------------------------------------- Java and the jars

_libs_cache: dict[str, Path] = {}
_libs_lock = threading.Lock()


def java_binary() -> str | None:
    """The ``java`` to run Kafka with: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def fetch_kafka(version: str = DEFAULT_VERSION) -> Path:
    """The verified libs directory of Kafka ``version``, fetched once per process.

    Runs ``scripts/fetch-kafka.sh`` (which checks the cache against its SHA256SUMS manifest and
    re-fetches from Maven Central if needed).  Raises :class:`KafkaUnavailable` with the
    script's own explanation when Java, Maven or the network is missing.
    """
    with _libs_lock:
        if version in _libs_cache:
            return _libs_cache[version]
        if java_binary() is None:
            raise KafkaUnavailable("Apache Kafka tests need Java 17+ (apt-get install openjdk-17-jre-headless)")
        if shutil.which("bash") is None:
            raise KafkaUnavailable("scripts/fetch-kafka.sh needs bash")
        libs = run_fetch_script([version], f"Apache Kafka {version}", f"kafka_2.13-{version}.jar", "kafka_2.13")
        _libs_cache[version] = libs
        return libs


def run_fetch_script(args: Sequence[str], what: str, jar: str, jar_kind: str) -> Path:
    """Run ``scripts/fetch-kafka.sh args``; the directory it prints last, which must hold ``jar``.
    :class:`KafkaUnavailable` with the script's reason when it fails or takes over 15 minutes."""
    shown = " ".join(args)
    try:
        proc = subprocess.run(["bash", str(FETCH_SCRIPT), *args], capture_output=True, text=True,
                              timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KafkaUnavailable(f"fetching {what} took over {exc.timeout:.0f} s") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise KafkaUnavailable(f"scripts/fetch-kafka.sh {shown} failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
    libs = Path(lines[-1])
    if not (libs / jar).is_file():
        raise KafkaUnavailable(f"scripts/fetch-kafka.sh {shown} printed {libs}, which has no {jar_kind} jar")
    return libs


def kafka_version(libs: Path) -> str:
    """The Kafka version whose jars are in ``libs`` (from the kafka_2.13-<version>.jar name)."""
    for jar in libs.glob("kafka_2.13-*.jar"):
        match = re.fullmatch(r"kafka_2\.13-(\d+\.\d+\.\d+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise KafkaUnavailable(f"{libs} holds no kafka_2.13-<version>.jar")


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertFiles:
    """One certificate as PEM files, in the shapes both Kafka and Python clients read."""

    name: str
    cert: Path  # the certificate chain, leaf first
    key: Path  # the unencrypted PKCS#8 private key
    keystore: Path  # key + chain in one file: Kafka's ``ssl.keystore.type=PEM``


class CertificateAuthority:
    """A throw-away CA that issues the brokers' and clients' certificates (``cryptography``, no keytool).

    Kafka reads PEM key and trust stores directly (``ssl.keystore.type=PEM``), so nothing has
    to be converted to JKS/PKCS12.  Subjects are only ``CN=<name>``: with the brokers'
    ``ssl.principal.mapping.rules`` the TLS principal is then ``User:<name>``, the same form as a
    SCRAM user's, so ACLs read the same for both.
    """

    def __init__(self, directory: Path, name: str = "Prism Test CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cafile = directory / "ca.pem"
        self.cafile.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool = False) -> CertFiles:
        """A certificate ``CN=name`` signed by this CA; ``server`` adds SANs 127.0.0.1/localhost."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM) + self._cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        files = CertFiles(name, self.directory / f"{name}.crt.pem", self.directory / f"{name}.key.pem",
                          self.directory / f"{name}.keystore.pem")
        files.cert.write_bytes(cert_pem)
        files.key.write_bytes(key_pem)
        files.key.chmod(0o600)
        files.keystore.write_bytes(key_pem + cert_pem)
        files.keystore.chmod(0o600)
        return files


# --------------------------------------------------------------------------- client settings


def aiokafka_kwargs(cfg: ClientConfig) -> dict[str, Any]:
    """Keyword arguments for aiokafka's producer, consumer and admin client."""
    from aiokafka.helpers import create_ssl_context

    kwargs: dict[str, Any] = {"bootstrap_servers": cfg["bootstrap_servers"],
                              "security_protocol": cfg.get("security_protocol", "PLAINTEXT")}
    if "ssl_cafile" in cfg:
        kwargs["ssl_context"] = create_ssl_context(cafile=cfg["ssl_cafile"], certfile=cfg.get("ssl_certfile"),
                                                   keyfile=cfg.get("ssl_keyfile"))
    if "sasl_mechanism" in cfg:
        kwargs.update(sasl_mechanism=cfg["sasl_mechanism"], sasl_plain_username=cfg["sasl_username"],
                      sasl_plain_password=cfg["sasl_password"])
    return kwargs


_LIBRDKAFKA_KEYS = {
    "bootstrap_servers": "bootstrap.servers", "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism", "sasl_username": "sasl.username", "sasl_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
}


def librdkafka_config(cfg: ClientConfig) -> dict[str, str]:
    """The same settings as librdkafka properties (confluent-kafka clients, kcat's ``-X``)."""
    return {_LIBRDKAFKA_KEYS[key]: str(value) for key, value in cfg.items()}


def kcat_args(cfg: ClientConfig) -> list[str]:
    """``kcat`` arguments that connect to the listener ``cfg`` describes."""
    args = ["-b", cfg["bootstrap_servers"]]
    for key, value in librdkafka_config(cfg).items():
        if key != "bootstrap.servers":
            args += ["-X", f"{key}={value}"]
    return args


def prism_env(cfg: ClientConfig) -> dict[str, str]:
    """The ``PRISM_*`` variables that point a Prism worker at this listener.

    A mutual-TLS listener's client certificate becomes ``PRISM_SSL_CERTFILE``/``PRISM_SSL_KEYFILE``.
    """
    env = {"PRISM_BROKER_URL": cfg["bootstrap_servers"],
           "PRISM_SECURITY_PROTOCOL": cfg.get("security_protocol", "PLAINTEXT")}
    if "sasl_mechanism" in cfg:
        env.update(PRISM_SASL_MECHANISM=cfg["sasl_mechanism"], PRISM_SASL_USERNAME=cfg["sasl_username"],
                   PRISM_SASL_PASSWORD=cfg["sasl_password"])
    if "ssl_cafile" in cfg:
        env["PRISM_SSL_CAFILE"] = cfg["ssl_cafile"]
    if "ssl_certfile" in cfg:
        env.update(PRISM_SSL_CERTFILE=cfg["ssl_certfile"], PRISM_SSL_KEYFILE=cfg["ssl_keyfile"])
    return env


# --------------------------------------------------------------------------- processes

#: Every JVM this module started and has not reaped yet; the atexit hook kills what is left.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def _kill_leftovers() -> None:
    """atexit: SIGKILL every JVM still running (a cluster nobody stopped, a test run interrupted)."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
        _LIVE.clear()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


atexit.register(_kill_leftovers)


def _with_parent_death_signal(cmd: list[str]) -> list[str]:
    """Prefix ``setpriv --pdeathsig KILL`` (util-linux) so the JVM dies with the process that started it.

    KILL rather than TERM: a broker whose test process is gone has nothing worth a controlled
    shutdown, and a KRaft broker asked to shut down while its quorum is gone can wait a long time.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else cmd


def light_jvm(java: str, heap: str) -> list[str]:
    """``java`` with the flags that keep a test JVM light: small heap, serial GC, C1 only."""
    return [java, "-Xms64m", f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
            "-Djava.awt.headless=true"]


def write_log4j2_config(path: Path, log_file: Path) -> str:
    """A log4j2 configuration at ``path`` that appends INFO and above to ``log_file``; returns the
    JVM flag that selects it."""
    path.write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="FILE" fileName="{log_file}" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="FILE"/></Root>
  </Loggers>
</Configuration>
""", encoding="utf-8")
    return f"-Dlog4j2.configurationFile={path}"


def spawn(cmd: list[str], console: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (no waiting) in a session of its own, its output appended to ``console``,
    and register it for :func:`_terminate` and the atexit hook."""
    with console.open("ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=cwd)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    return proc


def _terminate(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM ``procs`` together, SIGKILL whatever is still running after ``timeout`` seconds, reap all."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=30)
    with _LIVE_LOCK:
        _LIVE.difference_update(procs)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that are free right now (all held open while picking)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _cluster_id() -> str:
    """A random KRaft cluster id (Kafka's base64url Uuid form).

    Like Kafka's own ``Uuid.randomUuid()``, never one starting with ``-``: the storage tool's
    argument parser would read ``-t -abc...`` as an option and fail (it happened here).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` (or a note that it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


def _poll(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    """Call ``check`` until it returns something other than None; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
        except KafkaStartError:
            raise
        except Exception as exc:  # the cluster is still settling: remember why, try again
            last_error = exc
            result = None
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f} s"
                               + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)


# --------------------------------------------------------------------------- the cluster


@dataclass
class KafkaNode:
    """One combined broker+controller: its id, directory, ports and (while running) its JVM."""

    node_id: int
    directory: Path
    ports: dict[str, int]  # listener name -> port
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        """The broker's own log (log4j), appended to across restarts."""
        return self.directory / "server.log"

    @property
    def console_file(self) -> Path:
        """The JVM's stdout and stderr (JVM errors before logging is up land here)."""
        return self.directory / "console.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running and self.process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """The tail of the broker log and of the console output, for error messages."""
        return (f"--- node {self.node_id} {self.log_file} (last {lines} lines):\n{_tail(self.log_file, lines)}\n"
                f"--- node {self.node_id} {self.console_file}:\n{_tail(self.console_file, 15)}")


@dataclass
class _Settings:
    nodes: int
    listeners: tuple[Protocol, ...]
    acls: bool
    auto_create_topics: bool
    users: dict[str, str]
    broker_config: dict[str, str]
    heap: str
    start_timeout: float
    stop_timeout: float
    extra_jvm_args: tuple[str, ...] = field(default_factory=tuple)


class ApacheKafka:
    """Apache Kafka in KRaft mode: ``nodes`` combined broker+controller JVMs on loopback.

    ``listeners`` are the client listeners, named after their protocol: PLAINTEXT; SASL_SSL
    (SCRAM-SHA-512; the ``users`` are created when the storage is formatted); SSL (mutual TLS,
    ``ssl.client.auth=required``).  With any TLS listener, brokers and controllers talk to each
    other over mutual TLS too (listeners INTERNAL and CONTROLLER, principal ``kafka-broker``);
    otherwise over PLAINTEXT.  ``acls=True`` turns on ``StandardAuthorizer`` with
    ``allow.everyone.if.no.acl.found=false`` and super users ``admin`` and ``kafka-broker``.
    ``broker_config`` overrides or adds ``server.properties`` entries on every node.
    """

    def __init__(
        self,
        libs: Path,
        directory: Path,
        *,
        nodes: int = 1,
        listeners: Sequence[Protocol] = ("PLAINTEXT",),
        acls: bool = False,
        auto_create_topics: bool = False,
        users: Mapping[str, str] | None = None,
        broker_config: Mapping[str, object] | None = None,
        heap: str = "512m",
        start_timeout: float = 90.0,
        stop_timeout: float = 10.0,
        extra_jvm_args: Sequence[str] = (),
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {nodes}")
        if not listeners or len(set(listeners)) != len(listeners) or any(p not in _PROTOCOLS for p in listeners):
            raise ValueError(f"listeners must be distinct names out of {_PROTOCOLS}, got {tuple(listeners)}")
        if acls and set(listeners) == {"PLAINTEXT"}:
            raise ValueError("acls=True needs an authenticated listener (SASL_SSL or SSL): on PLAINTEXT every "
                             "client is User:ANONYMOUS")
        users = dict(DEFAULT_USERS if users is None else users)
        if "SASL_SSL" in listeners and ADMIN_USER not in users:
            users[ADMIN_USER] = DEFAULT_USERS[ADMIN_USER]
        self.libs = libs
        self.version = kafka_version(libs)
        self.directory = directory
        self.settings = _Settings(nodes, tuple(listeners), acls, auto_create_topics, users,
                                  {k: str(v) for k, v in (broker_config or {}).items()}, heap,
                                  start_timeout, stop_timeout, tuple(extra_jvm_args))
        self.secure = any(p != "PLAINTEXT" for p in listeners)
        self.cluster_id = _cluster_id()
        self.nodes: dict[int, KafkaNode] = {}
        self.ca: CertificateAuthority | None = None
        self._broker_cert: CertFiles | None = None
        self._client_certs: dict[str, CertFiles] = {}
        #: Seconds from launching the JVMs until every node answered metadata (the last start()).
        self.startup_seconds: float | None = None
        #: Seconds the last start() took in all: directories, certificates, formatting, startup.
        self.start_total_seconds: float | None = None
        self._java = java_binary()
        if self._java is None:
            raise KafkaUnavailable("Apache Kafka tests need Java 17+ (apt-get install openjdk-17-jre-headless)")

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> ApacheKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"ApacheKafka({self.version}, nodes={self.settings.nodes}, listeners={self.settings.listeners}, "
                f"running={[n.node_id for n in self.nodes.values() if n.running]})")

    # ------------------------------------------------------------------ addresses and client settings

    @property
    def listener_names(self) -> list[str]:
        """All listener names on every node, the client ones first."""
        internal = ["INTERNAL"] if self.secure else []
        return [*self.settings.listeners, *internal, "CONTROLLER"]

    @property
    def primary_listener(self) -> Protocol:
        """The listener :attr:`bootstrap` and :meth:`client_config` use when none is named."""
        return self.settings.listeners[0]

    def bootstrap_for(self, listener: Protocol | None = None, *, running_only: bool = True) -> str:
        """``127.0.0.1:PORT,...`` of ``listener`` on every (running) node."""
        name = listener or self.primary_listener
        if name not in self.settings.listeners:
            raise ValueError(f"this cluster has no {name} listener (it has {self.settings.listeners})")
        nodes = [n for n in self.nodes.values() if n.running or not running_only] or list(self.nodes.values())
        return ",".join(f"127.0.0.1:{n.ports[name]}" for n in nodes)

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers of the primary listener on the running nodes."""
        return self.bootstrap_for()

    def client_cert(self, name: str) -> CertFiles:
        """A client certificate ``CN=name`` (principal ``User:name``) signed by this cluster's CA."""
        if self.ca is None:
            raise ValueError("this cluster has no TLS listener, hence no CA")
        if name not in self._client_certs:
            self._client_certs[name] = self.ca.issue(name)
        return self._client_certs[name]

    def client_config(self, listener: Protocol | None = None, *, user: str = ADMIN_USER,
                      password: str | None = None, cert: CertFiles | None = None) -> ClientConfig:
        """How a client reaches ``listener`` (default: the primary one) as ``user``.

        SASL_SSL: SCRAM-SHA-512 as ``user`` with ``password`` (default: the password it was
        created with).  SSL: mutual TLS with ``cert`` (default: a certificate ``CN=user`` from
        this cluster's CA).  ``user`` defaults to the super user ``admin``; PLAINTEXT ignores it.
        """
        name = listener or self.primary_listener
        cfg: ClientConfig = {"bootstrap_servers": self.bootstrap_for(name), "security_protocol": name}
        if name in ("SSL", "SASL_SSL"):
            assert self.ca is not None
            cfg["ssl_cafile"] = str(self.ca.cafile)
        if name == "SASL_SSL":
            if password is None and user not in self.settings.users:
                raise ValueError(f"no SCRAM user {user!r} (users: {sorted(self.settings.users)}); pass password=")
            cfg.update(sasl_mechanism=SCRAM_MECHANISM, sasl_username=user,
                       sasl_password=password if password is not None else self.settings.users[user])
        if name == "SSL":
            files = cert or self.client_cert(user)
            cfg.update(ssl_certfile=str(files.cert), ssl_keyfile=str(files.key))
        return cfg

    def admin_config(self) -> ClientConfig:
        """Super-user settings on the primary listener (what the helper's own admin calls use)."""
        return self.client_config(user=ADMIN_USER)

    # ------------------------------------------------------------------ configuration files

    def _server_properties(self, node: KafkaNode) -> dict[str, str]:
        s = self.settings
        n = s.nodes
        voters = ",".join(f"{m.node_id}@127.0.0.1:{m.ports['CONTROLLER']}" for m in self.nodes.values())
        protocol_map = {p: p for p in s.listeners}
        protocol_map["CONTROLLER"] = "SSL" if self.secure else "PLAINTEXT"
        if self.secure:
            protocol_map["INTERNAL"] = "SSL"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(f"{name}://127.0.0.1:{node.ports[name]}" for name in self.listener_names),
            "advertised.listeners": ",".join(f"{name}://127.0.0.1:{node.ports[name]}"
                                             for name in self.listener_names if name != "CONTROLLER"),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL" if self.secure else "PLAINTEXT" if "PLAINTEXT" in s.listeners
            else s.listeners[0],
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocol_map.items()),
            "log.dirs": str(node.data_dir),
            # Fast, small and light on 2 cores: test data only.
            "num.partitions": "1",
            "default.replication.factor": str(min(3, n)),
            "min.insync.replicas": str(min(2, n)),
            "offsets.topic.replication.factor": str(min(3, n)),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(min(3, n)),
            "transaction.state.log.min.isr": str(min(2, n)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(min(3, n)),
            "share.coordinator.state.topic.min.isr": str(min(2, n)),
            "group.initial.rebalance.delay.ms": "0",
            # A transaction past its timeout is aborted within ~1 s of it, not Kafka's 10 s check
            # interval (tests/worker/test_exactly_once_e2e.py's timeout test waits for that abort).
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "auto.create.topics.enable": str(s.auto_create_topics).lower(),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.replica.fetchers": "1",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
            # A killed node is fenced (and its partitions' leadership moved) within ~3 s, not 9.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
        }
        if self.secure:
            assert self.ca is not None and self._broker_cert is not None
            props.update({
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self._broker_cert.keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca.cafile),
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
                "listener.name.internal.ssl.client.auth": "required",
                "listener.name.controller.ssl.client.auth": "required",
            })
            if "SSL" in s.listeners:
                props["listener.name.ssl.ssl.client.auth"] = "required"
            if "SASL_SSL" in s.listeners:
                props.update({
                    "listener.name.sasl_ssl.sasl.enabled.mechanisms": SCRAM_MECHANISM,
                    f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                })
        if s.acls:
            props.update({
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{ADMIN_USER};User:{BROKER_PRINCIPAL}",
                "allow.everyone.if.no.acl.found": "false",
            })
        props.update(s.broker_config)
        return props

    def _write_logging_config(self, node: KafkaNode) -> list[str]:
        """The logging configuration file of ``node``; returns the JVM flags that select it.

        Kafka 4 ships log4j2, Kafka 3 reload4j (``scripts/fetch-kafka.sh`` fetches the same).
        """
        if any(self.libs.glob("log4j-core-*.jar")):
            return [write_log4j2_config(node.directory / "log4j2.xml", node.log_file)]
        path = node.directory / "log4j.properties"
        path.write_text(
            "log4j.rootLogger=INFO, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.FileAppender\n"
            f"log4j.appender.FILE.File={node.log_file}\n"
            "log4j.appender.FILE.Append=true\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=[%d] %p %m (%c)%n\n", encoding="utf-8")
        return [f"-Dlog4j.configuration=file:{path}"]

    def _jvm(self, node: KafkaNode | None = None, heap: str | None = None) -> list[str]:
        """``java`` with the flags that keep a test broker light: small heap, serial GC, C1 only."""
        assert self._java is not None
        flags = light_jvm(self._java, heap or self.settings.heap)
        if node is not None:
            flags += [f"-Dkafka.logs.dir={node.directory}", *self._write_logging_config(node)]
        return [*flags, *self.settings.extra_jvm_args, "-cp", f"{self.libs}/*"]

    # ------------------------------------------------------------------ lifecycle

    def _prepare(self) -> None:
        """Fresh directories, ports, certificates and ``server.properties`` for every node."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        if self.secure:
            self.ca = CertificateAuthority(self.directory / "tls")
            self._broker_cert = self.ca.issue(BROKER_PRINCIPAL, server=True)
            self._client_certs = {}
        names = self.listener_names
        ports = iter(_free_ports(len(names) * self.settings.nodes))
        self.nodes = {}
        for node_id in range(1, self.settings.nodes + 1):
            directory = self.directory / f"node-{node_id}"
            directory.mkdir()
            self.nodes[node_id] = KafkaNode(node_id, directory, {name: next(ports) for name in names})
        for node in self.nodes.values():
            node.config_file.write_text(
                "".join(f"{k}={v}\n" for k, v in self._server_properties(node).items()), encoding="utf-8")

    def _format(self) -> None:
        """``kafka.tools.StorageTool format`` on every node (in parallel), with the SCRAM users."""
        scram: list[str] = []
        if "SASL_SSL" in self.settings.listeners:
            for user, password in self.settings.users.items():
                scram += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        procs = []
        for node in self.nodes.values():
            cmd = [*self._jvm(heap="256m"), "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                   "-c", str(node.config_file), *scram]
            procs.append((node, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        failures = []
        for node, proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failures.append(f"node {node.node_id}: exit {proc.returncode}: "
                                f"{out.decode(errors='replace').strip()[-2000:]}")
        if failures:
            raise KafkaStartError("formatting the KRaft storage failed:\n" + "\n".join(failures))

    def _launch(self, node: KafkaNode) -> None:
        """Start ``node``'s JVM (no waiting)."""
        if node.running:
            raise RuntimeError(f"node {node.node_id} is already running (pid {node.pid})")
        cmd = _with_parent_death_signal([*self._jvm(node), "kafka.Kafka", str(node.config_file)])
        node.process = spawn(cmd, node.console_file, node.directory)
        node.starts += 1

    def start(self) -> ApacheKafka:
        """Prepare, format and start every node; return once all of them answer metadata.

        A port taken by someone else between picking and binding makes Kafka fail with a
        BindException; then the whole cluster is set up again on new ports (up to 3 attempts).
        """
        began = time.monotonic()
        for attempt in range(1, 4):
            self._prepare()
            self._format()
            started = time.monotonic()
            for node in self.nodes.values():
                self._launch(node)
            try:
                self.wait_ready(timeout=self.settings.start_timeout)
            except (KafkaStartError, TimeoutError) as exc:
                bind_failure = any("BindException" in _tail(n.log_file, 200) for n in self.nodes.values())
                self.stop()
                if bind_failure and attempt < 3:
                    log.warning("Kafka could not bind its ports (attempt %d); retrying on new ports", attempt)
                    continue
                raise KafkaStartError(f"{self!r} did not start: {exc}\n" + "\n".join(
                    n.log_tail() for n in self.nodes.values())) from exc
            self.startup_seconds = time.monotonic() - started
            self.start_total_seconds = time.monotonic() - began
            log.info("%r ready in %.1f s (%.1f s with formatting)", self, self.startup_seconds,
                     self.start_total_seconds)
            return self
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop every node (SIGTERM together, then SIGKILL after a bound); idempotent.

        With several nodes the bound is at most 3 s: once its peers are gone, the last node's
        controlled shutdown waits for a quorum that will never return (measured: it hangs until
        killed), and a test cluster's data is thrown away anyway.
        """
        procs = [n.process for n in self.nodes.values() if n.process is not None]
        grace = self.settings.stop_timeout if len(procs) <= 1 else min(self.settings.stop_timeout, 3.0)
        _terminate(procs, grace)
        for node in self.nodes.values():
            node.process = None

    def kill(self, node_id: int) -> None:
        """``kill -9`` one node: no controlled shutdown, as in a crash."""
        node = self.nodes[node_id]
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                node.process.kill()
            node.process.wait(timeout=30)
            with _LIVE_LOCK:
                _LIVE.discard(node.process)
            node.process = None

    def stop_node(self, node_id: int) -> None:
        """Stop one node gracefully (SIGTERM: controlled shutdown), SIGKILL after ``stop_timeout``."""
        node = self.nodes[node_id]
        if node.process is not None:
            _terminate([node.process], self.settings.stop_timeout)
            node.process = None

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Start a stopped or killed node on its old ports and data; wait until the cluster sees it."""
        self._launch(self.nodes[node_id])
        self.wait_ready(timeout=timeout or self.settings.start_timeout)

    def rolling_restart(self, timeout: float | None = None) -> None:
        """Restart the nodes one at a time, each after every partition is fully replicated again."""
        for node_id in self.nodes:
            self.wait_in_sync(timeout=timeout)
            self.stop_node(node_id)
            self.start_node(node_id, timeout=timeout)
        self.wait_in_sync(timeout=timeout)

    # ------------------------------------------------------------------ metadata and admin

    @contextlib.contextmanager
    def admin(self, node_id: int | None = None) -> Iterator[Any]:
        """A confluent-kafka AdminClient as the super user (bootstrapped from one node, if given).

        librdkafka rather than aiokafka here because its admin API is synchronous (usable from
        sync fixtures) and covers ACLs and SCRAM credentials, which aiokafka's does not.
        """
        from confluent_kafka.admin import AdminClient

        conf: dict[str, Any] = librdkafka_config(self.admin_config())
        if node_id is not None:
            conf["bootstrap.servers"] = f"127.0.0.1:{self.nodes[node_id].ports[self.primary_listener]}"
        conf.update({"socket.timeout.ms": 5000, "reconnect.backoff.max.ms": 500})
        client = AdminClient(conf, logger=logging.getLogger("tests.kafka.librdkafka"))
        yield client

    def _check_alive(self) -> None:
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is not None:
                code = node.process.returncode
                node.process = None
                raise KafkaStartError(f"node {node.node_id} exited with code {code}\n{node.log_tail()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll until every running node answers metadata listing every running node as a broker."""
        running = {n.node_id for n in self.nodes.values() if n.running}

        def ready() -> bool | None:
            self._check_alive()
            for node_id in sorted(running):
                port = self.nodes[node_id].ports[self.primary_listener]
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                with self.admin(node_id) as admin:
                    brokers = set(admin.list_topics(timeout=2).brokers)
                if not running <= brokers:
                    return None
            return True

        _poll(f"{self!r} ready", ready, timeout)

    def metadata(self, topic: str | None = None) -> Any:
        """Cluster metadata (confluent-kafka ``ClusterMetadata``), of one topic or of all."""
        with self.admin() as admin:
            return admin.list_topics(topic=topic, timeout=10)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node id leading ``topic``/``partition`` right now (-1 while there is none)."""
        meta = self.metadata(topic).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"metadata of {topic}: {meta.error}")
        return int(meta.partitions[partition].leader)

    def wait_leader(self, topic: str, partition: int = 0, *, not_on: int | None = None,
                    timeout: float = 30.0) -> int:
        """Poll until ``topic``/``partition`` has a leader (other than ``not_on``); return its node id."""
        running = {n.node_id for n in self.nodes.values() if n.running}

        def leader() -> int | None:
            node_id = self.leader(topic, partition)
            return node_id if node_id in running and node_id != not_on else None

        return _poll(f"a leader for {topic}[{partition}]", leader, timeout)

    def wait_in_sync(self, timeout: float | None = None) -> None:
        """Poll until every partition of every topic has all its replicas in the ISR."""

        def in_sync() -> bool | None:
            self._check_alive()
            meta = self.metadata()
            for topic in meta.topics.values():
                for part in topic.partitions.values():
                    if part.leader < 0 or set(part.isrs) != set(part.replicas):
                        return None
            return True

        _poll("all partitions in sync", in_sync, timeout or self.settings.start_timeout)

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = -1,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        """Create ``name`` (default replication factor: the cluster's) and wait for its leaders."""
        from confluent_kafka.admin import NewTopic

        with self.admin() as admin:
            futures = admin.create_topics([NewTopic(name, partitions, replication_factor, config=dict(config or {}))],
                                          operation_timeout=timeout)
            futures[name].result(timeout=timeout)

        def has_leaders() -> bool | None:
            meta = self.metadata(name).topics[name]
            ok = meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values())
            return True if ok else None

        _poll(f"leaders of {name}", has_leaders, timeout)
        return name

    def add_acl(self, principal: str, operation: str, *, topic: str | None = None, group: str | None = None,
                cluster: bool = False, pattern: str = "LITERAL", permission: str = "ALLOW",
                host: str = "*", timeout: float = 30.0) -> None:
        """Add one ACL (e.g. ``add_acl("alice", "READ", topic="t")``) and wait until brokers enforce it.

        ``principal`` is a user name or ``User:<name>``; ``operation``, ``pattern`` and
        ``permission`` are Kafka's names (READ, WRITE, DESCRIBE, ALL, ...; LITERAL, PREFIXED;
        ALLOW, DENY).  Exactly one of ``topic``, ``group`` and ``cluster`` names the resource.
        """
        from confluent_kafka.admin import (
            AclBinding,
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if sum([topic is not None, group is not None, cluster]) != 1:
            raise ValueError("name exactly one resource: topic=, group= or cluster=True")
        if not self.settings.acls:
            raise ValueError("this cluster runs without an authorizer (acls=False)")
        if topic is not None:
            rtype, rname = ResourceType.TOPIC, topic
        elif group is not None:
            rtype, rname = ResourceType.GROUP, group
        else:
            rtype, rname = ResourceType.BROKER, "kafka-cluster"
        who = principal if ":" in principal else f"User:{principal}"
        binding = AclBinding(rtype, rname, ResourcePatternType[pattern], who, host, AclOperation[operation],
                             AclPermissionType[permission])
        with self.admin() as admin:
            admin.create_acls([binding], request_timeout=timeout)[binding].result(timeout=timeout)
            query = AclBindingFilter(rtype, rname, ResourcePatternType[pattern], who, host, AclOperation[operation],
                                     AclPermissionType[permission])
            # Each broker applies ACLs when it replays the metadata log, and DescribeAcls answers
            # from the answering broker's own authorizer.  librdkafka may route a request to any
            # broker it knows, so on several nodes this narrows the window rather than closing it.
            for node_id in [n.node_id for n in self.nodes.values() if n.running]:
                with self.admin(node_id) as node_admin:
                    _poll(f"ACL {binding} on node {node_id}",
                          lambda a=node_admin: a.describe_acls(query, request_timeout=5).result(timeout=10) or None,
                          timeout)

    def add_scram_user(self, user: str, password: str, timeout: float = 30.0) -> None:
        """Create (or change) a SCRAM-SHA-512 user at run time through the admin API."""
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        if "SASL_SSL" not in self.settings.listeners:
            raise ValueError("this cluster has no SASL_SSL listener")
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                              password.encode())
        with self.admin() as admin:
            for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
                future.result(timeout=timeout)
        self.settings.users[user] = password
