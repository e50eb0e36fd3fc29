"""One of Prism's three HTTP servers in a process of its own, for tests/security/test_http_limits.py
(the memory a hostile request costs is measured on this process alone).

    python -m tests.security.http_servers registry|console|worker|supervisor PORT USERS_FILE DATA_DIR

Each server is started the way production starts it - the registry and the console through
``app.security.http_limits.uvicorn_config`` + ``serve`` (what ``prism schema serve`` and
``prism console`` run), the worker's management API on Faust's aiohttp web server with
``register_views``, the supervisor's status site as ``prism run --processes N`` serves it - and reads its limits from the ``PRISM_HTTP_*`` environment. It prints
``ready`` once it accepts connections and runs until it is terminated.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path


def _announce_when_listening(port: int) -> None:
    import socket

    def wait() -> None:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                print("ready", flush=True)
                return
            except OSError:
                time.sleep(0.05)

    threading.Thread(target=wait, daemon=True).start()


def registry(port: int, users_file: Path, data: Path) -> None:
    from app.schema.registry import Registry
    from app.schema.service import create_app
    from app.schema.store import SqliteStore
    from app.security.http_auth import auth_from_settings
    from app.security.http_limits import HttpLimits, bind_listen, serve, uvicorn_config

    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous=None,
                              realm="prism-schema-registry", where="tests")
    app = create_app(Registry(SqliteStore(str(data / "registry.db"))), auth=auth)
    _announce_when_listening(port)
    serve(uvicorn_config(app, HttpLimits.from_env(), host="127.0.0.1", port=port, log_level="error",
                         lifespan="off"), bind_listen("127.0.0.1", port))


def console(port: int, users_file: Path, data: Path) -> None:
    from app.console.settings import ConsoleSettings
    from app.console.web import create_app
    from app.security.http_auth import auth_from_settings
    from app.security.http_limits import bind_listen, serve, uvicorn_config

    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous=None,
                              realm="prism-console", where="tests")
    settings = ConsoleSettings.from_env(auth)
    _announce_when_listening(port)
    serve(uvicorn_config(create_app(settings), settings.http_limits, host="127.0.0.1", port=port,
                         log_level="error"), bind_listen("127.0.0.1", port))


def worker(port: int, users_file: Path, data: Path) -> None:
    import os

    from app.worker.faust_app import make_app
    from app.worker.management import ENV_USERS_FILE, ManagementSettings, register_views
    from app.worker.observe import Observer

    settings = ManagementSettings.from_env({**os.environ, ENV_USERS_FILE: str(users_file)})

    async def run() -> None:
        app = make_app(f"limits-{uuid.uuid4().hex[:8]}", "127.0.0.1:1", data / "worker", web_port=port)
        register_views(app, Observer(management=settings), settings)
        app.web.init_server()
        await app.web.start_server()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def supervisor(port: int, users_file: Path, data: Path) -> None:
    """The status site of `prism run --processes N` (app/worker/supervisor.py), children not started."""
    import os

    from app.worker.management import ENV_USERS_FILE, ManagementSettings
    from app.worker.supervisor import Supervisor

    settings = ManagementSettings.from_env({**os.environ, ENV_USERS_FILE: str(users_file)})

    async def run() -> None:
        sup = Supervisor(processes=1, topology_name="limits", data_dir=data, env={}, management=settings)
        runner = await sup.serve(port)
        print("ready", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(run())


if __name__ == "__main__":
    kind, port, users, data_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    {"registry": registry, "console": console, "worker": worker, "supervisor": supervisor}[kind](port, users, data_dir)
