"""Polls a server's Prometheus ``/metrics`` during a run and keeps per-step rows.

A real engine does not tell the client what its scheduler is doing, but it
publishes gauges and counters. Sampling them periodically gives the run's
per-step table (time, running, waiting, cache usage, prefix-cache queries and
hits, preemptions) in the same spirit as the simulator's step rows, and the
engine's resolved cache configuration (``vllm:cache_config_info``) for the
manifest.

The text format is parsed by a small parser (samples, labels with escapes,
``_total`` counter suffixes) so no client library is needed. Engine metric
names differ; `METRIC_MAPS` maps each engine's names onto one set of columns.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from adapters.client.http import Endpoint, http_get

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition; comments and bad lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(3) or "")}
        out.append(Sample(m.group(1), labels, value))
    return out


def _unescape(v: str) -> str:
    return v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


# column -> (metric names to try in order, how to combine samples across label sets)
METRIC_MAPS: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "vllm": {
        "running": (("vllm:num_requests_running",), "sum"),
        "waiting": (("vllm:num_requests_waiting",), "sum"),
        "kv_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "max"),
        "prefix_queries": (("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"), "sum"),
        "prefix_hits": (("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), "sum"),
        "preemptions": (("vllm:num_preemptions",), "sum"),
        "prompt_tokens": (("vllm:prompt_tokens",), "sum"),
        "prompt_tokens_cached": (("vllm:prompt_tokens_cached",), "sum"),
        "generation_tokens": (("vllm:generation_tokens",), "sum"),
    },
    "sglang": {
        "running": (("sglang:num_running_reqs",), "sum"),
        "waiting": (("sglang:num_queue_reqs",), "sum"),
        "kv_usage": (("sglang:token_usage",), "max"),
        "cache_hit_rate": (("sglang:cache_hit_rate",), "max"),
        "used_tokens": (("sglang:num_used_tokens",), "sum"),
        "prefix_hits": (("sglang:cached_tokens",), "sum"),
        "prompt_tokens": (("sglang:prompt_tokens",), "sum"),
        "generation_tokens": (("sglang:generation_tokens",), "sum"),
        "preemptions": (("sglang:num_retracted_reqs",), "sum"),
    },
}

# metrics whose labels (not values) describe the engine's resolved configuration
INFO_METRICS = {"vllm": "vllm:cache_config_info", "sglang": "sglang:server_info"}


def extract(samples: list[Sample], engine: str) -> dict:
    """One row of mapped columns; a column the server does not publish is absent."""
    by_name: dict[str, list[float]] = {}
    for s in samples:
        name = s.name[:-6] if s.name.endswith("_total") else s.name
        by_name.setdefault(name, []).append(s.value)
    row = {}
    for column, (names, how) in METRIC_MAPS[engine].items():
        for name in names:
            values = by_name.get(name)
            if values:
                row[column] = sum(values) if how == "sum" else max(values)
                break
    return row


def read_metrics(endpoint: Endpoint, timeout_s: float = 5.0) -> list[Sample] | None:
    """One scrape of ``/metrics``: its samples, or None when the server cannot
    be reached or does not answer 200 (a server without the endpoint)."""
    try:
        status, body = http_get(endpoint, "/metrics", timeout_s=timeout_s)
    except OSError:
        return None
    return parse_prometheus(body.decode(errors="replace")) if status == 200 else None


def info_labels(samples: list[Sample], engine: str) -> dict:
    """Labels of the engine's config-info metric (block_size, num_gpu_blocks, ...)."""
    name = INFO_METRICS.get(engine)
    for s in samples:
        if s.name == name:
            return dict(s.labels)
    return {}


# The server's own latency histograms, read beside the client's numbers: a
# client that is late, or a stream that arrives in bursts, shows up as a gap
# between the two. name in the summary -> histogram family per engine.
HISTOGRAMS: dict[str, dict[str, str]] = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "tpot": "vllm:request_time_per_output_token_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
    },
    "sglang": {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e": "sglang:e2e_request_latency_seconds",
    },
}
SERVER_QUANTILES = (50, 99)


def histogram_buckets(samples: list[Sample], family: str) -> dict[float, float]:
    """Cumulative bucket counts of one histogram family, ``upper bound -> count``,
    summed over its label sets (engines label by model and engine index)."""
    buckets: dict[float, float] = {}
    name = family + "_bucket"
    for s in samples:
        if s.name == name and "le" in s.labels:
            try:
                le = float(s.labels["le"])
            except ValueError:
                continue
            buckets[le] = buckets.get(le, 0.0) + s.value
    return buckets


