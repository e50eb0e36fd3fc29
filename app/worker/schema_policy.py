"""RFC-030 "Migration Path" phase 2 at the worker: a namespace whose registry policy requires a
schema is not read by a topology that has none.

The registry cannot enforce ``require_schema`` itself - it creates no topics - so the check is
where topics are used: here, when ``prism run`` starts (collected with the other start-up
problems, before any broker is touched), and in the SDK's publish (``app.sdk.schemas``).

Which registry: ``PRISM_REGISTRY_URL`` (the one ``prism schema`` commands use), with the
registry credentials of ``PRISM_REGISTRY_USER``/``_PASSWORD`` or ``_TOKEN`` (the read role is
enough). A worker not told where its registry is cannot know the policy and does not check;
one that is told but cannot read it refuses to start, since reading a namespace that may
require a schema without knowing is exactly what the policy forbids.

A topology with ``stages.enrich.schema`` satisfies the policy for every namespace it reads
(any registry type, git and file included: the schema is resolved, stamped on every envelope
and can be validated against); the registry is then not even asked.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping

from app.errors import ConfigError
from app.topology import Topology

REGISTRY_URL_ENV = "PRISM_REGISTRY_URL"


def namespaces_read(topology: Topology) -> dict[str, list[str]]:
    """Namespace -> the source topics it can arrive on: each source's default namespace, and
    every namespace that ``producers:`` may claim or ``namespaces:`` configures (an envelope's
    own namespace is what the enrich stage and a consumer see)."""
    sources = [s.topic for s in topology.sources]
    out: dict[str, list[str]] = {}

    def add(ns: str, topics: list[str]) -> None:
        seen = out.setdefault(ns, [])
        seen.extend(t for t in topics if t not in seen)

    for s in topology.sources:
        add(s.namespace or topology.namespace, [s.topic])
    for p in topology.producers or []:
        for ns in p.namespaces:
            add(ns, list(p.topics) if p.topics else sources)
    for ns in topology.namespaces:
        add(ns, sources)
    return out


def check_schema_policy(topology: Topology, *, registry_url: str | None = None,
                        env: Mapping[str, str] | None = None) -> None:
    """Raise one ``ConfigError`` naming every namespace this topology reads whose effective
    registry policy has ``require_schema``, when the topology has no schema (module docs)."""
    enrich = topology.stage("enrich")
    if enrich is not None and enrich.schema_ is not None:
        return
    env = os.environ if env is None else env
    url = (registry_url or env.get(REGISTRY_URL_ENV) or "").rstrip("/")
    if not url:
        return
    from app.schema.resolve import SchemaResolutionError, _http_json

    required: list[str] = []
    read = namespaces_read(topology)
    for ns in sorted(read):
        try:
            policy = _http_json(f"{url}/v1/policies/{urllib.parse.quote('ns:' + ns, safe='')}", timeout=5.0)
        except SchemaResolutionError as exc:
            raise ConfigError(f"cannot read the schema policy of namespace {ns!r} from the registry: {exc}",
                              path=REGISTRY_URL_ENV,
                              hint="start the registry or fix PRISM_REGISTRY_URL / its credentials; unset "
                                   "PRISM_REGISTRY_URL only if no namespace's policy may require a schema") from None
        if isinstance(policy, dict) and policy.get("require_schema") is True:
            required.append(ns)
    if not required:
        return
    listed = "; ".join(f"{ns!r} (read from {', '.join(read[ns])})" for ns in required)
    first = required[0]
    raise ConfigError(
        f"the schema registry's policy requires a schema for namespace(s) {listed}, and this topology has no "
        "schema (stages.enrich.schema)", path="stages.enrich.schema",
        hint=f"register the topic's schema and add `- enrich: {{schema: {{registry_type: prism, url: {url}, "
             f"subject: {read[first][0]}}}}}` to the stages, or lift the policy: "
             f"prism schema policy set --namespace {first} --no-require-schema")


__all__ = ["REGISTRY_URL_ENV", "check_schema_policy", "namespaces_read"]
