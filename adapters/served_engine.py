"""The run loop both real-engine adapters share: a workload against a served engine.

`ServedEngine` connects to ``--endpoint`` or launches a server
(`adapters.server_process`), checks the endpoint before sending anything,
replays the workload with the open-loop client (`adapters.client`) while a
scraper samples ``/metrics``, and builds the `EngineRun`. Subclasses say only
how to launch their server, which metrics they publish and what the engine
resolved. Kept apart from the process management so that a run against a
given ``--endpoint`` never touches process code, and the process code can be
tested (and used by ``hbench verify``) without a workload.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from adapters.client.dispatch import Abort, run_open_loop
from adapters.client.http import DEFAULT_TIMEOUTS, Endpoint, Timeouts, served_models, server_version
from adapters.metrics_scrape import MetricsScraper
from adapters.registry import check_expressible, check_paging
from adapters.server_process import ServerProcess, free_port
from common.errors import HbenchError
from harness.records import EngineRun
from harness.request_table import RequestTable

#: seconds a server may run no request while requests wait before the run is
#: stopped: such a server cannot admit them (a budget too small for the
#: organization), and waiting out each request's timeout would take far longer
STALL_S = 120.0


class ServedEngine:
    """Runs a workload against an OpenAI-compatible server (given or launched).

    Subclasses set ``name``, ``supported_orgs`` and ``metrics`` and implement
    `launch_argv` (the server command for ``--launch``), `launch_env`,
    `requested_info` (what hbench asked for) and `resolved_info` (what the
    engine resolved, from its metrics and log).
    """

    name = ""
    supported_orgs: tuple[str, ...] = ()
    metrics = ""           # key of adapters.metrics_scrape.METRIC_MAPS
    extra_body: dict = {}  # engine-specific request fields

    def __init__(self, timeouts: Timeouts = DEFAULT_TIMEOUTS, ready_timeout_s: float = 900.0,
                 scrape_interval_s: float = 0.5, log_dir: str | Path | None = None,
                 stall_s: float = STALL_S):
        self.timeouts = timeouts
        self.stall_s = stall_s
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
        check_paging(self, config.resolved_paging)
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

    def state_rows(self, rows: list[dict], info: dict) -> tuple[dict, dict]:
        """(counters, peak_memory) an engine reads from its own state, beyond
        the common gauges: here nothing. Subclasses may also add hbench's
        common step columns (``invalidations_checkpoint``, ``slab_occupancy``)
        to ``rows`` in place."""
        return {}, {}

    def pool_bytes(self, info: dict) -> int | None:
        """Bytes of the engine's state pool (peak ``kv_pool`` = peak usage x this):
        what the server reports as its KV cache memory."""
        pool = info["resolved"].get("kv_cache_memory_bytes")
        return pool if isinstance(pool, int) else None

    def requested_info(self, config) -> dict:
        """What hbench asked of the engine (``engine_info["requested"]``)."""
        return {"org": config.org, "budget": config.budget, "cap": config.cap,
                "headroom": config.headroom, "isolate": config.isolate}

    # -- the run -----------------------------------------------------------------
    def run(self, workload, setup, progress=None) -> EngineRun:
        """Serve ``workload`` on a launched or given server (``setup.config``
        says which); the server owns its memory, so only the config is read."""
        config = setup.config
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
        abort = Abort()
        scraper = MetricsScraper(endpoint, self.metrics, self.scrape_interval_s,
                                 log_path=self.server.log_path if self.server else None,
                                 stall_s=self.stall_s, on_stall=abort.trip)
        t0 = time.perf_counter()
        scraper.start(t0)
        try:
            result = run_open_loop(endpoint, model, workload, timeouts=self.timeouts,
                                   extra_body=self.extra_body, progress=progress, t0=t0,
                                   abort=abort)
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
            "requested": self.requested_info(config),
            "resolved": self.resolved_info(scraper.info, log_text),
            "metrics_scrapes": len(scraper.rows),
            "metrics_scrape_failures": scraper.failures,
            "stopped": abort.reason,   # why the run was stopped early, or None
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
        pool = self.pool_bytes(info)
        if usage and pool is not None:
            peak["kv_pool"] = max(usage) * pool
        device = [r["device_mem_bytes"] for r in scraper.rows if "device_mem_bytes" in r]
        info["device_peak_bytes"] = max(device) if device else None
        own_counters, own_peak = self.state_rows(scraper.rows, info)
        counters.update(own_counters)
        counters.update(scraper.server_latency())
        peak.update(own_peak)
        return EngineRun(requests=RequestTable.of(result.records), steps=scraper.rows,
                         window_start_s=result.window_start_s, window_end_s=result.window_end_s,
                         engine_info=info, peak_memory=peak, counters=counters)


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
    reqs = tuple(r if r.salt is not None else
                 dataclasses.replace(r, salt=f"hbench-{seed}-{r.request_id}")
                 for r in workload.requests)
    return dataclasses.replace(workload, requests=reqs)
