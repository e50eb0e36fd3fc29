"""The cluster manifests (deploy/): rendered by kubectl's kustomize, every object valid against
the Kubernetes OpenAPI schemas, and - what a schema cannot see - consistent with the code they
run: command lines the CLI accepts, probes on paths the worker and the registry serve, a grace
period longer than the worker's drain, a topology that loads, writable paths on volumes; workers
that survive a node's loss (replicas, PDB, spread) with stable, disjoint archive writers; a
registry fenced by a NetworkPolicy; the Kafka CA and client certificate where the worker reads
them; a ServiceMonitor and alert rules that scrape the right ports and name only real metrics."""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from tests.deploy.conftest import (
    DEPLOY,
    ROOT,
    UsageError,
    archive_metrics,
    as_scraped,
    command_line,
    container,
    find,
    parse_prism,
    pod_spec,
    render,
)
from tests.deploy.test_dashboard import analyse, exported
from tests.support import require, require_broker_binary

WORKLOADS = ("Deployment", "StatefulSet", "CronJob")
K8S_VERSION = kubernetes_validate.latest_version()


# --------------------------------------------------------------------------- schema validity


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_every_object_is_valid_against_the_kubernetes_schemas(which, request):
    objs = request.getfixturevalue(which)
    kinds = sorted(o["kind"] for o in objs)
    assert {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "CronJob",
            "ConfigMap"} <= set(kinds), kinds
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes {K8S_VERSION}: {exc}")


def test_the_validator_rejects_what_kubernetes_would(base):
    """The schema check above is only worth something if it fails on real mistakes."""
    worker = find(base, "StatefulSet", "prism-worker")
    for mutate in (
        lambda d: container(d, "worker")["livenessProbe"]["httpGet"].update(pathh="/healthz"),   # unknown field
        lambda d: container(d, "worker")["ports"][0].update(containerPort="6066"),               # wrong type
        lambda d: d["spec"].pop("selector"),                                                     # required
    ):
        bad = copy.deepcopy(worker)
        mutate(bad)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


# --------------------------------------------------------------------------- images, secrets, security


