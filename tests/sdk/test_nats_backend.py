"""The NATS backend's fetch, without a server: what counts as "nothing yet" and what as a failure.
(Its behaviour against a real JetStream server is in test_ack_semantics.py and test_portability.py.)"""

from __future__ import annotations

import nats.errors
import pytest

from app.errors import SubscribeError
from app.sdk.backends.nats import _NatsSubscription


class _Sub:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def fetch(self, max_messages: int, timeout: float) -> list:
        raise self.exc


def _subscription(exc: BaseException) -> _NatsSubscription:
    sub = _NatsSubscription.__new__(_NatsSubscription)
    sub.topic, sub.sub, sub._outstanding = "sdk.t", _Sub(exc), set()
    return sub


@pytest.mark.parametrize("exc", [nats.errors.TimeoutError(), TimeoutError()],
                         ids=["nats-timeout", "bare-asyncio-timeout"])
async def test_a_fetch_timeout_is_no_messages_yet(exc: BaseException) -> None:
    # nats-py raises a bare asyncio.TimeoutError when its deadline runs out between its two
    # requests; that used to escape as SubscribeError and fail a receive() that had time left
    assert await _subscription(exc).fetch(1, 0.1) == []


async def test_any_other_fetch_error_is_a_subscribe_error() -> None:
    with pytest.raises(SubscribeError, match=r"fetching from NATS subject .sdk\.t. failed"):
        await _subscription(nats.errors.ConnectionClosedError()).fetch(1, 0.1)
