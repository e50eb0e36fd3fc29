"""The registry benchmark's baseline: an ASGI app that answers every request with the bytes of
a file (``PRISM_BENCH_BARE_BODY``), under the same uvicorn settings as the registry - the
ceiling of the HTTP stack on this machine, with no routing, caching or metrics at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_BODY = Path(os.environ["PRISM_BENCH_BARE_BODY"]).read_bytes()
_HEADERS = [(b"content-type", b"application/vnd.schemaregistry.v1+json"),
            (b"content-length", str(len(_BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})