def test_every_image_is_retargetable_by_the_kustomization(base, overlay):
    images = {i["name"] for i in yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"]}
    used = {c["image"].rsplit(":", 1)[0] for o in base if o["kind"] in WORKLOADS for c in pod_spec(o)["containers"]}
    assert used and used <= images, f"images not listed under images: in the kustomization: {used - images}"
    assert find(base, "CronJob", "prism-lake").get("kind") and "localhost/prism-lake" in used
    over = [c["image"] for o in overlay if o["kind"] in WORKLOADS for c in pod_spec(o)["containers"]]
    assert over and not [i for i in over if i.startswith("localhost/")], over
    assert all(o["metadata"].get("namespace") == "prism" for o in overlay if o["kind"] != "Namespace")


def test_no_key_material_is_shipped_only_secret_references(base):
    assert not [o for o in base if o["kind"] == "Secret"], "real keys never live in the repository"
    worker = find(base, "StatefulSet", "prism-worker")
    keys = [v for v in pod_spec(worker)["volumes"] if v["name"] == "keys"]
    assert keys == [{"name": "keys", "secret": {"secretName": "prism-keys", "defaultMode": 0o440}}]
    registry_env = container(find(base, "Deployment", "prism-registry"), "registry")["env"]
    (db,) = [e for e in registry_env if e["name"] == "PRISM_REGISTRY_DB"]
    assert db["valueFrom"]["secretKeyRef"] == {"name": "prism-registry", "key": "PRISM_REGISTRY_DB"}
    registry = find(base, "Deployment", "prism-registry")
    users = [v for v in pod_spec(registry)["volumes"] if v["name"] == "users"]
    assert users == [{"name": "users", "secret": {"secretName": "prism-registry-users", "defaultMode": 0o440}}]


def test_pods_run_as_non_root_on_a_read_only_root(base):
    for obj in base:
        if obj["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert "/tmp" in mounts, f"{c['name']}: a read-only root needs a writable /tmp"
            assert "requests" in c["resources"] and "limits" in c["resources"], c["name"]


def _writable(c: dict[str, Any], path: str) -> bool:
    return any(Path(path).is_relative_to(m["mountPath"]) for m in c["volumeMounts"] if not m.get("readOnly"))


# --------------------------------------------------------------------------- the worker


def _worker(base: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    dep = find(base, "StatefulSet", "prism-worker")
    c = container(dep, "worker")
    path, params = parse_prism(command_line(c))
    assert path == ["run"], path
    return dep, c, params


def test_worker_command_line_is_accepted_by_prism_run(base):
    _, c, params = _worker(base)
    assert params["web_port"] is not None, "no --web-port: no probes, no metrics"
    assert params["web_bind"] == "0.0.0.0", "the kubelet probes the pod IP, not the pod's loopback"
    assert params["dev_keys"] is False, "development keys must not be created in a cluster"
    assert _writable(c, str(params["data_dir"])), "the RocksDB data dir must be on a writable volume"
    (data,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(params["data_dir"])]
    # durable state: the data dir is the pod's own PVC (volumeClaimTemplates), not an emptyDir
    sts = find(base, "StatefulSet", "prism-worker")
    templates = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert data["name"] in templates and data["name"] not in {v["name"] for v in pod_spec(sts)["volumes"]}
    spec = templates[data["name"]]["spec"]
    assert spec["accessModes"] == ["ReadWriteOnce"] and spec["resources"]["requests"]["storage"]


def test_a_wrong_flag_in_a_manifest_would_be_caught():
    with pytest.raises(UsageError):
        parse_prism(["prism", "run", "--web-prot=6066"])
    with pytest.raises(typer.BadParameter):
        parse_prism(["prism", "lake", "compact", "/a", "/t", "--max-files=lots"])
    with pytest.raises(UsageError):
        parse_prism(["prism", "lake", "compactt", "/a", "/t"])


def test_worker_ports_and_probes_agree(base):
    dep, c, params = _worker(base)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": params["web_port"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        port = c[probe]["httpGet"]["port"]
        assert ports.get(port, port) == params["web_port"], probe
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(params["web_port"])
    svc = find(base, "Service", "prism-worker")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    pdb = find(base, "PodDisruptionBudget", "prism-worker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # the web port carries the management API (pause/resume/restart): not open to the whole cluster
    policy = find(base, "NetworkPolicy", "prism-worker")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [ports.get(p["port"], p["port"]) for p in rule["ports"]] == [params["web_port"]]
    assert all(peer.keys() <= {"podSelector", "namespaceSelector"} and "ipBlock" not in peer for peer in rule["from"])


def test_worker_probes_are_paths_the_worker_serves(base):
    from app.worker.management import OPENAPI

    _, c, _ = _worker(base)
    served = set(OPENAPI["paths"])
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")} <= served
    annotations = find(base, "StatefulSet", "prism-worker")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in served


def test_grace_period_exceeds_the_workers_drain(base):
    """SIGTERM: the archive tap commits its open roll (bounded by STOP_TIMEOUT_S) after the hole
    fetcher's last read (bounded by its timeout); the kubelet's SIGKILL must come later."""
    from mode import Service

    from app.worker.archive_service import STOP_TIMEOUT_S
    from app.worker.continuity import HoleFetcher

    hole_fetch = inspect.signature(HoleFetcher.__init__).parameters["timeout_s"].default
    drain = STOP_TIMEOUT_S + hole_fetch
    grace = pod_spec(find(base, "StatefulSet", "prism-worker"))["terminationGracePeriodSeconds"]
    assert grace > drain, f"terminationGracePeriodSeconds {grace} <= the worker's drain bound {drain:g}s"
    assert grace > Service.shutdown_timeout, "longer than one Faust service's own shutdown wait"


def _env(c: dict[str, Any], objs: list[dict[str, Any]], field_values: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: `envFrom` ConfigMaps (Secrets
    left out: not shipped), then `env` in order, `fieldRef`s from `field_values` and `$(VAR)`
    expanded from variables defined EARLIER in the list (the kubelet's rule)."""
    out: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            out.update(find(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for e in c.get("env", []):
        if "value" in e:
            value = e["value"]
            for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value):
                assert ref in out, f"{e['name']}: $({ref}) is not defined before it in the container's env"
                value = value.replace(f"$({ref})", out[ref])
            out[e["name"]] = value
        elif "fieldRef" in e.get("valueFrom", {}):
            out[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


def _pod_fields(name: str, index: int) -> dict[str, str]:
    """Downward API fields of StatefulSet pod `index` (the pod-index label: Kubernetes >= 1.28)."""
    return {"metadata.name": f"{name}-{index}", "metadata.namespace": "prism",
            "metadata.labels['apps.kubernetes.io/pod-index']": str(index),
            "metadata.labels['controller-revision-hash']": f"{name}-5d8f7c9b6"}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions In/NotIn/Exists) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for ex in selector.get("matchExpressions", []):
        value, op = labels.get(ex["key"]), ex["operator"]
        if (op == "In" and value not in ex["values"]) or (op == "NotIn" and value in ex["values"]) or \
                (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def test_workers_are_replicated_in_one_group_with_stable_disjoint_archive_writers(base, tmp_path):
    """High availability without double archiving: several pods of one StatefulSet (one Faust
    consumer group: one topology, one app id), each archiving under its pod name - stable across
    restarts, never two at once - and a disjoint share of the partitions that together cover all."""
    from app.worker.archive_service import (
        SHARD_ENV,
        WRITER_ID_ENV,
        check_writer_id,
        default_writer_id,
        parse_shard,
        shard_partitions,
    )

    sts, c, _ = _worker(base)
    replicas = sts["spec"]["replicas"]
    assert replicas > 1, "one worker pod: a node drain or crash stops the pipeline"
    topo = _topology_from_configmap(base, sts, tmp_path)
    assert topo.archive.enabled, "this test is about archiving workers"
    svc = find(base, "Service", "prism-worker")
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    name = sts["metadata"]["name"]
    writers, shards = [], []
    for i in range(replicas):
        env = _env(c, base, _pod_fields(name, i))
        writer = check_writer_id(default_writer_id(env=env))
        assert writer == f"{name}-{i}", "the writer id is the pod name (downward API)"
        writers.append(writer)
        shard = parse_shard(env[SHARD_ENV])
        assert shard == (i, replicas), f"pod {i}: {SHARD_ENV}={env[SHARD_ENV]!r} must be <index>/<replicas>"
        shards.append(shard)
    assert len(set(writers)) == replicas
    spec = next(e for e in c["env"] if e["name"] == WRITER_ID_ENV)
    assert spec["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for partitions in range(1, 13):  # every partition archived exactly once between the pods
        counts = {"orders.created.v3": partitions}
        owned = [tp for s in shards for tp in shard_partitions(counts, s) or []]
        assert sorted(owned) == [("orders.created.v3", p) for p in range(partitions)], partitions
    # without the pod-index label (Kubernetes < 1.28) the shard is "/N": the worker refuses to start
    with pytest.raises(Exception, match="archive shard"):
        parse_shard(_env(c, base, {**_pod_fields(name, 0), "metadata.labels['apps.kubernetes.io/pod-index']": ""})[
            SHARD_ENV])


@pytest.mark.parametrize("which", ["base", "overlay"])
def test_a_rollout_replaces_the_topology_and_a_second_deployment_is_refused(which, request):
    """The group topology check protects the cluster: no blanket PRISM_REPLACE_TOPOLOGY, and the
    rollout owner every pod derives from its downward-API fields is the same for every pod and
    revision of this StatefulSet (its rolling update joins) but another for the same manifests
    under another name or namespace (an accidental second deployment is refused)."""
    from app.worker.group_topology import REPLACE_ENV, Member, TopologyMismatch, judge_members, rollout_owner

    objs = request.getfixturevalue(which)
    sts, c, params = _worker(objs)
    assert not params.get("replace_topology"), "--replace-topology in the manifest disables the check"
    name = sts["metadata"]["name"]
    owners = set()
    for i in range(sts["spec"]["replicas"]):
        for revision in ("5d8f7c9b6", "77c4d9f8b"):  # the old and the new template
            env = _env(c, objs, {**_pod_fields(name, i), "metadata.labels['controller-revision-hash']":
                                 f"{name}-{revision}"})
            assert env.get(REPLACE_ENV, "") in ("", "0", "false"), f"{REPLACE_ENV} set in the manifests"
            owners.add(rollout_owner(env))
    (owner,) = owners
    assert owner is not None
    copy_env = _env(c, objs, {**_pod_fields(name + "-copy", 0), "metadata.namespace": "prism"})
    other_ns = _env(c, objs, {**_pod_fields(name, 0), "metadata.namespace": "staging"})
    old = {"prism-worker-0": Member("aaaaaaaaaaaa", owner), "prism-worker-1": Member("aaaaaaaaaaaa", owner)}
    assert judge_members(old, "bbbbbbbbbbbb", owner)  # the StatefulSet's own rolling update joins
    for stranger in (copy_env, other_ns, {}):
        with pytest.raises(TopologyMismatch):
            judge_members(old, "bbbbbbbbbbbb", rollout_owner(stranger))


def test_worker_pdb_protects_and_pods_spread_over_nodes(base):
    sts, _, _ = _worker(base)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    replicas = sts["spec"]["replicas"]
    assert _matches(sts["spec"]["selector"], labels)
    pdb = find(base, "PodDisruptionBudget", "prism-worker")
    assert _matches(pdb["spec"]["selector"], labels), "the PDB must select the worker pods"
    spec = pdb["spec"]
    if "maxUnavailable" in spec:
        assert 1 <= spec["maxUnavailable"] < replicas, "a drain must leave workers running, yet be allowed"
    else:
        assert 1 <= spec["minAvailable"] < replicas, "minAvailable >= replicas would block every drain"
    spread = pod_spec(sts)["topologySpreadConstraints"]
    hosts = [s for s in spread if s["topologyKey"] == "kubernetes.io/hostname"]
    assert hosts and all(_matches(s["labelSelector"], labels) for s in spread)


def test_registry_is_spread_over_nodes_and_fenced_by_a_network_policy(base):
    registry = find(base, "Deployment", "prism-registry")
    labels = registry["spec"]["template"]["metadata"]["labels"]
    assert registry["spec"]["replicas"] > 1
    spread = pod_spec(registry).get("topologySpreadConstraints", [])
    anti = pod_spec(registry).get("affinity", {}).get("podAntiAffinity", {})
    hard = [s for s in spread if s["topologyKey"] == "kubernetes.io/hostname" and s["whenUnsatisfiable"] == "DoNotSchedule"]
    assert hard or anti, "two registry replicas on one node fall together"
    assert all(_matches(s["labelSelector"], labels) for s in spread)
    pdb = find(base, "PodDisruptionBudget", "prism-registry")
    assert _matches(pdb["spec"]["selector"], labels) and pdb["spec"]["minAvailable"] < registry["spec"]["replicas"]

    policy = find(base, "NetworkPolicy", "prism-registry")
    assert _matches(policy["spec"]["podSelector"], labels), "the policy must select the registry pods"
    assert not _matches(policy["spec"]["podSelector"], find(base, "StatefulSet", "prism-worker")["spec"]["template"][
        "metadata"]["labels"]), "and only them"
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    port = {p["name"]: p["containerPort"] for p in container(registry, "registry")["ports"]}
    (rule,) = policy["spec"]["ingress"]
    assert [port.get(p["port"], p["port"]) for p in rule["ports"]] == [port["http"]], "only the registry's port"
    peers = rule["from"]
    assert all("ipBlock" not in peer for peer in peers), "no address ranges: pods and namespaces only"
    worker_labels = find(base, "StatefulSet", "prism-worker")["spec"]["template"]["metadata"]["labels"]
    assert any("namespaceSelector" not in p and p["podSelector"].get("matchLabels") and
               _matches(p["podSelector"], worker_labels) for p in peers), "the workers by name"
    assert {"podSelector": {}} in peers, "the namespace's clients"
    assert all(set(p) == {"podSelector"} or p["namespaceSelector"]["matchLabels"] ==
               {"kubernetes.io/metadata.name": "monitoring"} for p in peers), "other namespaces: only Prometheus"
    egress_ports = {(p["port"], p.get("protocol", "TCP")) for r in policy["spec"]["egress"] for p in r["ports"]}
    assert egress_ports == {(5432, "TCP"), (53, "UDP"), (53, "TCP")}, "PostgreSQL and DNS, nothing else"


def _mounted_file(objs: list[dict[str, Any]], c: dict[str, Any], spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The Secret volume item behind file `path` in container `c` (fails if nothing is mounted there)."""
    (mount,) = [m for m in c["volumeMounts"] if Path(path).parent == Path(m["mountPath"])] or [None]
    assert mount is not None, f"{path}: no volume is mounted at {Path(path).parent}"
    assert mount.get("readOnly") is True
    (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "secret" in vol, f"{path}: key material comes from a Secret"
    items = {i["path"]: i["key"] for i in vol["secret"].get("items", [])}
    name = Path(path).name
    assert not items or name in items, f"{path}: the Secret volume does not project {name}"
    assert not [o for o in objs if o["kind"] == "Secret"], "the Secret is created by the operator, not shipped"
    return {"secret": vol["secret"]["secretName"], "key": items.get(name, name), "mode": vol["secret"].get("defaultMode")}


def _composed(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """What an operator's overlay renders to: the example overlay plus `components` (paths under
    deploy/), in namespace prism. kustomize needs relative paths, so the kustomization points back."""
    rel = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "prism",
        "resources": [f"{rel}/overlays/example"], "components": [f"{rel}/{c}" for c in components]}))
    return render(tmp_path)


def test_sasl_ssl_overlay_mounts_the_ca_where_prism_ssl_cafile_points(overlay, tmp_path):
    sts = find(overlay, "StatefulSet", "prism-worker")
    c = container(sts, "worker")
    env = _env(c, overlay, _pod_fields("prism-worker", 0))
    assert env["PRISM_SECURITY_PROTOCOL"] == "SASL_SSL"
    ca = _mounted_file(overlay, c, pod_spec(sts), env["PRISM_SSL_CAFILE"])
    assert ca["secret"] == "prism-kafka-ca" and ca["key"] == "ca.crt"
    assert "PRISM_SSL_CERTFILE" not in env, "the client certificate is the optional component's"
    # mutual TLS: the component adds the client certificate and key, from a kubernetes.io/tls Secret
    objs = _composed(tmp_path, "components/kafka-client-cert")
    sts = find(objs, "StatefulSet", "prism-worker")
    c = container(sts, "worker")
    env = _env(c, objs, _pod_fields("prism-worker", 0))
    cert = _mounted_file(objs, c, pod_spec(sts), env["PRISM_SSL_CERTFILE"])
    key = _mounted_file(objs, c, pod_spec(sts), env["PRISM_SSL_KEYFILE"])
    assert (cert["secret"], cert["key"], key["secret"], key["key"]) == ("prism-kafka-client-cert", "tls.crt",
                                                                      "prism-kafka-client-cert", "tls.key")
    assert key["mode"] == 0o440, "the private key is not world-readable"
    assert _mounted_file(objs, c, pod_spec(sts), env["PRISM_SSL_CAFILE"])["secret"] == "prism-kafka-ca"
    password = next(e for e in c["env"] if e["name"] == "PRISM_SSL_KEY_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"]["optional"] is True
    for obj in objs:
        if obj["kind"] in WORKLOADS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --------------------------------------------------------------------------- monitoring (optional component)


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory) -> list[dict[str, Any]]:
    return _composed(tmp_path_factory.mktemp("monitoring"), "monitoring")


@pytest.fixture(scope="module")
def scraped_metrics() -> dict[str, set[str]]:
    """Every series the alert rules may name, with its labels as Prometheus stores them: what a
    worker and a registry export (tests/deploy/test_dashboard.py fixtures' sources), the archive
    tap's, target labels, `up` and kube-state-metrics'."""
    from app.observability.metrics import PipelineMetrics
    from app.schema.metrics import RegistryMetrics

    m = PipelineMetrics()
    m.message_in("orders.created", "normalize")
    m.message_out("orders.created.v3", "publish")
    m.dlq("orders.created", "validate", "bad_timestamp")
    m.signature_failure("orders.created", "bad_signature")
    m.auth_failure("orders.created", "expired_token")
    m.observe_latency("orders.created", "chain", 0.0002)
    m.set_consumer_lag("orders.created", 0, 12)
    r = RegistryMetrics()
    r.request("/subjects", "GET", 200, 0.001)
    return as_scraped({**exported(m.exposition().decode()), **exported(r.exposition().decode()), **archive_metrics()})


def test_the_monitoring_component_is_not_in_the_base(base, overlay):
    """Clusters without the Prometheus Operator's CRDs must still apply base and overlay."""
    assert not [o for o in base + overlay if o["apiVersion"].startswith("monitoring.coreos.com/")]


def test_servicemonitor_scrapes_every_worker_and_registry_pod_on_its_metrics_port(monitoring):
    (sm,) = [o for o in monitoring if o["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["namespace"] == "prism"
    assert set(sm["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels"}
    selected = [s for s in monitoring if s["kind"] == "Service" and _matches(sm["spec"]["selector"],
                                                                              s["metadata"].get("labels", {}))]
    assert sorted(s["metadata"]["name"] for s in selected) == ["prism-registry", "prism-worker"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings",
                             "metricRelabelings", "honorLabels"}
    for svc in selected:
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
        workload = next(o for o in monitoring if o["kind"] in WORKLOADS and o["kind"] != "CronJob"
                        and _matches({"matchLabels": svc["spec"]["selector"]}, o["spec"]["template"]["metadata"]["labels"]))
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        container_ports = {p["name"]: p["containerPort"] for c in pod_spec(workload)["containers"] for p in c["ports"]}
        assert str(container_ports[port["targetPort"]]) == annotations["prometheus.io/port"], svc["metadata"]["name"]
        assert endpoint["path"] == annotations["prometheus.io/path"]
    assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])


def _rules(monitoring: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [o for o in monitoring if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "prism"
    assert set(rule["spec"]) == {"groups"}
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert len(names) == len(set(names)), "group names must be unique"
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_alert_rules_are_well_formed(monitoring):
    rules = _rules(monitoring)
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)) and all(re.fullmatch(r"Prism[A-Za-z]+", a) for a in alerts)
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert "for" not in r or re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
    for topic in ("PrismWorkerDown", "PrismConsumerLagHigh", "PrismDLQRateHigh", "PrismChainLatencyHigh",
                  "PrismArchiveStalled", "PrismLakeCompactionFailed", "PrismRegistryDown", "PrismRegistryErrors"):
        assert topic in alerts, topic


def test_every_alert_expr_parses_and_names_only_existing_metrics_and_labels(monitoring, scraped_metrics):
    services = {o["metadata"]["name"] for o in monitoring if o["kind"] == "Service"}
    cronjobs = {o["metadata"]["name"] for o in monitoring if o["kind"] == "CronJob"}
    for r in _rules(monitoring):
        try:
            selectors, grouping = analyse(r["expr"])
        except Exception as exc:  # the parser's own error type is a plain ValueError/RuntimeError
            pytest.fail(f"{r['alert']}: not valid PromQL: {exc}\n  {r['expr']}")
        assert selectors, r["alert"]
        labels_in_expr: set[str] = set()
        for name, matcher_labels in selectors:
            assert name in scraped_metrics, f"{r['alert']}: {name} is not exported (worker, registry, archive, KSM)"
            labels = scraped_metrics[name] | ({"le"} if name.endswith("_bucket") else set())
            labels_in_expr |= labels
            assert matcher_labels <= labels, f"{r['alert']}: {name} has no label(s) {matcher_labels - labels}"
        assert grouping <= labels_in_expr, f"{r['alert']}: groups by {grouping - labels_in_expr}"
        for job in re.findall(r'(?<!\w)job="([^"]+)"', r["expr"]):  # the ServiceMonitor's job = the Service name
            assert job in services, f"{r['alert']}: job {job!r} is no scraped Service"
        for cronjob in re.findall(r'cronjob="([^"]+)"|job_name=~"([^".]+)', r["expr"]):  # kube-state-metrics
            assert "".join(cronjob) in cronjobs, f"{r['alert']}: no CronJob {cronjob}"
        # every label a template names is one the expression's result can carry
        for label in re.findall(r"\$labels\.(\w+)", json.dumps(r["annotations"])):
            assert label in labels_in_expr, f"{r['alert']}: annotation uses $labels.{label}"


def test_a_misspelt_alert_metric_would_be_caught(scraped_metrics):
    (name, _), = analyse("rate(prism_dlq_message_total[10m]) > 0")[0]
    assert name not in scraped_metrics
    (name, matchers), = analyse('up{jobb="prism-worker"} == 0')[0]
    assert not matchers <= scraped_metrics[name]


# --------------------------------------------------------------------------- the topology ConfigMap


def _topology_from_configmap(objs: list[dict[str, Any]], dep: dict[str, Any], dest: Path):
    """Lay the ConfigMap out as the kubelet mounts it (volume `items`) and load it with the
    worker's own loader."""
    from app.topology import load_topology

    c = container(dep, "worker")
    (vol,) = [v for v in pod_spec(dep)["volumes"] if v["name"] == "topology"]
    cm = find(objs, "ConfigMap", "prism-topology")
    assert vol["configMap"]["name"] == cm["metadata"]["name"], "the volume must name the generated (hashed) ConfigMap"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "topology"]
    root = dest / mount["mountPath"].lstrip("/")
    for item in vol["configMap"]["items"]:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(cm["data"][item["key"]])
    _, params = parse_prism(command_line(c))
    topology_path = Path(params["topology"])
    assert topology_path.is_relative_to(mount["mountPath"]), "--topology must point into the mounted ConfigMap"
    return load_topology(root / topology_path.relative_to(mount["mountPath"]))


def test_configmap_topology_loads_with_the_workers_loader(base, tmp_path):
    from app.worker.pipeline import resolve_schema

    dep, c, _ = _worker(base)
    topo = _topology_from_configmap(base, dep, tmp_path)
    assert topo.name == "orders-created"
    enrich = topo.stage("enrich")
    assert resolve_schema(enrich, topo.base_dir) is not None, "the schema file mounted next to the topology resolves"
    keys = next(m for m in c["volumeMounts"] if m["name"] == "keys")["mountPath"]
    assert Path(topo.stage("authenticate").jwks).parent == Path(keys)
    assert Path(topo.stage("verify_signature").keyring).parent == Path(keys)
    assert _writable(c, topo.archive.path), "the archive path must be on a writable volume"


def test_deploy_topology_is_the_repository_topology_with_cluster_paths_only():
    """deploy/base/topology/ is a copy (kustomize reads only files under its directory): it may
    differ from topologies/ only in where keys and the archive live."""
    original = yaml.safe_load((ROOT / "topologies" / "orders-created.yaml").read_text())
    deployed = yaml.safe_load((DEPLOY / "base" / "topology" / "orders-created.yaml").read_text())
    for doc in (original, deployed):
        for stage in doc["stages"]:
            (name, conf), = stage.items()
            if name == "authenticate":
                conf.pop("jwks")
            if name == "verify_signature":
                conf.pop("keyring")
        doc["archive"].pop("path", None)
    assert deployed == original
    schema = "schemas/order_created.proto"
    assert (DEPLOY / "base" / "topology" / schema).read_bytes() == (ROOT / "topologies" / schema).read_bytes()


# --------------------------------------------------------------------------- registry and lake job


def test_registry_command_ports_and_probes(base, tmp_path):
    from fastapi.testclient import TestClient

    from app.schema.service import create_app

    dep = find(base, "Deployment", "prism-registry")
    c = container(dep, "registry")
    path, params = parse_prism(command_line(c))
    assert path == ["schema", "serve"] and params["host"] == "0.0.0.0"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": params["port"]}
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(params["port"])
    assert find(base, "Service", "prism-registry")["spec"]["ports"][0]["targetPort"] == "http"
    # the users file is where the Secret is mounted, and the registry authenticates with it
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "users"]
    assert Path(params["users_file"]).parent == Path(mount["mountPath"]) and mount["readOnly"] is True
    from app.security.http_auth import auth_from_settings
    from tests.support import write_users_file

    auth = auth_from_settings(users_file=write_users_file(tmp_path / "users.yaml"), jwt_config=None,
                              allow_anonymous=None, realm="prism-schema-registry", where="test")
    with TestClient(create_app(store_url=f"sqlite:///{tmp_path / 'r.db'}", auth=auth)) as client:
        # probes and the scrape carry no credentials: they must answer anyway, and only they
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["port"] == "http"
            r = client.get(c[probe]["httpGet"]["path"])
            assert r.status_code == 200, (probe, r.status_code, r.text)
        assert client.get(dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]).status_code == 200
        assert client.get("/subjects").status_code == 401


def test_lake_cronjob_reads_the_archive_the_worker_writes(base, tmp_path):
    job = find(base, "CronJob", "prism-lake-compact")
    c = container(job, "compact")
    path, params = parse_prism(command_line(c))
    assert path == ["lake", "compact"]
    topo = _topology_from_configmap(base, find(base, "StatefulSet", "prism-worker"), tmp_path)
    assert params["archive"] == topo.archive.path, "the job must read the archive the worker writes"
    assert _writable(c, params["table"]) and _writable(c, params["archive"])
    worker_vols = {v["name"]: v for v in pod_spec(find(base, "StatefulSet", "prism-worker"))["volumes"]}
    job_vols = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert job_vols["lake"] == worker_vols["lake"], "worker and job must mount the same archive volume"
    spec = job["spec"]["jobTemplate"]["spec"]
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert pod_spec(job)["restartPolicy"] == "Never"
    from app.lake.compact import EXIT_QUARANTINED

    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and set(rule["onExitCodes"]["values"]) == {2, EXIT_QUARANTINED}


# --------------------------------------------------------------------------- the worker, for real


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return -1


@pytest.mark.integration
def test_worker_started_as_the_manifest_says_answers_its_probes_and_drains_in_time(base, tmp_path):
    """`prism run` with the manifest's own arguments (paths moved under tmp_path, a free port,
    the embedded broker instead of Kafka): the probes answer 200 on the pod's address (not only
    loopback), SIGTERM ends it well inside the grace period, and it wrote nothing outside the
    volumes the manifest mounts (a read-only root would have refused it)."""
    require_broker_binary()
    from app.security.devkeys import ensure_dev_keys

    dep, c, _ = _worker(base)
    topo_file = tmp_path / "etc/prism/topology/orders-created.yaml"
    _topology_from_configmap(base, dep, tmp_path)
    keys = next(m for m in c["volumeMounts"] if m["name"] == "keys")["mountPath"]
    ensure_dev_keys(tmp_path / keys.lstrip("/"))
    text = topo_file.read_text().replace(keys, str(tmp_path / keys.lstrip("/")))
    text = text.replace("/var/lib/prism/", f"{tmp_path}/var/lib/prism/")
    topo_file.write_text(text)
    port = _free_port()
    argv = []
    for a in command_line(c)[1:]:
        if a.startswith("--web-port="):
            a = f"--web-port={port}"
        elif a.startswith(("--topology=", "--data-dir=")):
            flag, value = a.split("=", 1)
            a = f"{flag}={tmp_path}{value}"
        argv.append(a)
    cwd = tmp_path / "workdir"
    cwd.mkdir()
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}
    env.update(TMPDIR=str(tmp_path / "tmp"), HOME=str(tmp_path / "tmp"), PYTHONPATH=str(ROOT))
    # pod 0's archive writer id and shard, and its rollout identity, as the kubelet resolves them:
    # the worker must accept them
    from app.worker.archive_service import SHARD_ENV, WRITER_ID_ENV
    from app.worker.group_topology import NAMESPACE_ENV, REVISION_ENV

    pod_env = _env(c, base, _pod_fields(dep["metadata"]["name"], 0))
    env.update({k: pod_env[k] for k in (WRITER_ID_ENV, SHARD_ENV, NAMESPACE_ENV, REVISION_ENV)})
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", *argv], cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    # Not 127.0.0.1: the kubelet probes the pod IP. A socket bound to 127.0.0.1 refuses
    # 127.0.0.2; one bound to 0.0.0.0 (--web-bind) accepts it - a loopback-only proof.
    host = "127.0.0.2"
    try:
        deadline = time.monotonic() + 120
        while _get(f"http://{host}:{port}/readyz") != 200:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "worker not ready in 120 s:\n" + (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert _get(f"http://{host}:{port}{c[probe]['httpGet']['path']}") == 200, probe
        grace = pod_spec(dep)["terminationGracePeriodSeconds"]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(grace)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert took < grace / 2, f"SIGTERM took {took:.1f}s of a {grace}s grace period"
    assert list(cwd.iterdir()) == [], "the worker wrote outside its volumes (the root is read-only in the pod)"


@pytest.mark.integration
def test_lake_cronjob_command_compacts_an_archive_without_writing_outside_its_volumes(base, tmp_path):
    """The CronJob's own command line, run: paths moved under tmp_path, an empty working
    directory standing in for the read-only root. Spark must keep its scratch files in /tmp
    (TMPDIR here) and the job must commit every archived message."""
    require(shutil.which("java") is not None, "Java 17+ for Spark (the prism-lake image has it)")
    from deltalake import DeltaTable

    from app.lake.archive import ArchiveSink
    from tests.lake.conftest import make_traffic

    c = container(find(base, "CronJob", "prism-lake-compact"), "compact")
    _, params = parse_prism(command_line(c))
    archive = tmp_path / params["archive"].lstrip("/")
    traffic = make_traffic(12, seed=5)
    with ArchiveSink(str(archive), writer_id="worker") as sink:  # the worker's archive tap writer id
        sink.write(traffic.records)
    argv = [a.replace("/var/lib/prism/", f"{tmp_path}/var/lib/prism/") for a in command_line(c)[1:]]
    cwd, tmp = tmp_path / "workdir", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRISM_", "PYSPARK_", "SPARK_"))}
    env.update(TMPDIR=str(tmp), HOME=str(tmp), PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1")
    res = subprocess.run([sys.executable, "-m", "app.cli.main", *argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["exit_code"] == 0 and summary["totals"]["rows_written"] == len(traffic.ids)
    table = tmp_path / params["table"].lstrip("/")
    assert sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["message_id"]).column(0).to_pylist()) == \
        sorted(traffic.ids)
    assert list(cwd.iterdir()) == [], "the job wrote outside its volumes (the root is read-only in the pod)"