def bucket_delta(first: dict[float, float], last: dict[float, float]) -> dict[float, float]:
    """What a histogram counted between two scrapes (a bucket absent at the first
    scrape counted nothing before it)."""
    return {le: count - first.get(le, 0.0) for le, count in last.items()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """The q-quantile (0..1) of a cumulative histogram, as Prometheus's
    ``histogram_quantile`` computes it: linear inside the bucket that holds
    the rank, the lowest bucket starting at 0, and the highest finite bound
    when the rank falls in the ``+Inf`` bucket. NaN with no observations."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]) or buckets[bounds[-1]] <= 0:
        return math.nan
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def server_latency(first: list[Sample] | None, last: list[Sample] | None,
                   engine: str) -> dict[str, float]:
    """``server_<name>_p50_s`` / ``_p99_s`` from the server's own histograms,
    over what they counted between the first and the last scrape of a run
    (so earlier traffic on a reused server is left out). A histogram the
    server does not publish, or that counted nothing, is absent."""
    out: dict[str, float] = {}
    if first is None or last is None:
        return out
    for name, family in HISTOGRAMS.get(engine, {}).items():
        delta = bucket_delta(histogram_buckets(first, family), histogram_buckets(last, family))
        for q in SERVER_QUANTILES:
            value = histogram_quantile(q / 100, delta)
            if not math.isnan(value):
                out[f"server_{name}_p{q}_s"] = value
    return out


def histogram_mean(first: list[Sample] | None, last: list[Sample] | None,
                   family: str) -> float | None:
    """The mean of what histogram ``family`` observed between two scrapes (its
    ``_sum`` over its ``_count``, summed over label sets); None when either
    scrape is missing or it observed nothing."""
    if first is None or last is None:
        return None

    def total(samples, suffix):
        return sum(s.value for s in samples if s.name == family + suffix)

    count = total(last, "_count") - total(first, "_count")
    return (total(last, "_sum") - total(first, "_sum")) / count if count > 0 else None


class MetricsScraper:
    """Background thread sampling ``/metrics`` every ``interval_s`` seconds.

    ``rows`` holds one dict per successful scrape with ``time_s`` on the same
    clock and origin as the streaming client (pass the run's ``t0``). Scrape
    failures are counted, not raised: a dying server must not kill the run.
    """

    def __init__(self, endpoint: Endpoint, engine: str, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.perf_counter, log_path=None,
                 stall_s: float | None = None, on_stall: Callable[[str], None] | None = None):
        if engine not in METRIC_MAPS:
            raise ValueError(f"no metric map for engine {engine!r}")
        self.endpoint, self.engine, self.interval_s, self.clock = endpoint, engine, interval_s, clock
        self.rows: list[dict] = []
        self.info: dict = {}
        self.failures = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._nvml = _nvml_handle()
        # hbench's vLLM plugin logs its counters (its process's registry is not
        # the one /metrics serves); each row also gets the latest of them
        self._plugin_log = PluginLogFollower(log_path) if log_path is not None else None
        # the first and the latest parsed scrape, for the server's histograms
        self._first_samples: list[Sample] | None = None
        self._last_samples: list[Sample] | None = None
        # a server that runs nothing while requests wait, for stall_s seconds,
        # will not admit them: on_stall(reason) is called once
        self.stall_s, self.on_stall = stall_s, on_stall
        self._stalled_since: float | None = None
        self.stalled = False

    def scrape_once(self) -> dict | None:
        try:
            status, body = http_get(self.endpoint, "/metrics", timeout_s=min(5.0, 4 * self.interval_s))
        except OSError as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        if status != 200:
            self.failures += 1
            self.last_error = f"HTTP {status}"
            return None
        samples = parse_prometheus(body.decode(errors="replace"))
        if self._first_samples is None:
            self._first_samples = samples
        self._last_samples = samples
        if not self.info:
            self.info = info_labels(samples, self.engine)
        row = {"time_s": self.clock() - self._t0, **extract(samples, self.engine)}
        if self._plugin_log is not None:
            row.update(self._plugin_log.columns())
        if self._nvml is not None:
            row["device_mem_bytes"] = float(self._nvml[0].nvmlDeviceGetMemoryInfo(self._nvml[1]).used)
        self.rows.append(row)
        self._watch_stall(row)
        return row

    def _watch_stall(self, row: dict) -> None:
        if self.stall_s is None or self.on_stall is None or self.stalled:
            return
        if row.get("running") == 0 and row.get("waiting", 0) > 0:
            if self._stalled_since is None:
                self._stalled_since = row["time_s"]
            elif row["time_s"] - self._stalled_since >= self.stall_s:
                self.stalled = True
                self.on_stall(f"the server ran no request for {row['time_s'] - self._stalled_since:.0f} s "
                              f"while {row['waiting']:.0f} waited: it cannot admit them at this budget")
        else:
            self._stalled_since = None

    def start(self, t0: float) -> MetricsScraper:
        self._t0 = t0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="hbench-metrics")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take one last sample so final counters are seen."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.scrape_once()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval_s)

    def server_latency(self) -> dict[str, float]:
        """The server's own latency quantiles over this run (`server_latency`)."""
        return server_latency(self._first_samples, self._last_samples, self.engine)

    def counter_delta(self, column: str) -> float | None:
        """Last minus first value of a counter column over the run (None if unseen)."""
        seen = [r[column] for r in self.rows if column in r]
        return seen[-1] - seen[0] if seen else None


def _nvml_handle():
    """(pynvml module, device 0 handle) when pynvml and a GPU are present, else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no pynvml, no driver, no device: device memory is simply not sampled
        return None


# hbench's vLLM plugin (adapters.vllm_plugin) runs in vLLM's engine-core process,
# whose Prometheus registry the API server does not serve on CPU, so it writes
# its resolved layout once and its counters (throttled, and when idle) as log lines.
PLUGIN_TAGS = {"resolved": "hbench-plugin-resolved", "counters": "hbench-plugin-counters"}


def plugin_report(log_text: str) -> dict:
    """``{"resolved": dict | None, "counters": dict | None}``: the plugin's layout
    line and its last counters line in a server log (None where absent)."""
    import json

    out: dict = {"resolved": None, "counters": None}
    for line in log_text.splitlines():
        for key, tag in PLUGIN_TAGS.items():
            at = line.find(tag + " {")
            if at >= 0:
                try:
                    out[key] = json.loads(line[at + len(tag) + 1:])
                except ValueError:
                    pass
    return out


def checkpoint_invalidations(counters: dict, prefix: str = "") -> int:
    """S1/S2 checkpoints the plugin invalidated: a carrier's page or a member
    page handed out again, each losing its whole checkpoint (``prefix``
    ``plugin_`` reads the step-row columns)."""
    return (counters.get(f"{prefix}invalidations_member", 0)
            + counters.get(f"{prefix}invalidations_carrier", 0))


def plugin_state(rows: list[dict], resolved: dict | None, final: dict | None,
                 pool_layers: int | None) -> tuple[dict, dict]:
    """What hbench's vLLM plugin's counters say in hbench's common terms.

    Adds to every scraped row that carries the plugin's counters
    (``plugin_<name>`` columns) the step columns the simulator writes too:
    ``invalidations_checkpoint`` (S1/S2: a carrier's page or a member page
    reused, the checkpoint lost) and ``slab_occupancy`` (S2: used slots over
    the slab pages' slots, while any slab page is held). Returns (counters,
    peak_memory): the run's final ``invalidations_checkpoint`` and, for D0,
    its peak memory from the pages in use (attention blocks plus private
    checkpoint blocks held), because vLLM's usage gauge counts D0's whole
    private pool as used from the start; for S1/S2 also the peaks of member
    pages and (S2) slab pages the plugin held.
    """
    resolved = resolved or {}
    counters: dict = {}
    peak: dict = {}
    slots = resolved.get("slab_slots") or 0
    for row in rows:
        if "plugin_invalidations_member" in row or "plugin_invalidations_carrier" in row:
            row["invalidations_checkpoint"] = checkpoint_invalidations(row, "plugin_")
        if slots and row.get("plugin_slab_pages"):
            row["slab_occupancy"] = row.get("plugin_slab_slots_used", 0) / (
                row["plugin_slab_pages"] * slots)
    if final and final.get("org") in ("s1", "s2"):
        counters["invalidations_checkpoint"] = checkpoint_invalidations(final)
        for key in ("member_pages_peak", "slab_pages_peak"):   # pages beyond the carrier
            if key in final:
                counters[key] = final[key]
    if resolved.get("org") == "d0" and pool_layers and resolved.get("attention_blocks"):
        used = [(resolved["attention_blocks"] - r["plugin_attention_free"])
                + (r["plugin_checkpoint_blocks"] - r["plugin_checkpoint_free"])
                for r in rows if "plugin_attention_free" in r and "plugin_checkpoint_free" in r]
        if used:
            peak["kv_pool"] = max(used) * resolved["page_bytes"] * pool_layers
    return counters, peak


class PluginLogFollower:
    """Follows a growing server log and keeps the plugin's latest counters line.

    Reads only what was appended since the last call (a partial last line
    waits for its end). `columns` gives the numeric counters as ``plugin_<name>``
    step-row columns, empty before the first counters line.
    """

    def __init__(self, path):
        from pathlib import Path

        self.path = Path(path)
        self.offset = 0
        self.latest: dict | None = None
        self._partial = b""

    def poll(self) -> dict | None:
        import json

        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.latest
        self.offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        tag = (PLUGIN_TAGS["counters"] + " {").encode()
        for line in lines:
            at = line.find(tag)
            if at >= 0:
                try:
                    self.latest = json.loads(line[at + len(tag) - 1:])
                except ValueError:
                    pass
        return self.latest

    def columns(self) -> dict:
        latest = self.poll() or {}
        return {f"plugin_{k}": v for k, v in latest.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
