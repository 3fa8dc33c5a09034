from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from support import RedisServer  # noqa: E402


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server):
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def queue():
    """A queue name of its own for each test, so tests share one server."""
    return f"q-{uuid.uuid4().hex[:10]}"
