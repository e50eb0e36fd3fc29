"""Tests of the client SDKs in other languages (clients/rust), against the Python implementation."""
