"""``hbench probe``'s pipeline: server facts -> designed probe -> (a workload's replay) -> report.

Read top to bottom: `adapters.client.probe_wire.server_facts` fails fast
on a dead or wrong endpoint; `adapters.client.probe_design.Probe` runs the
designed pairs within the budget; with a workload,
`adapters.client.probe_replay.replay_rows` serves it and
`analysis.probe_verdict.verdict` gives each shortfall its reason. The
result is one JSON-ready dict, which the command prints or renders.
"""

from __future__ import annotations

from adapters.client.http import Endpoint, Timeouts
from adapters.client.probe_design import Probe, ProbeFailed
from adapters.client.probe_wire import Budget, ProbeClient, server_facts
from common.errors import HbenchError

#: One probe request's waits; a replayed request gets the client's defaults.
PROBE_TIMEOUTS = Timeouts(connect_s=5.0, first_byte_s=120.0, idle_s=60.0, total_s=300.0)


def probe_report(url: str, *, model: str | None, max_requests: int, max_seconds: float,
                 workload=None, workload_path: str | None = None, seed: int = 0) -> dict:
    """Probe the server at ``url`` (and replay ``workload`` when given)."""
    endpoint = Endpoint.parse(url)
    facts = server_facts(endpoint, model)
    client = ProbeClient(endpoint, facts, Budget(max_requests, max_seconds), seed=seed,
                         timeouts=PROBE_TIMEOUTS)
    probe = Probe(client)
    try:
        findings = probe.run()
    except ProbeFailed as exc:
        raise HbenchError(str(exc)) from None
    report = {"endpoint": endpoint.url, "seed": seed, "findings": findings.as_dict(), "workload": workload_path,
              "replay": None}
    if workload is not None:
        from adapters.client.http import DEFAULT_TIMEOUTS
        from adapters.client.probe_replay import replay_rows
        from adapters.client.probe_wire import prefix_hits
        from analysis.probe_verdict import verdict

        fit = probe.ev.fit if probe.ev is not None else None
        before = prefix_hits(endpoint) if facts.has_metrics else None
        rows = replay_rows(endpoint, facts.model, workload, timeouts=DEFAULT_TIMEOUTS, fit=fit)
        after = prefix_hits(endpoint) if before is not None else None
        counted = None if before is None or after is None else int(after - before)
        report["replay"] = verdict(rows, report["findings"], metrics_reused=counted)
    return report
