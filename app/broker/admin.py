"""Topic administration and broker connection settings.

``ensure_topics`` creates the topics a topology declares, with their declared partition counts,
before any worker subscribes. That order matters twice on the embedded broker: Tansu creates a
topic with 4 partitions as a side effect of a ``Metadata`` request that names it (so a worker
that subscribes first silently gets the wrong count), and Faust refuses to run a table whose
changelog has a different partition count than its source topic (``PartitionsMismatch``).
So this module never names a missing topic in a ``Metadata`` request: it lists all topics,
creates the missing ones, and only then describes them.

``BrokerSettings`` reads ``PRISM_BROKER_URL`` and the SASL/SSL variables once, at start-up, and
fails with one error that lists every problem (``PRISM_X: what is wrong; how to fix``), instead
of a connection failure minutes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..decimal_text import decimal
from ..errors import BrokerError, ConfigError

__all__ = [
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "BrokerSettings",
    "BrokerSettingsError",
    "RetentionCheck",
    "TopicError",
    "TopicPartitionMismatch",
    "check_retention",
    "ensure_topics",
    "read_max_message_bytes",
    "validate_topic_name",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: Mechanisms that need nothing beyond a username and a password. GSSAPI (Kerberos) and
#: OAUTHBEARER need client-side machinery that environment variables cannot describe.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

TopicState = Literal["created", "exists"]

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TOPIC_ALREADY_EXISTS = 36


class BrokerSettingsError(ConfigError):
    """``PRISM_BROKER_URL`` or a SASL/SSL variable is invalid. Lists every problem at once."""

    code = "bad_broker_settings"

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "invalid broker settings: " + "; ".join(self.problems),
            hint="fix the listed environment variables (empty PRISM_BROKER_URL = embedded broker)",
        )


class TopicError(BrokerError):
    """A topic declaration is invalid or the broker refused to create a topic."""

    code = "topic_error"


class TopicPartitionMismatch(TopicError):
    """An existing topic has a different partition count than declared."""

    code = "topic_partition_mismatch"

    def __init__(self, mismatches: Mapping[str, tuple[int, int]]) -> None:
        #: topic -> (actual, declared)
        self.mismatches = dict(mismatches)
        parts = [f"topic {name!r} has {actual} partition(s) but {declared} are declared"
                 for name, (actual, declared) in sorted(self.mismatches.items())]
        super().__init__(
            "; ".join(parts),
            hint="Kafka cannot remove partitions and adding some re-keys existing data: declare the "
                 "existing count, or delete and recreate the topic (this loses its data)",
        )


def validate_topic_name(name: str) -> None:
    """Raise :class:`TopicError` unless ``name`` is a legal Kafka topic name."""
    if name in (".", "..") or not _TOPIC_RE.match(name or ""):
        raise TopicError(f"invalid topic name {name!r}",
                         hint="use 1-249 characters from [A-Za-z0-9._-], not '.' or '..'")


# --------------------------------------------------------------------------- settings


#: A host of a bootstrap entry: a DNS name or IPv4 address, or a bracketed IPv6 address.
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\])$")


def _parse_servers(raw: str, where: str = "PRISM_BROKER_URL") -> tuple[list[str], list[str]]:
    """Parse ``host:port[,host:port]`` (``kafka://`` prefixes and ``;`` separators accepted).

    Only ``,`` and ``;`` separate entries (spaces around them are fine): whitespace inside an
    entry is a problem, not a separator - ``no such:1`` was taken for ``no:9092,such:1`` and the
    error then blamed a host nobody named. Every host is checked to be a host name or address."""
    servers: list[str] = []
    problems: list[str] = []
    label = f"{where}: " if where else ""
    for entry in (part.strip() for part in re.split(r"[,;]", raw.strip())):
        if not entry:
            continue
        if any(c.isspace() for c in entry):
            problems.append(f"{label}{entry!r} contains whitespace; separate host:port entries with "
                            "commas (e.g. kafka-1:9092,kafka-2:9092)")
            continue
        value = entry
        if "://" in value:
            scheme, _, value = value.partition("://")
            if scheme.lower() != "kafka":
                problems.append(f"{label}{entry!r} has scheme {scheme!r}; use host:port or "
                                "kafka://host:port")
                continue
        value = value.rstrip("/")
        if value.startswith("["):  # [ipv6]:port
            host, _, rest = value[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
            host = f"[{host}]"
        else:
            host, _, port_text = value.rpartition(":") if ":" in value else (value, "", "")
        if not host or host == "[]":
            problems.append(f"{label}{entry!r} has no host name")
            continue
        port = 9092
        if port_text:
            if not 0 < (decimal(port_text) or 0) < 65536:
                problems.append(f"{label}{entry!r} has an invalid port {port_text!r}")
                continue
            port = int(port_text)
        if not _HOST_RE.match(host):
            problems.append(f"{label}{entry!r} has an invalid host {host!r}; use a host name, an IPv4 "
                            "address or [an IPv6 address]")
            continue
        servers.append(f"{host}:{port}")
    return servers, problems


def parse_bootstrap(raw: str, where: str) -> str:
    """``raw`` (a bootstrap list: a ``kafka://`` URL's host part, a ``--broker`` value) as the
    ``host:port,...`` string clients take, checked as PRISM_BROKER_URL is - the one parser of
    bootstrap lists. Raises `ConfigError` naming ``where`` for every problem at once."""
    servers, problems = _parse_servers(raw, "")
    if not servers and not problems:
        problems.append("no host:port found")
    if problems:
        raise ConfigError("invalid Kafka bootstrap: " + "; ".join(problems), path=where,
                          hint="write host:port entries separated by commas, e.g. kafka-1:9092,kafka-2:9092")
    return ",".join(servers)


def _check_client_cert(env: Mapping[str, str], protocol: str,
                       problems: list[str]) -> tuple[Path | None, Path | None, str | None]:
    """Validate ``PRISM_SSL_CERTFILE``/``PRISM_SSL_KEYFILE``/``PRISM_SSL_KEY_PASSWORD``, appending to
    ``problems``. Why here and not at connect time: a key that does not match its certificate, or a
    typo in a path, otherwise surfaces as a TLS alert from the broker that names neither file."""
    cert_text = (env.get("PRISM_SSL_CERTFILE") or "").strip()
    key_text = (env.get("PRISM_SSL_KEYFILE") or "").strip()
    key_password = env.get("PRISM_SSL_KEY_PASSWORD") or None
    certfile = Path(cert_text).expanduser() if cert_text else None
    keyfile = Path(key_text).expanduser() if key_text else None
    if certfile is None and keyfile is None:
        if key_password is not None:
            problems.append("PRISM_SSL_KEY_PASSWORD: set, but there is no PRISM_SSL_KEYFILE; set both "
                            "PRISM_SSL_CERTFILE and PRISM_SSL_KEYFILE, or unset it")
        return None, None, None
    before = len(problems)
    if protocol not in ("SSL", "SASL_SSL"):
        problems.append(f"PRISM_SSL_CERTFILE/PRISM_SSL_KEYFILE: set, but PRISM_SECURITY_PROTOCOL={protocol} "
                        "does not use TLS; use SSL (mutual TLS) or SASL_SSL, or unset them")
    if certfile is None:
        problems.append("PRISM_SSL_CERTFILE: required with PRISM_SSL_KEYFILE (the client certificate "
                        "that goes with the key)")
    if keyfile is None:
        problems.append("PRISM_SSL_KEYFILE: required with PRISM_SSL_CERTFILE (the private key of the "
                        "client certificate)")
    for name, path in (("PRISM_SSL_CERTFILE", certfile), ("PRISM_SSL_KEYFILE", keyfile)):
        if path is not None and not path.is_file():
            problems.append(f"{name}: {str(path)!r} does not exist or is not a file")
    if len(problems) == before and certfile is not None and keyfile is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(certfile), str(keyfile), key_password)
        except (OSError, ssl.SSLError) as exc:
            why = "wrong PRISM_SSL_KEY_PASSWORD or " if key_password else ""
            problems.append(f"PRISM_SSL_CERTFILE/PRISM_SSL_KEYFILE: {str(certfile)!r} and {str(keyfile)!r} do not "
                            f"load as a PEM certificate and its private key ({why}not a matching pair: {exc})")
    return certfile, keyfile, key_password


def _replication_factor(raw: str, cluster: bool, problems: list[str]) -> int:
    """``PRISM_REPLICATION_FACTOR`` as a number (1 when unset), appending to ``problems``.

    Checked at start-up because Kafka only refuses a factor larger than the cluster when a topic
    is created - for a table changelog that is after the worker has joined its group."""
    if not raw:
        return 1
    if not 1 <= (decimal(raw) or 0) <= 32767:
        problems.append(f"PRISM_REPLICATION_FACTOR: {raw!r} is not a whole number from 1 to 32767 (the number of "
                        "brokers each topic Prism creates is replicated to, e.g. 3)")
        return 1
    if int(raw) > 1 and not cluster:
        problems.append(f"PRISM_REPLICATION_FACTOR: {raw} needs a Kafka cluster, but PRISM_BROKER_URL is empty "
                        "(the embedded broker is one node); set PRISM_BROKER_URL or unset it")
        return 1
    return int(raw)


@dataclass(frozen=True)
class BrokerSettings:
    """Where the Kafka cluster is and how to authenticate to it.

    Build it with :meth:`from_env`; the constructor does not validate. An empty
    ``bootstrap_servers`` means "start the embedded broker".
    """

    bootstrap_servers: tuple[str, ...] = ()
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: Path | None = None
    #: client certificate (PEM chain, leaf first) for mutual TLS; the broker's principal is its subject
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    #: replication factor of every topic Prism creates (the topology's and Faust's changelogs):
    #: ``PRISM_REPLICATION_FACTOR``; 1 unless set, since a replicated topic needs that many brokers
    replication_factor: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BrokerSettings:
        """Read and validate ``PRISM_BROKER_URL``, ``PRISM_SECURITY_PROTOCOL``,
        ``PRISM_SASL_MECHANISM``, ``PRISM_SASL_USERNAME``, ``PRISM_SASL_PASSWORD``,
        ``PRISM_SSL_CAFILE`` and the client certificate for mutual TLS, ``PRISM_SSL_CERTFILE``,
        ``PRISM_SSL_KEYFILE`` and (for an encrypted key) ``PRISM_SSL_KEY_PASSWORD``, and
        ``PRISM_REPLICATION_FACTOR`` (the replication factor of the topics Prism creates, its
        table changelogs included: without it a table on a 3-broker cluster lives on one broker,
        and that broker's loss stops the worker).

        Raises:
            BrokerSettingsError: listing every problem found, each prefixed with its variable.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return (env.get(name) or "").strip()

        problems: list[str] = []
        servers, url_problems = _parse_servers(get("PRISM_BROKER_URL"))
        problems += url_problems
        if get("PRISM_BROKER_URL") and not servers and not url_problems:
            problems.append("PRISM_BROKER_URL: no host:port found")

        protocol = get("PRISM_SECURITY_PROTOCOL").upper().replace("-", "_") or "PLAINTEXT"
        if protocol not in SECURITY_PROTOCOLS:
            problems.append(f"PRISM_SECURITY_PROTOCOL: {get('PRISM_SECURITY_PROTOCOL')!r} is not one of "
                            f"{', '.join(SECURITY_PROTOCOLS)}")
        mechanism = get("PRISM_SASL_MECHANISM").upper().replace("_", "-") or None
        username = get("PRISM_SASL_USERNAME") or None
        password = env.get("PRISM_SASL_PASSWORD") or None  # passwords may have meaningful spaces
        cafile_text = get("PRISM_SSL_CAFILE")
        cafile = Path(cafile_text).expanduser() if cafile_text else None

        sasl = protocol.startswith("SASL_")
        if sasl:
            if mechanism is None:
                problems.append(f"PRISM_SASL_MECHANISM: required with PRISM_SECURITY_PROTOCOL={protocol}; "
                                f"use one of {', '.join(SASL_MECHANISMS)}")
            elif mechanism not in SASL_MECHANISMS:
                problems.append(f"PRISM_SASL_MECHANISM: {get('PRISM_SASL_MECHANISM')!r} is not supported; "
                                f"use one of {', '.join(SASL_MECHANISMS)}")
            if username is None:
                problems.append(f"PRISM_SASL_USERNAME: required with PRISM_SECURITY_PROTOCOL={protocol}")
            if password is None:
                problems.append(f"PRISM_SASL_PASSWORD: required with PRISM_SECURITY_PROTOCOL={protocol}")
        elif protocol in SECURITY_PROTOCOLS:
            for name, value in (("PRISM_SASL_MECHANISM", mechanism), ("PRISM_SASL_USERNAME", username),
                                ("PRISM_SASL_PASSWORD", password)):
                if value is not None:
                    problems.append(f"{name}: set, but PRISM_SECURITY_PROTOCOL={protocol} does not use SASL; "
                                    "use SASL_PLAINTEXT or SASL_SSL, or unset it")
        if cafile is not None:
            if protocol not in ("SSL", "SASL_SSL"):
                problems.append(f"PRISM_SSL_CAFILE: set, but PRISM_SECURITY_PROTOCOL={protocol} does not use "
                                "TLS; use SSL or SASL_SSL, or unset it")
            elif not cafile.is_file():
                problems.append(f"PRISM_SSL_CAFILE: {str(cafile)!r} does not exist or is not a file")
            else:
                try:
                    ssl.create_default_context(cafile=str(cafile))
                except (OSError, ssl.SSLError) as exc:
                    problems.append(f"PRISM_SSL_CAFILE: {str(cafile)!r} is not a readable PEM CA bundle ({exc})")

        certfile, keyfile, key_password = _check_client_cert(env, protocol, problems)
        replication = _replication_factor(get("PRISM_REPLICATION_FACTOR"), bool(servers) or bool(url_problems),
                                          problems)

        if not servers and not url_problems and protocol != "PLAINTEXT":
            problems.append(f"PRISM_SECURITY_PROTOCOL: {protocol} needs a real cluster, but PRISM_BROKER_URL is "
                            "empty (the embedded broker has no authentication); set PRISM_BROKER_URL or "
                            "unset the security variables")
        if problems:
            raise BrokerSettingsError(problems)
        return cls(
            bootstrap_servers=tuple(servers),
            security_protocol=protocol,
            sasl_mechanism=mechanism if sasl else None,
            sasl_username=username if sasl else None,
            sasl_password=password if sasl else None,
            ssl_cafile=cafile,
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
            ssl_key_password=key_password,
            replication_factor=replication,
        )

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: start the embedded one."""
        return not self.bootstrap_servers

    @property
    def bootstrap(self) -> str:
        """``host:port,host:port`` (empty for the embedded broker until it is started)."""
        return ",".join(self.bootstrap_servers)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A verifying TLS context for SSL/SASL_SSL (``PRISM_SSL_CAFILE`` or the system CAs)."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        context = ssl.create_default_context(cafile=str(self.ssl_cafile) if self.ssl_cafile else None)
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            context.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile), self.ssl_key_password)
        return context

    @property
    def principal(self) -> str | None:
        """The Kafka principal these settings authenticate as, for ACL advice (None: anonymous).

        SASL: ``User:<username>``. Mutual TLS: ``User:<certificate subject>`` in RFC 2253 form,
        which is what a broker without ``ssl.principal.mapping.rules`` uses; brokers with mapping
        rules shorten it (e.g. to the CN), which the client cannot see."""
        if self.security_protocol.startswith("SASL_"):
            return f"User:{self.sasl_username}"
        if self.ssl_certfile is not None:
            from cryptography import x509

            with contextlib.suppress(OSError, ValueError):
                cert = x509.load_pem_x509_certificate(self.ssl_certfile.read_bytes())
                return f"User:{cert.subject.rfc4514_string()}"
        return "User:ANONYMOUS" if self.bootstrap_servers else None

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka producers, consumers and admin clients."""
        warn_plaintext_sasl_once(self.security_protocol)
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        context = self.ssl_context()
        if context is not None:
            kwargs["ssl_context"] = context
        if self.security_protocol.startswith("SASL_"):
            kwargs.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                          sasl_plain_password=self.sasl_password)
        return kwargs

    def faust_credentials(self) -> Any:
        """Faust ``broker_credentials`` (``None`` for PLAINTEXT)."""
        from faust.auth import SASLCredentials, SSLCredentials

        if self.security_protocol == "SSL":
            return SSLCredentials(self.ssl_context())
        warn_plaintext_sasl_once(self.security_protocol)
        if self.security_protocol.startswith("SASL_"):
            # Faust derives SASL_SSL from the presence of an SSL context.
            return SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                   ssl_context=self.ssl_context(), mechanism=self.sasl_mechanism)
        return None


class _OncePerProcess(logging.Filter):
    """Lets a record whose message starts with `prefix` through once, then drops its repeats."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        if self.seen:
            return False
        self.seen = True
        return True


#: aiokafka warns "Sending username and password in the clear" on every SASL_PLAINTEXT
#: connection: ~20 lines a minute from one worker (producers, consumers, admin clients, lag
#: probes). The fact matters once - the configuration does not change while the process runs.
_SASL_CLEAR = _OncePerProcess("Sending username and password in the clear")


def warn_plaintext_sasl_once(security_protocol: str) -> None:
    """On SASL_PLAINTEXT, let aiokafka's "password in the clear" warning through once per process."""
    if security_protocol == "SASL_PLAINTEXT":
        conn = logging.getLogger("aiokafka.conn")
        if _SASL_CLEAR not in conn.filters:
            conn.addFilter(_SASL_CLEAR)


# --------------------------------------------------------------------------- topics


async def ensure_topics(
    bootstrap: str | Sequence[str],
    topics: Mapping[str, int],
    *,
    settings: BrokerSettings | None = None,
    replication_factor: int | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    timeout: float = 30.0,
) -> dict[str, TopicState]:
    """Create missing topics with the declared partition counts; verify the existing ones.

    Idempotent: a second call with the same declaration returns ``{name: "exists"}`` and changes
    nothing. A topic created concurrently by someone else counts as existing (and is verified).

    Args:
        bootstrap: ``host:port[,host:port]`` or a list of them.
        topics: topic name -> declared partition count.
        settings: SASL/SSL settings for a real cluster (``None``: PLAINTEXT).
        replication_factor: replication factor for created topics (default: ``settings``'
            ``PRISM_REPLICATION_FACTOR``, else 1 - the embedded broker has one node).
        configs: optional per-topic configs for created topics, e.g.
            ``{"x-changelog": {"cleanup.policy": "compact"}}``. Existing topics are not altered.
        timeout: overall seconds for the admin requests and for new topics to become visible.

    Returns:
        topic name -> ``"created"`` or ``"exists"``.

    Raises:
        TopicError: a name or partition count is invalid, or the broker refused a creation.
        TopicPartitionMismatch: an existing topic has another partition count (all listed).
        BrokerError: the broker cannot be reached.
    """
    for name, partitions in topics.items():
        validate_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise TopicError(f"topic {name!r} declares {partitions!r} partitions",
                             hint="declare a whole number of partitions >= 1")
    if replication_factor is None:
        replication_factor = settings.replication_factor if settings is not None else 1
    if replication_factor < 1:
        raise TopicError(f"replication factor {replication_factor} is invalid", hint="use 1 or more")
    if not topics:
        return {}

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    servers = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=int(timeout * 1000),
                                **(settings.aiokafka_kwargs() if settings else {}))
    deadline = time.monotonic() + timeout
    try:
        try:
            await asyncio.wait_for(admin.start(), timeout)
        except (TimeoutError, KafkaError, OSError) as exc:
            raise BrokerError(f"cannot reach Kafka at {servers}: {exc!r}",
                              hint="check PRISM_BROKER_URL and that the broker is running") from exc

        # List (never describe) first: naming a missing topic in Metadata auto-creates it on Tansu.
        existing = set(await admin.list_topics())
        missing = [name for name in topics if name not in existing]
        states: dict[str, TopicState] = {name: "exists" for name in topics if name in existing}
        if missing:
            new = [NewTopic(name, topics[name], replication_factor,
                            topic_configs=dict((configs or {}).get(name, {})))
                   for name in missing]
            response = await admin.create_topics(new, timeout_ms=int(timeout * 1000))
            refused: list[str] = []
            for entry in response.to_object()["topic_errors"]:
                name, error_code = entry["topic"], entry["error_code"]
                if error_code == 0:
                    states[name] = "created"
                elif error_code == _TOPIC_ALREADY_EXISTS:
                    states[name] = "exists"  # created concurrently; verified below like any other
                else:
                    message = entry.get("error_message") or f"error code {error_code}"
                    refused.append(f"{name!r}: {message}")
            if refused:
                raise TopicError("the broker refused to create topic(s) " + "; ".join(refused),
                                 hint="check the broker log and the topic settings")

        # Verify every declared topic, waiting for fresh ones to show all their partitions.
        while True:
            described = {t["topic"]: t for t in await admin.describe_topics(list(topics))}
            mismatches: dict[str, tuple[int, int]] = {}
            pending = False
            for name, declared in topics.items():
                actual = len(described.get(name, {}).get("partitions") or [])
                if actual != declared:
                    if states.get(name) == "created" and time.monotonic() < deadline:
                        pending = True  # metadata of a just-created topic can lag
                    else:
                        mismatches[name] = (actual, declared)
            if mismatches:
                raise TopicPartitionMismatch(mismatches)
            if not pending:
                return {name: states[name] for name in topics}
            await asyncio.sleep(0.05)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


