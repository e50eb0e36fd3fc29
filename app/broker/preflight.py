"""Start-up preflight against a real Kafka cluster: authentication, TLS and ACLs, before Faust starts.

Why: aiokafka (and Faust on top of it) treats every connection failure as transient. A wrong
SASL password, a client certificate the broker does not trust or a missing ACL make a worker log
``Unable to bootstrap`` / ``TopicAuthorizationFailed`` and retry forever, which looks like a hang.
This module connects once, with the worker's settings, and turns each of those into one
:class:`BrokerPreflightError` line (``error [code] what (at where); fix: how``, exit 2) within a
bounded time:

* authentication (``SaslAuthenticationFailed``): names the user and the mechanism;
* TLS (certificate verification on either side): names the CA file or the client certificate;
* authorization: Metadata v8 with ``include_topic_authorized_operations`` (KIP-430) gives, per
  topic, the operations the principal may perform; DescribeGroups v3 does the same for the
  consumer group. aiokafka has neither struct usable (no Metadata v8; its DescribeGroups v3
  parses the response with the v2 schema and drops the field), so both are declared here. A
  missing internal topic (changelog) is checked for CREATE with a ``validate_only`` CreateTopics.
  Each missing ACL is named with the ``kafka-acls.sh`` command that adds it.

A broker that cannot answer these requests (older versions, no authorizer: ops reported as
"unknown") is not an error: the check is skipped for what it cannot see.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

from app.broker.admin import BrokerSettings
from app.broker.embedded import BrokerError

__all__ = ["AccessPlan", "BrokerPreflightError", "acl_command", "check_access", "check_connection",
           "plan_for", "preflight", "recipe_commands", "run_isolated"]

#: Kafka's AclOperation codes (the bit positions of ``*_authorized_operations``).
OPERATIONS = {"READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
              "DESCRIBE_CONFIGS": 10}
_UNKNOWN_OPS = -(2 ** 31)  # "not requested / not known"
_UNKNOWN_TOPIC = 3
_TOPIC_AUTHORIZATION_FAILED = 29
_GROUP_AUTHORIZATION_FAILED = 30
_TOPIC_ALREADY_EXISTS = 36


class BrokerPreflightError(BrokerError):
    """The worker cannot work with this cluster as configured (auth, TLS or ACLs); never retried."""

    code = "broker_preflight"

    def __init__(self, message: str, *, code: str, path: str | None = None, hint: str | None = None) -> None:
        self.code = code
        super().__init__(message, path=path, hint=hint)


# --------------------------------------------------------------------------- protocol structs


def _structs() -> tuple[type[Any], type[Any]]:
    """Metadata v8 and DescribeGroups v3 request classes (built lazily: aiokafka imports are heavy)."""
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import Array, Boolean, Bytes, Int16, Int32, Schema, String

    class MetadataResponseV8(Response):
        API_KEY = 3
        API_VERSION = 8
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32),
                              ("rack", String("utf-8")))),
            ("cluster_id", String("utf-8")),
            ("controller_id", Int32),
            ("topics", Array(
                ("error_code", Int16), ("topic", String("utf-8")), ("is_internal", Boolean),
                ("partitions", Array(("error_code", Int16), ("partition", Int32), ("leader", Int32),
                                     ("leader_epoch", Int32), ("replicas", Array(Int32)), ("isr", Array(Int32)),
                                     ("offline_replicas", Array(Int32)))),
                ("topic_authorized_operations", Int32))),
            ("cluster_authorized_operations", Int32),
        )

    class MetadataRequestV8(RequestStruct):
        API_KEY = 3
        API_VERSION = 8
        RESPONSE_TYPE = MetadataResponseV8
        SCHEMA = Schema(("topics", Array(String("utf-8"))), ("allow_auto_topic_creation", Boolean),
                        ("include_cluster_authorized_operations", Boolean),
                        ("include_topic_authorized_operations", Boolean))

    class AuthorizedMetadataRequest(Request[MetadataRequestV8]):
        API_KEY = 3

        def __init__(self, topics: list[str] | None) -> None:
            self.topics = topics

        def build(self, request_struct_class: type[MetadataRequestV8]) -> MetadataRequestV8:
            return request_struct_class(self.topics, False, False, True)

    class DescribeGroupsResponseV3(Response):
        API_KEY = 15
        API_VERSION = 3
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("groups", Array(
                ("error_code", Int16), ("group", String("utf-8")), ("state", String("utf-8")),
                ("protocol_type", String("utf-8")), ("protocol", String("utf-8")),
                ("members", Array(("member_id", String("utf-8")), ("client_id", String("utf-8")),
                                  ("client_host", String("utf-8")), ("member_metadata", Bytes),
                                  ("member_assignment", Bytes))),
                ("authorized_operations", Int32))),
        )

    class DescribeGroupsRequestV3(RequestStruct):
        API_KEY = 15
        API_VERSION = 3
        RESPONSE_TYPE = DescribeGroupsResponseV3
        SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))

    class AuthorizedDescribeGroups(Request[DescribeGroupsRequestV3]):
        API_KEY = 15

        def __init__(self, groups: list[str]) -> None:
            self.groups = groups

        def build(self, request_struct_class: type[DescribeGroupsRequestV3]) -> DescribeGroupsRequestV3:
            return request_struct_class(self.groups, True)

    return AuthorizedMetadataRequest, AuthorizedDescribeGroups


# --------------------------------------------------------------------------- what the worker needs


@dataclass(frozen=True)
class AccessPlan:
    """Every topic and group a worker uses, by what it does with them (its ACL recipe).

    ``internal``: topics Faust declares itself (table changelogs, the leader topic), all named
    ``<group>-...``: READ (recovery), WRITE, DESCRIBE, and CREATE while they do not exist."""

    group: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    internal: tuple[str, ...] = ()
    extra_read: tuple[str, ...] = field(default=())  # e.g. the archive tap re-reading outputs

    def topic_needs(self) -> dict[str, tuple[str, ...]]:
        """topic -> the operations it needs (DESCRIBE always: metadata and offsets)."""
        needs: dict[str, list[str]] = {}
        for t in (*self.read, *self.extra_read):
            needs.setdefault(t, []).extend(["READ", "DESCRIBE"])
        for t in self.write:
            needs.setdefault(t, []).extend(["WRITE", "DESCRIBE"])
        for t in self.internal:
            needs.setdefault(t, []).extend(["READ", "WRITE", "DESCRIBE"])
        return {t: tuple(dict.fromkeys(ops)) for t, ops in needs.items()}


def acl_command(principal: str, operation: str, *, topic: str | None = None, group: str | None = None,
                prefixed: bool = False, bootstrap: str = "<bootstrap>") -> str:
    """The ``kafka-acls.sh`` command that grants one operation on one resource."""
    resource = f"--topic '{topic}'" if topic is not None else f"--group '{group}'"
    pattern = " --resource-pattern-type prefixed" if prefixed else ""
    return (f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
            f"--allow-principal '{principal}' --operation {operation} {resource}{pattern}")


def recipe_commands(plan: AccessPlan, principal: str, bootstrap: str = "<bootstrap>") -> list[str]:
    """The whole ACL recipe for a worker (docs/deploy.md prints the same for an example topology)."""
    out: list[str] = []
    for topic, ops in plan.topic_needs().items():
        if topic in plan.internal:
            continue
        out += [acl_command(principal, op, topic=topic, bootstrap=bootstrap) for op in ops]
    if plan.internal:
        out += [acl_command(principal, op, topic=f"{plan.group}-", prefixed=True, bootstrap=bootstrap)
                for op in ("CREATE", "READ", "WRITE", "DESCRIBE")]
    out.append(acl_command(principal, "READ", group=plan.group, bootstrap=bootstrap))
    return out


# --------------------------------------------------------------------------- connecting


def _split(server: str) -> tuple[str, int]:
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


async def _connect(settings: BrokerSettings, host: str, port: int, timeout: float) -> Any:
    from aiokafka.conn import create_conn

    kwargs = settings.aiokafka_kwargs()
    return await asyncio.wait_for(create_conn(host, port, request_timeout_ms=int(timeout * 1000),
                                              client_id="prism-preflight", **kwargs), timeout)


def _translate(settings: BrokerSettings, server: str, exc: BaseException) -> BrokerPreflightError | None:
    """A decisive failure (auth, TLS) as the error to stop with; None for one worth trying elsewhere."""
    from aiokafka.errors import AuthenticationFailedError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

    if isinstance(exc, SaslAuthenticationFailed | AuthenticationFailedError):
        return BrokerPreflightError(
            f"SASL authentication failed for user {settings.sasl_username!r} with {settings.sasl_mechanism} "
            f"({exc.__class__.__name__})", code="kafka_auth_failed", path=server,
            hint="check PRISM_SASL_USERNAME/PRISM_SASL_PASSWORD and that the user exists for this mechanism "
                 "(kafka-configs.sh --describe --entity-type users)")
    if isinstance(exc, UnsupportedSaslMechanismError):
        return BrokerPreflightError(f"the broker does not offer SASL mechanism {settings.sasl_mechanism}",
                                    code="kafka_auth_failed", path=server,
                                    hint="set PRISM_SASL_MECHANISM to one the listener enables")
    tls = exc if isinstance(exc, ssl.SSLError) else exc.__cause__ or exc.__context__
    if isinstance(tls, ssl.SSLCertVerificationError):
        ca = str(settings.ssl_cafile) if settings.ssl_cafile else "the system CA store"
        return BrokerPreflightError(
            f"TLS handshake failed: the broker's certificate is not trusted by {ca} ({tls.verify_message})",
            code="kafka_tls_failed", path=server,
            hint="set PRISM_SSL_CAFILE to the CA that signed the brokers' certificates")
    if isinstance(tls, ssl.SSLError):
        reason = getattr(tls, "reason", None) or str(tls)
        if settings.ssl_certfile is not None:
            return BrokerPreflightError(
                f"TLS handshake failed: the broker rejected client certificate {str(settings.ssl_certfile)!r} "
                f"({reason})", code="kafka_tls_failed", path=server,
                hint="use a certificate signed by a CA in the broker's ssl.truststore (and not expired)")
        return BrokerPreflightError(
            f"TLS handshake failed ({reason}); the listener may require a client certificate",
            code="kafka_tls_failed", path=server,
            hint="set PRISM_SSL_CERTFILE and PRISM_SSL_KEYFILE (mutual TLS), or check PRISM_SECURITY_PROTOCOL")
    return None


async def check_connection(settings: BrokerSettings, *, timeout: float = 15.0) -> None:
    """Connect (TLS, SASL) to the first bootstrap server that answers; raise on the first decisive
    failure. Only unreachable servers are skipped, so a wrong password is never retried."""
    last: BaseException | None = None
    for server in settings.bootstrap_servers:
        host, port = _split(server)
        try:
            conn = await _connect(settings, host, port, timeout)
        except (OSError, TimeoutError, RuntimeError) as exc:  # KafkaError is a RuntimeError
            decisive = _translate(settings, server, exc)
            if decisive is not None:
                raise decisive from None
            last = exc
            continue
        conn.close()
        return
    if isinstance(last, ConnectionRefusedError):
        why = "connection refused: nothing listens there"
    elif isinstance(last, TimeoutError | asyncio.TimeoutError):
        why = f"no answer within {timeout:g}s"
    else:
        why = f"{type(last).__name__}: {last}"
    raise BrokerPreflightError(f"cannot reach Kafka at {settings.bootstrap} ({why})",
                               code="kafka_unreachable", path="PRISM_BROKER_URL",
                               hint="check that the broker runs and that PRISM_BROKER_URL is its host:port list "
                                    "(and PRISM_SECURITY_PROTOCOL the listener's)")


# --------------------------------------------------------------------------- authorization


def _granted(ops: int, name: str) -> bool:
    return bool(ops & (1 << OPERATIONS[name])) or bool(ops & (1 << 2))  # 2 = ALL


async def check_access(settings: BrokerSettings, plan: AccessPlan, *, timeout: float = 15.0) -> list[str]:
    """Check the plan's ACLs; raise :class:`BrokerPreflightError` naming every missing one.

    Returns notes on what could not be checked (old broker, no authorizer) - never an error."""
    from aiokafka.errors import IncompatibleBrokerVersion
    from aiokafka.protocol.admin import CreateTopicsRequest
    from aiokafka.protocol.coordination import FindCoordinatorRequest

    metadata_request, groups_request = _structs()
    principal = settings.principal or "User:ANONYMOUS"
    bootstrap = settings.bootstrap
    host, port = _split(settings.bootstrap_servers[0])
    notes: list[str] = []
    missing: list[tuple[str, str, str, bool]] = []  # (operation, kind, resource, prefixed)
    needs = plan.topic_needs()
    conn = await _connect(settings, host, port, timeout)
    try:
        try:
            # Every topic (a null list), never the needed ones by name: a broker that auto-creates
            # topics named in Metadata (the embedded one ignores allow_auto_topic_creation) made a
            # changelog with 1 partition before Faust could create it with the source's count.
            meta = await asyncio.wait_for(conn.send(metadata_request(None)), timeout)
        except (IncompatibleBrokerVersion, NotImplementedError) as exc:
            return [f"topic ACLs not checked: the broker has no Metadata v8 ({exc})"]
        absent_internal: list[str] = []
        listed = {entry[1]: entry for entry in meta.topics if entry[1] in needs}
        reported = [ops for _code, _topic, _internal, _parts, ops in meta.topics if ops != _UNKNOWN_OPS]
        rows = [listed.get(t, (_UNKNOWN_TOPIC, t, False, [], _UNKNOWN_OPS)) for t in needs]
        for code, topic, _internal, _parts, ops in rows:
            want = needs.get(topic, ())
            internal = topic in plan.internal
            if code == _TOPIC_AUTHORIZATION_FAILED:
                missing += [(op, "topic", topic, internal) for op in want]
                continue
            if code == _UNKNOWN_TOPIC:
                if internal:
                    absent_internal.append(topic)
                continue  # a missing source/output: `prism topics create` (or Faust) creates it
            if code or ops == _UNKNOWN_OPS:
                if ops == _UNKNOWN_OPS:
                    notes.append(f"{topic}: the broker did not report authorized operations")
                continue
            missing += [(op, "topic", topic, internal) for op in want if not _granted(ops, op)]
        # The CREATE probe (validate_only) only where the broker enforces ACLs (it reported
        # authorized operations): a broker that ignores validate_only would create the topic.
        if absent_internal and reported:
            probe = CreateTopicsRequest([(t, 1, -1, [], []) for t in absent_internal], int(timeout * 1000), True)
            with contextlib.suppress(IncompatibleBrokerVersion, NotImplementedError):
                created = await asyncio.wait_for(conn.send(probe), timeout)
                for entry in created.topic_errors:
                    if entry[1] == _TOPIC_AUTHORIZATION_FAILED:
                        missing.append(("CREATE", "topic", entry[0], True))
        # The group: find its coordinator (which itself needs DESCRIBE), then ask it.
        found = await asyncio.wait_for(conn.send(FindCoordinatorRequest(plan.group, 0)), timeout)
        if found.error_code == _GROUP_AUTHORIZATION_FAILED:
            missing.append(("READ", "group", plan.group, False))
        elif found.error_code == 0:
            coordinator = conn
            if (found.host, found.port) != (host, port):
                coordinator = await _connect(settings, found.host, found.port, timeout)
            try:
                described = await asyncio.wait_for(coordinator.send(groups_request([plan.group])), timeout)
                for entry in described.groups:
                    code, ops = entry[0], entry[-1]
                    if code == _GROUP_AUTHORIZATION_FAILED or (ops != _UNKNOWN_OPS and code == 0
                                                               and not _granted(ops, "READ")):
                        missing.append(("READ", "group", plan.group, False))
            except (IncompatibleBrokerVersion, NotImplementedError) as exc:
                notes.append(f"group ACLs not checked: the broker has no DescribeGroups v3 ({exc})")
            finally:
                if coordinator is not conn:
                    coordinator.close()
        else:
            notes.append(f"group {plan.group}: FindCoordinator answered error {found.error_code}")
    finally:
        conn.close()
    if missing:
        missing = list(dict.fromkeys(missing))
        what = ", ".join(f"{op} on {kind} {name!r}" for op, kind, name, _ in missing)
        commands = []
        for op, kind, name, internal in missing:
            if kind == "group":
                commands.append(acl_command(principal, op, group=name, bootstrap=bootstrap))
            elif internal:
                commands.append(acl_command(principal, op, topic=f"{plan.group}-", prefixed=True,
                                            bootstrap=bootstrap))
            else:
                commands.append(acl_command(principal, op, topic=name, bootstrap=bootstrap))
        raise BrokerPreflightError(
            f"principal {principal} lacks ACL(s): {what}", code="kafka_acl_missing", path=bootstrap,
            hint="add them (docs/deploy.md, 'Kafka with SASL_SSL / mTLS and ACLs'): "
                 + " && ".join(dict.fromkeys(commands)))
    return notes


# --------------------------------------------------------------------------- running it


def run_isolated(coro: Any, *, timeout: float) -> Any:
    """Run ``coro`` to completion on a private event loop in a helper thread, bounded by ``timeout``.

    Why a thread: ``asyncio.run`` here would leave the caller's thread with no current event
    loop, and the Faust app (built before or after) binds ``asyncio.get_event_loop()``; and
    callers inside a running loop (tests, async code) could not run a second loop at all."""

    async def bounded() -> Any:
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            raise BrokerPreflightError(f"the broker did not answer the start-up checks within {timeout:g}s",
                                       code="kafka_unreachable", path="PRISM_BROKER_URL",
                                       hint="check that the brokers are up and PRISM_BROKER_URL names a "
                                            "listener with PRISM_SECURITY_PROTOCOL") from None

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prism-preflight") as pool:
        return pool.submit(asyncio.run, bounded()).result()


def preflight(settings: BrokerSettings, plan: AccessPlan | None = None, *, timeout: float = 20.0) -> list[str]:
    """Connection check, then (with a plan) the ACL check; returns notes, raises the one-line error."""

    async def both() -> list[str]:
        await check_connection(settings, timeout=timeout)
        return await check_access(settings, plan, timeout=timeout) if plan is not None else []

    return list(run_isolated(both(), timeout=timeout))


def plan_for(pipeline: Any) -> AccessPlan:
    """The access plan of a ``PipelineApp``: its sources, everything it writes (outputs, archive
    topic, DLQs), the archive tap's inputs, Faust's own topics and the consumer group."""
    app = pipeline.app
    internal = [table.changelog_topic.get_topic_name() for table in app.tables.values()]
    if not app.conf.topic_disable_leader:
        internal.append(app.assignor.leader_assignor._leader_topic_name)
    topology = pipeline.topology
    tap = topology.archive_source_topics() if getattr(pipeline, "archive", None) is not None else []
    return AccessPlan(group=str(app.conf.id), read=tuple(s.topic for s in topology.sources),
                      write=tuple(pipeline.write_topics), internal=tuple(dict.fromkeys(internal)),
                      extra_read=tuple(tap))
