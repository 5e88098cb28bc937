"""An in-process OpenAI-compatible server with a scripted prefix cache of known geometry.

`FakeCacheServer` listens on 127.0.0.1 and serves ``/v1/models``,
``/metrics`` and streamed ``/v1/completions``. Its cache is a few lines
whose answers the probe tests know in advance:

- reusable positions are multiples of ``block`` tokens; a request of L tokens
  reuses the deepest stored position p <= L - 1 whose first p tokens (and
  cache salt) match;
- ``ends_only``: a request stores one state, where its last block starts
  (floor((L - 1) / block) x block, as vLLM's hybrid ``align`` mode does);
  otherwise every full block boundary of the prompt;
- ``junctions``: a request whose prompt shares more whole blocks with an
  earlier prompt than it reused also stores a state at the last of those
  block edges, where the two branch (vLLM 0.32 ends a prefill chunk there);
- ``capacity`` stored positions, least recently used evicted first;
- ``cache_on`` False stores and reuses nothing;
- evidence: ``report_cached`` puts ``usage.prompt_tokens_details.cached_tokens``
  in the final event; ``metrics`` publishes ``vllm:prefix_cache_hits_total``
  (tokens) and ``vllm:cache_config_info``; the first token is held
  ``ttft_base_s + ttft_per_token_s x (L - reused)``.

A text prompt is read as whitespace-separated token ids, and generated
tokens are ids 500.. sent as text " 500" ..., so a workload whose prompt
texts are its ids in decimal is tokenized exactly as its ids.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from adapters.server_process import free_port


class FakeCacheServer:
    def __init__(self, *, block: int = 64, ends_only: bool = True, junctions: bool = False,
                 capacity: int = 10_000,
                 cache_on: bool = True, report_cached: bool = True, metrics: bool = True,
                 ttft_base_s: float = 0.0, ttft_per_token_s: float = 0.0,
                 max_model_len: int = 1040, model: str = "fake-hybrid"):
        self.block, self.ends_only, self.capacity = block, ends_only, capacity
        self.junctions = junctions
        self.prompts: list[tuple] = []           # (salt, ids) of every prompt served
        self.cache_on, self.report_cached, self.metrics = cache_on, report_cached, metrics
        self.ttft_base_s, self.ttft_per_token_s = ttft_base_s, ttft_per_token_s
        self.max_model_len, self.model = max_model_len, model
        self.store: OrderedDict[tuple, None] = OrderedDict()
        self.hits = 0
        self.queries = 0
        self.completions = 0
        self.lock = threading.Lock()
        self.port = free_port()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"      # the body ends when the connection closes

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [
                        {"id": outer.model, "object": "model",
                         "max_model_len": outer.max_model_len}]}).encode()
                    return self._send(200, body, "application/json")
                if self.path == "/metrics" and outer.metrics:
                    return self._send(200, outer.metrics_text().encode(), "text/plain")
                self._send(404, b"not found", "text/plain")

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                if self.path != "/v1/completions":
                    return self._send(404, b"not found", "text/plain")
                prompt = body["prompt"]
                ids = [int(t) for t in prompt.split()] if isinstance(prompt, str) else list(prompt)
                if len(ids) + body.get("max_tokens", 16) > outer.max_model_len:
                    return self._send(400, b'{"error": "too long"}', "application/json")
                outer.serve(self, ids, body)

            def _send(self, status, body, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the scripted cache ----------------------------------------------------------------
    def lookup(self, ids: list[int], salt) -> int:
        if not self.cache_on:
            return 0
        p = (len(ids) - 1) // self.block * self.block
        while p > 0:
            key = (salt, tuple(ids[:p]))
            if key in self.store:
                self.store.move_to_end(key)
                return p
            p -= self.block
        return 0

    def junction(self, ids: list[int], salt) -> int:
        """The last block edge inside ``ids`` up to which an earlier prompt
        (same salt) had the same tokens: where the two branch."""
        shared = 0
        for s, earlier in self.prompts:
            if s != salt:
                continue
            n = 0
            for a, b in zip(ids, earlier, strict=False):
                if a != b:
                    break
                n += 1
            shared = max(shared, n)
        return min(shared, len(ids) - 1) // self.block * self.block

    def insert(self, ids: list[int], salt, reused: int = 0) -> None:
        if not self.cache_on:
            return
        if self.ends_only:
            positions = [(len(ids) - 1) // self.block * self.block]
        else:
            positions = list(range(self.block, len(ids) // self.block * self.block + 1,
                                   self.block))
        if self.junctions and (edge := self.junction(ids, salt)) > reused:
            positions.append(edge)
        self.prompts.append((salt, tuple(ids)))
        for p in positions:
            if p > 0:
                self.store[(salt, tuple(ids[:p]))] = None
                self.store.move_to_end((salt, tuple(ids[:p])))
        while len(self.store) > self.capacity:
            self.store.popitem(last=False)

    def metrics_text(self) -> str:
        with self.lock:
            hits, queries = self.hits, self.queries
        on = "True" if self.cache_on else "False"
        return (f'vllm:cache_config_info{{block_size="{self.block}",enable_prefix_caching="{on}"}} 1.0\n'
                f'vllm:prefix_cache_queries_total{{engine="0"}} {float(queries)}\n'
                f'vllm:prefix_cache_hits_total{{engine="0"}} {float(hits)}\n')

    def serve(self, handler, ids: list[int], body: dict) -> None:
        salt = body.get("cache_salt")
        with self.lock:
            cached = self.lookup(ids, salt)
            self.hits += cached
            self.queries += len(ids)
            self.completions += 1
        time.sleep(self.ttft_base_s + self.ttft_per_token_s * (len(ids) - cached))
        with self.lock:
            self.insert(ids, salt, cached)
        n = int(body.get("max_tokens", 16))
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        for i in range(n):
            choice = {"index": 0, "text": f" {500 + i}", "logprobs": None,
                      "finish_reason": "length" if i == n - 1 else None}
            if body.get("return_token_ids"):
                choice["token_ids"] = [500 + i]
            handler.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        usage = {"prompt_tokens": len(ids), "completion_tokens": n,
                 "total_tokens": len(ids) + n,
                 "prompt_tokens_details": {"cached_tokens": cached} if self.report_cached else None}
        handler.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
