"""The console's back-end URLs (app/console/settings.py), checked when it starts."""

from __future__ import annotations

import pytest

from app.console.settings import split_urls
from app.errors import ConfigError


@pytest.mark.parametrize(("value", "fragment"), [
    ("http://[::1", "is not a usable URL: Invalid IPv6 URL"),
    ("http://h:abc", "is not a usable URL: Port could not be cast"),
    ("http://h:70000", "is not a usable URL: Port out of range"),
    ("http://no such", "holds a space or a control character"),
    ("http://h\x00:80", "holds a space or a control character"),
    ("ftp://h", "is not an http(s) URL"),
])
def test_a_url_no_page_could_use_stops_the_start(value: str, fragment: str) -> None:
    """`prism console --registry 'http://[::1'` was a ValueError traceback; `http://no such`
    started a console whose every page then failed."""
    with pytest.raises(ConfigError) as info:
        split_urls([f"http://127.0.0.1:6066,{value}"], "--worker")
    assert fragment in info.value.message and info.value.path == "--worker" and info.value.hint


def test_good_urls_are_kept_in_order_once() -> None:
    assert split_urls(["http://a:1/, https://[::1]:2", "http://a:1"], "--worker") == ["http://a:1", "https://[::1]:2"]
