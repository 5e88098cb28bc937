"""Launching and stopping an inference server, and running a workload against it.

`--launch` makes hbench own the server's lifetime: start the command bound to
127.0.0.1 on a free port, wait for ``/health`` with a timeout (failing fast,
with the log's last lines, if the process exits first), capture its output to
a log file, and stop it afterwards (SIGTERM to its process group, then
SIGKILL). The server runs in its own session so stopping it also stops the
worker processes it spawned, and nothing else.

`ServedEngine` is what the vLLM and SGLang adapters share: connect to
``--endpoint`` or launch a server, check the endpoint before sending anything,
replay the workload with the open-loop client (`adapters.client`) while a scraper samples
``/metrics``, and return an `EngineRun`. Subclasses say only how to launch
their server, which metrics they publish and what the engine resolved.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from adapters.client.dispatch import run_open_loop
from adapters.client.http import DEFAULT_TIMEOUTS, Endpoint, Timeouts, http_get, served_models
from adapters.metrics_scrape import MetricsScraper
from adapters.registry import check_expressible
from harness.errors import HbenchError
from harness.records import EngineRun


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


class ServedEngine:
    """Runs a workload against an OpenAI-compatible server (given or launched).

    Subclasses set ``name``, ``supported_orgs`` and ``metrics`` and implement
    `launch_argv` (the server command for ``--launch``), `launch_env` and
    `resolved_info` (what the engine resolved, from its metrics and log).
    """

    name = ""
    supported_orgs: tuple[str, ...] = ()
    metrics = ""           # key of adapters.metrics_scrape.METRIC_MAPS
    extra_body: dict = {}  # engine-specific request fields

    def __init__(self, timeouts: Timeouts = DEFAULT_TIMEOUTS, ready_timeout_s: float = 900.0,
                 scrape_interval_s: float = 0.5, log_dir: str | Path | None = None):
        self.timeouts = timeouts
        self.ready_timeout_s = ready_timeout_s
        self.scrape_interval_s = scrape_interval_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.server: ServerProcess | None = None

    # -- hooks ---------------------------------------------------------------
    #: why admission headroom cannot be expressed on this engine (appended to the error)
    headroom_note = ""

    def check_config(self, config) -> None:
        """Refuse what the engine cannot express: other organizations, admission
        headroom and producer retention (policies only the simulator implements)."""
        check_expressible(self.name, self.supported_orgs, config.org)
        if config.headroom > 0:
            raise HbenchError(f"--headroom {config.headroom} is not expressible on {self.name}"
                              f"{self.headroom_note}; use --headroom 0 or --engine sim")
        if config.retention:
            raise HbenchError(f"--retention is not expressible on {self.name}; use --engine sim")

    def launch_argv(self, config, port: int) -> list[str]:
        raise NotImplementedError

    def launch_env(self, config) -> dict:
        return {}

    def resolved_info(self, info_labels: dict, log_text: str) -> dict:
        return dict(info_labels)

    # -- the run -----------------------------------------------------------------
    def run(self, workload, config, progress=None) -> EngineRun:
        self.check_config(config)
        if config.launch:
            port = free_port()
            argv = self.launch_argv(config, port)
            log_dir = self.log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
            log = log_dir / f"hbench-{self.name}-{port}.log"
            server = ServerProcess(argv, Endpoint("127.0.0.1", port), log,
                                   env=self.launch_env(config),
                                   ready_timeout_s=self.ready_timeout_s)
            with server:
                self.server = server
                try:
                    return self.run_on(server.endpoint, workload, config, progress)
                finally:
                    self.server = None
        if not config.endpoint:
            raise HbenchError(f"--engine {self.name} needs --endpoint URL or --launch "
                              "(with --model DIR)")
        return self.run_on(Endpoint.parse(config.endpoint), workload, config, progress)

    def run_on(self, endpoint: Endpoint, workload, config, progress=None) -> EngineRun:
        """Replay ``workload`` against a running server at ``endpoint``."""
        models = served_models(endpoint, timeout_s=self.timeouts.connect_s)
        model = pick_model(models, config.model, endpoint)
        if config.isolate:
            workload = salted(workload, config.seed)
        scraper = MetricsScraper(endpoint, self.metrics, self.scrape_interval_s)
        t0 = time.perf_counter()
        scraper.start(t0)
        try:
            result = run_open_loop(endpoint, model, workload, timeouts=self.timeouts,
                                   extra_body=self.extra_body, progress=progress, t0=t0)
        finally:
            scraper.stop()
        log_text = self.server.log_text() if self.server else ""
        info = {
            "engine": self.name,
            "endpoint": endpoint.url,
            "served_model": model,
            "server_version": server_version(endpoint),
            "launched": self.server is not None,
            "server_argv": list(self.server.argv) if self.server else None,
            "server_log": str(self.server.log_path) if self.server else None,
            "startup_s": self.server.startup_s if self.server else None,
            "requested": {"org": config.org, "budget": config.budget, "cap": config.cap,
                          "headroom": config.headroom, "isolate": config.isolate},
            "resolved": self.resolved_info(scraper.info, log_text),
            "metrics_scrapes": len(scraper.rows),
            "metrics_scrape_failures": scraper.failures,
        }
        counters = {}
        for column in ("prefix_queries", "prefix_hits", "preemptions", "prompt_tokens_cached",
                       "prompt_tokens", "generation_tokens"):
            delta = scraper.counter_delta(column)
            if delta is not None:
                counters[column] = delta
        # peak_memory is state bytes by kind; a real engine's pool mixes kinds (vLLM: one
        # shared pool of equal pages), so it is reported as one "kv_pool" entry when the
        # engine says how big the pool is. Device totals include weights: engine_info only.
        peak = {}
        usage = [r["kv_usage"] for r in scraper.rows if "kv_usage" in r]
        info["peak_kv_usage_frac"] = max(usage) if usage else None
        pool = info["resolved"].get("kv_cache_memory_bytes")
        if usage and isinstance(pool, int):
            peak["kv_pool"] = max(usage) * pool
        device = [r["device_mem_bytes"] for r in scraper.rows if "device_mem_bytes" in r]
        info["device_peak_bytes"] = max(device) if device else None
        return EngineRun(requests=result.records, steps=scraper.rows,
                         window_start_s=result.window_start_s, window_end_s=result.window_end_s,
                         engine_info=info, peak_memory=peak, counters=counters)


def server_version(endpoint: Endpoint) -> str | None:
    """The server's own ``GET /version`` answer (vLLM, SGLang), or None."""
    try:
        status, body = http_get(endpoint, "/version", timeout_s=5.0)
        return body.decode(errors="replace").strip()[:200] if status == 200 else None
    except OSError:
        return None


def pick_model(models: list[str], wanted: str | None, endpoint: Endpoint) -> str:
    """The served model to address: ``wanted`` if served, else the only one served."""
    if wanted in models:
        return wanted
    if len(models) == 1:
        return models[0]
    raise HbenchError(f"{endpoint.url} serves {', '.join(models) or 'no model'}; "
                      f"pass --model with one of them")


def salted(workload, seed: int):
    """ISOLATE: give every request without a salt a stable unique one."""
    import dataclasses

    reqs = tuple(r if r.salt is not None else
                 dataclasses.replace(r, salt=f"hbench-{seed}-{r.request_id}")
                 for r in workload.requests)
    return dataclasses.replace(workload, requests=reqs)
