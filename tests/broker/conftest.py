"""The broker tests use `broker` from tests/conftest.py and helpers from tests/support.py."""
