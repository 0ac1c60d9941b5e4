"""A real `kvgraft serve` in its own process on a free loopback port (tests/test_serve.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvgraft.app.core.watchdog import guarded_popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, home: Path, *args: str, env: dict | None = None) -> None:
        self.home, self.args, self.extra_env = home, args, env or {}
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = home.parent / f"serve-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> "ServerProcess":
        env = {**os.environ, "KVGRAFT_HOME": str(self.home), **self.extra_env}
        env = {k: v for k, v in env.items() if v is not None}  # None in `env`: unset that variable
        cmd = [sys.executable, "-m", "kvgraft", "serve", "--port", str(self.port), *self.args]
        self._log = open(self.log, "a")  # noqa: SIM115 (closed in stop)
        self.proc = guarded_popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)  # dies with the tests
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvgraft serve exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kvgraft serve did not become healthy: {self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> str:
        """Stop by pid; returns the server's log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self._log.close()
        return self.log.read_text()
