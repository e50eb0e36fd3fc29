"""Registry authentication over real HTTP: confluent-kafka's SchemaRegistryClient with
``basic.auth.user.info`` (allowed and refused, with Confluent's status and error codes),
HTTPS with ``--ssl-certfile/--ssl-keyfile``, and ``prism schema serve`` failing fast on bad
authentication or TLS settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from app.schema.registry import Registry
from app.security.http_auth import HttpAuth
from tests.schema.conftest import ServerHandle, serve_registry
from tests.support import self_signed_cert

AVRO = '{"type":"record","name":"Reading","fields":[{"name":"t","type":"int"}]}'


def test_confluent_client_basic_auth_user_info(live_server: ServerHandle) -> None:
    writer = SchemaRegistryClient(live_server.sr_conf("writer"))
    sid = writer.register_schema("orders.readings-value", Schema(AVRO, "AVRO"))
    assert SchemaRegistryClient(live_server.sr_conf("reader")).get_schema(sid).schema_str == AVRO

    with pytest.raises(SchemaRegistryError) as e:
        SchemaRegistryClient(live_server.sr_conf("reader")).register_schema("orders.x-value", Schema(AVRO, "AVRO"))
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    with pytest.raises(SchemaRegistryError) as e:
        writer.register_schema("payments.x-value", Schema(AVRO, "AVRO"))  # outside write:orders.
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    with pytest.raises(SchemaRegistryError) as e:
        writer.set_compatibility(level="NONE")  # global config is admin's
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    with pytest.raises(SchemaRegistryError) as e:
        SchemaRegistryClient({"url": live_server.url, "basic.auth.user.info": "reader:wrong"}).get_subjects()
    assert (e.value.http_status_code, e.value.error_code) == (401, 40101)
    with pytest.raises(SchemaRegistryError) as e:
        SchemaRegistryClient({"url": live_server.url}).get_schema(sid)  # anonymous, also via the fast path
    assert (e.value.http_status_code, e.value.error_code) == (401, 40101)
    assert SchemaRegistryClient(live_server.sr_conf("admin")).delete_subject("orders.readings-value") == [1]


def test_https_with_confluent_client(registry: Registry, auth: HttpAuth, tmp_path: Path) -> None:
    certfile, keyfile = self_signed_cert(tmp_path)
    with serve_registry(registry, auth, ssl_certfile=str(certfile), ssl_keyfile=str(keyfile)) as url:
        assert url.startswith("https://")
        handle = ServerHandle(url, registry)
        client = SchemaRegistryClient({**handle.sr_conf("writer"), "ssl.ca.location": str(certfile)})
        sid = client.register_schema("orders.tls-value", Schema(AVRO, "AVRO"))
        assert client.get_schema(sid).schema_str == AVRO
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is not trusted
            httpx.get(url + "/subjects", auth=("reader", "x"))
        plain = url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):  # no plaintext on the TLS port
            httpx.get(plain + "/subjects", timeout=3)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    """``prism schema serve`` with settings that stop it before it listens."""
    env_drop = ("PRISM_REGISTRY_USERS_FILE", "PRISM_REGISTRY_JWT_CONFIG", "PRISM_REGISTRY_ALLOW_ANONYMOUS")
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([sys.executable, "-m", "app.cli.main", "schema", "serve", "--port", "1", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_serve_fails_fast_on_auth_and_tls_settings(tmp_path: Path, users_file: Path) -> None:
    r = _serve()
    assert r.returncode == 2 and "no authentication configured" in r.stderr and "--users-file" in r.stderr
    bad = tmp_path / "users.yaml"
    bad.write_text("users:\n  - user: alice\n    password: hunter2\n    roles: [admin]\n")
    r = _serve("--users-file", str(bad))
    assert r.returncode == 2 and f"{bad}: users[0]" in r.stderr and "never a password" in r.stderr
    r = _serve("--allow-anonymous", "superuser")
    assert r.returncode == 2 and "unknown role 'superuser'" in r.stderr
    r = _serve("--users-file", str(users_file), "--jwt-config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read JWT settings" in r.stderr
    certfile, _ = self_signed_cert(tmp_path)
    (tmp_path / "other").mkdir()
    _, other_key = self_signed_cert(tmp_path / "other")  # a key that is not the certificate's
    r = _serve("--users-file", str(users_file), "--ssl-certfile", str(certfile), "--ssl-keyfile", str(other_key))
    assert r.returncode == 2 and "cannot load the TLS certificate" in r.stderr
    r = _serve("--users-file", str(users_file), "--ssl-certfile", str(certfile))
    assert r.returncode == 2 and "both --ssl-certfile and --ssl-keyfile" in r.stderr
    # every problem in one run, one line each (it stopped at the first)
    r = _serve("--allow-anonymous", "superuser", "--ssl-certfile", str(certfile), "--port", "99999")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 4 and "unknown role 'superuser'" in lines[0], r.stderr
    assert "both --ssl-certfile and --ssl-keyfile" in lines[1] and "(at --port)" in lines[2], r.stderr
    assert lines[3] == "3 configuration problems; nothing was started"


def test_confluent_client_static_bearer_token(registry: Registry, users_file: Path, tmp_path: Path) -> None:
    """confluent-kafka's bearer mode (STATIC_TOKEN) against JWT verification on a real server."""
    import json
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    from app.security.http_auth import auth_from_settings

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [
        {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": "k1"}]}))
    (tmp_path / "jwt.yaml").write_text(json.dumps({"jwks_file": "jwks.json", "issuers": ["https://idp"],
                                                   "audience": "prism-registry"}))
    auth = auth_from_settings(users_file=users_file, jwt_config=tmp_path / "jwt.yaml", allow_anonymous=None,
                              realm="prism-schema-registry", where="t")

    def conf(url: str, roles: list[str]) -> dict[str, str]:
        token = jwt.encode({"iss": "https://idp", "aud": "prism-registry", "sub": "ci", "roles": roles,
                            "exp": int(time.time()) + 300}, key, algorithm="RS256", headers={"kid": "k1"})
        return {"url": url, "bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": token,
                "bearer.auth.logical.cluster": "lsrc-prism"}

    with serve_registry(registry, auth) as url:
        sid = SchemaRegistryClient(conf(url, ["write:orders."])).register_schema("orders.b-value",
                                                                                Schema(AVRO, "AVRO"))
        assert SchemaRegistryClient(conf(url, ["read"])).get_schema(sid).schema_str == AVRO
        with pytest.raises(SchemaRegistryError) as e:
            SchemaRegistryClient(conf(url, ["read"])).register_schema("orders.c-value", Schema(AVRO, "AVRO"))
        assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    assert registry.audit_log("orders.b-value", 1)[0]["actor"] == "ci"
