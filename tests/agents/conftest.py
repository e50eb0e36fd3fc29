import time

import pytest

from app.agents.base import Message
from app.envelope import Layout, encode, new_envelope
from app.security.devkeys import ensure_dev_keys


@pytest.fixture(scope="session")
def dev_keys(tmp_path_factory):
    return ensure_dev_keys(tmp_path_factory.mktemp("keys"))


def make_msg(value: bytes, headers=None, *, topic="orders.created", offset=0, key=None) -> Message:
    return Message(topic=topic, partition=0, offset=offset, value=value, key=key, headers=list(headers or []),
                   timestamp_ms=int(time.time() * 1000))


def envelope_bytes(layout=Layout.REVIEWED, **kw):
    env = new_envelope("orders.created", {"order_id": "o-1"}, namespace="order-events", **kw)
    return env, encode(env, layout)
