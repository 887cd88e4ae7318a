"""The server's counters in Prometheus' text format (``GET /metrics``).

Written by hand rather than with ``prometheus_client``: a few counters, two gauges and one
histogram, updated from the event loop and the engine thread under one lock.

>>> m = Metrics()
>>> m.request("/v1/completions", 200, 0.3)
>>> m.add(lm_calls=5, completion_tokens=12)
>>> text = m.render(queue_length=1, running=2)
>>> 'adaptrack_requests_total{endpoint="/v1/completions",status="200"} 1' in text
True
>>> 'adaptrack_request_latency_seconds_bucket{le="0.5"} 1' in text
True
>>> "adaptrack_lm_calls_total 5" in text, "adaptrack_queue_length 1" in text
(True, True)
"""

from __future__ import annotations

import bisect
import threading

#: Upper bounds of the latency histogram's buckets, in seconds (the last is +Inf): from a
#: cached greedy answer (tens of ms) to the default time budget (600 s).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: The counters the engine adds to, with their help text.
COUNTERS = {
    "prompt_tokens": "Prompt tokens of the requests served.",
    "completion_tokens": "Tokens generated in the choices returned (EOS included).",
    "lm_calls": "Model calls (distinct prefixes evaluated; a fed forced chain counts once).",
    "backtracks": "AdapTrack backtracks.",
    "forced_tokens": "Tokens fed by fast-forward.",
    "tree_reuses": "Requests that reused the prefix tree of an earlier request.",
    "cancelled": "Requests cancelled: client gone, past --timeout, or server shutdown.",
}


class Metrics:
    """Thread-safe counters: requests by endpoint and status, the engine's totals, and a
    latency histogram of every answered request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = {}
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        with self._lock:
            key = (endpoint, status)
            self._requests[key] = self._requests.get(key, 0) + 1
            self._buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self._latency_sum += seconds

    def add(self, **amounts: float) -> None:
        """Add to the named counters of :data:`COUNTERS`."""
        with self._lock:
            for name, amount in amounts.items():
                self._totals[name] += int(amount)

    def render(self, queue_length: int, running: int) -> str:
        """Everything in Prometheus' text exposition format (version 0.0.4)."""
        with self._lock:
            lines = ["# HELP adaptrack_requests_total HTTP requests answered, by endpoint "
                     "and status.", "# TYPE adaptrack_requests_total counter"]
            for (endpoint, status), count in sorted(self._requests.items()):
                lines.append(f'adaptrack_requests_total{{endpoint="{endpoint}",'
                             f'status="{status}"}} {count}')
            for name, help_text in COUNTERS.items():
                lines += [f"# HELP adaptrack_{name}_total {help_text}",
                          f"# TYPE adaptrack_{name}_total counter",
                          f"adaptrack_{name}_total {self._totals[name]}"]
            lines += ["# HELP adaptrack_queue_length Requests waiting for a place in the "
                      "engine.", "# TYPE adaptrack_queue_length gauge",
                      f"adaptrack_queue_length {queue_length}",
                      "# HELP adaptrack_requests_running Requests in the engine.",
                      "# TYPE adaptrack_requests_running gauge",
                      f"adaptrack_requests_running {running}",
                      "# HELP adaptrack_request_latency_seconds Time from a request's arrival "
                      "to its answer.", "# TYPE adaptrack_request_latency_seconds histogram"]
            cumulative = 0
            for bound, count in zip((*LATENCY_BUCKETS, None), self._buckets, strict=True):
                cumulative += count
                le = "+Inf" if bound is None else f"{bound:g}"
                lines.append(f'adaptrack_request_latency_seconds_bucket{{le="{le}"}} '
                             f"{cumulative}")
            lines += [f"adaptrack_request_latency_seconds_sum {self._latency_sum:.6f}",
                      f"adaptrack_request_latency_seconds_count {cumulative}"]
        return "\n".join(lines) + "\n"
