"""Redis state tests: each test's keys under a prefix of its own (the shared Redis on 127.0.0.1:6379, database 0),
removed after it."""

from __future__ import annotations

import socket
import uuid

import pytest
import redis

URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix():
    p = f"steersman-test-{uuid.uuid4().hex[:12]}:"
    yield p
    r = redis.Redis.from_url(URL)
    keys = list(r.scan_iter(match=p + "*"))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def down_url() -> str:
    """A Redis URL nothing answers at (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"
