"""A launched inference server: start, wait until ready, log, stop.

`--launch` makes hbench own the server's lifetime, and this module is all of
it: start the command bound to 127.0.0.1 on a free port, capture its output to
a log file, wait for ``/health`` with a timeout (failing fast, with the log's
last lines, if the process exits first), and stop it afterwards (SIGTERM to
its process group, then SIGKILL). The server runs in its own session so
stopping it also stops the worker processes it spawned, and nothing else.
It knows nothing about workloads; `adapters.served_engine` drives those.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from adapters.client.http import Endpoint, http_get
from common.errors import HbenchError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def split_command(cmd: str | list[str], **fields) -> list[str]:
    """Split a command string and fill ``{port}``/``{model}``/``{host}`` placeholders.

    The executable must exist: a missing one is a one-line error, not a
    traceback from ``subprocess``.
    """
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if not argv:
        raise HbenchError("the server command is empty")
    argv = [a.format(**fields) if "{" in a else a for a in argv]
    exe = argv[0]
    if shutil.which(exe) is None and not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise HbenchError(f"server executable {exe!r} not found")
    return argv


class ServerProcess:
    """A launched server; use as a context manager so it is always stopped."""

    def __init__(self, argv: list[str], endpoint: Endpoint, log_path: str | Path,
                 env: dict | None = None, ready_timeout_s: float = 300.0,
                 stop_timeout_s: float = 20.0):
        self.argv, self.endpoint = argv, endpoint
        self.log_path = Path(log_path)
        self.env = env
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it for its lifetime
        t = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})}, start_new_session=True)
        except OSError as exc:
            raise HbenchError(f"cannot start server {self.argv[0]!r}: {exc}") from None
        finally:
            log.close()
        self._wait_ready()
        self.startup_s = time.monotonic() - t
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HbenchError(
                    f"server exited with status {self.proc.returncode} before becoming ready; "
                    f"log {self.log_path}: {self.log_tail(3)}")
            try:
                status, _ = http_get(self.endpoint, "/health", timeout_s=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise HbenchError(f"server not ready on {self.endpoint.url} after "
                          f"{self.ready_timeout_s:g}s; log {self.log_path}: {self.log_tail(3)}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL after the timeout."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the server leads its own session, so its group id is its pid
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
                self.proc.wait(timeout=self.stop_timeout_s)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                pass
        # Workers the server spawned may outlive it; give them a moment, then kill the group.
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10.0)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def installed_distribution(python: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(distribution, version) of the first of ``names`` installed in
    ``python``'s environment (the interpreter that serves, not hbench's), or
    None. Reads package metadata only (importing an engine takes tens of seconds)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "for d in sys.argv[1:]:\n"
            "    try: print(json.dumps([d, m.version(d)])); break\n"
            "    except m.PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip()
    return tuple(json.loads(line)) if line else None