# --------------------------------------------------------------------------- retention


@dataclass(frozen=True, slots=True)
class RetentionCheck:
    """One source topic's retention compared with what the topology allows.

    ``status``: ``ok``; ``too_long`` (``actual_ms`` over ``limit_ms``, or -1 = kept forever);
    ``unknown`` (the broker reports no ``retention.ms`` for the topic: its default applies, which
    Prism cannot see); ``unchecked`` (the broker refused or does not support DescribeConfigs,
    ``detail`` says why)."""

    topic: str
    limit_ms: int
    actual_ms: int | None
    status: Literal["ok", "too_long", "unknown", "unchecked"]
    detail: str = ""


async def _describe_topic_configs(bootstrap: str | Sequence[str], topics: Sequence[str],
                                  settings: BrokerSettings | None, timeout: float) -> tuple[list[Any], Exception | None]:
    """The DescribeConfigs responses for ``topics``, or ``([], why)`` when the broker could not
    answer (unsupported API, unreachable broker, no DescribeConfigs ACL): callers report it."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    servers = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=int(timeout * 1000),
                                **(settings.aiokafka_kwargs() if settings else {}))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        return await asyncio.wait_for(admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]), timeout), None
    except Exception as exc:  # unsupported API, unreachable broker, no DescribeConfigs ACL
        return [], exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def check_retention(
    bootstrap: str | Sequence[str],
    limits: Mapping[str, int],
    *,
    settings: BrokerSettings | None = None,
    timeout: float = 15.0,
) -> list[RetentionCheck]:
    """Compare each topic's ``retention.ms`` (DescribeConfigs) with ``limits`` (topic -> ms).

    Never raises for a broker problem: a check that cannot be made is reported as ``unchecked``
    (the worker logs it and runs on; retention is a hygiene check, not a reason to stop)."""
    if not limits:
        return []

    def unchecked(why: str) -> list[RetentionCheck]:
        return [RetentionCheck(t, ms, None, "unchecked", why) for t, ms in limits.items()]

    responses, failed = await _describe_topic_configs(bootstrap, list(limits), settings, timeout)
    if failed is not None:
        return unchecked(f"DescribeConfigs failed: {failed!r}")
    found: dict[str, RetentionCheck] = {}
    for response in responses:
        for res in response.to_object().get("resources", []):
            name, limit = res.get("resource_name"), limits.get(res.get("resource_name", ""))
            if limit is None:
                continue
            if res.get("error_code"):
                found[name] = RetentionCheck(name, limit, None, "unchecked",
                                             f"broker error {res['error_code']}: {res.get('error_message') or ''}")
                continue
            value = next((e.get("config_value") for e in res.get("config_entries") or []
                          if e.get("config_names") == "retention.ms"), None)
            if value is None:
                found[name] = RetentionCheck(name, limit, None, "unknown",
                                             "the broker reports no retention.ms for this topic")
                continue
            try:
                actual = int(value)
            except ValueError:
                found[name] = RetentionCheck(name, limit, None, "unchecked", f"retention.ms is {value!r}")
                continue
            status: Literal["ok", "too_long"] = "too_long" if actual < 0 or actual > limit else "ok"
            found[name] = RetentionCheck(name, limit, actual, status)
    return [found.get(t) or RetentionCheck(t, ms, None, "unchecked", "the broker did not describe this topic")
            for t, ms in limits.items()]


# --------------------------------------------------------------------------- size limits


async def read_max_message_bytes(
    bootstrap: str | Sequence[str],
    topics: Sequence[str],
    *,
    settings: BrokerSettings | None = None,
    timeout: float = 15.0,
) -> tuple[dict[str, int | None], dict[str, str]]:
    """Each topic's ``max.message.bytes`` (DescribeConfigs): the largest record batch the broker
    accepts on it, which the worker's write limits (``app.worker.limits``) must respect.

    Returns ``(values, why)``: ``values[topic]`` is None where the broker did not report it, and
    ``why[topic]`` says why (the embedded broker reports only configs set on the topic; a broker
    may refuse DescribeConfigs). Never raises for a broker problem: the caller falls back to the
    configured producer limit and says so."""
    values: dict[str, int | None] = {t: None for t in topics}
    why: dict[str, str] = {}
    if not topics:
        return values, why
    responses, failed = await _describe_topic_configs(bootstrap, topics, settings, timeout)
    if failed is not None:
        return values, {t: f"DescribeConfigs failed: {failed!r}" for t in topics}
    for response in responses:
        for res in response.to_object().get("resources", []):
            name = res.get("resource_name")
            if name not in values:
                continue
            if res.get("error_code"):
                why[name] = f"broker error {res['error_code']}: {res.get('error_message') or ''}".strip()
                continue
            value = next((e.get("config_value") for e in res.get("config_entries") or []
                          if e.get("config_names") == "max.message.bytes"), None)
            try:
                values[name] = int(value) if value is not None else None
            except ValueError:
                why[name] = f"max.message.bytes is {value!r}"
                continue
            if value is None:
                why[name] = "the broker reports no max.message.bytes for this topic"
    for t in topics:
        if values[t] is None:
            why.setdefault(t, "the broker did not describe this topic")
    return values, why
