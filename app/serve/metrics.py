"""`GET /metrics`: Prometheus text (prometheus-client), read from the engine thread's counters at scrape time."""

from __future__ import annotations

import threading
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, worker) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._requests: Counter = Counter()
        self._decoded = 0
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._requests[(endpoint, str(status))] += 1

    def decoded(self, n: int) -> None:
        with self._lock:
            self._decoded += n

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def collect(self):
        req = CounterMetricFamily("kvgraft_requests", "Completion requests answered", labels=["endpoint", "status"])
        with self._lock:
            for (endpoint, status), n in sorted(self._requests.items()):
                req.add_metric([endpoint, status], n)
            decoded = self._decoded
        yield req
        yield CounterMetricFamily("kvgraft_tokens_decoded", "Tokens decoded for replies", value=decoded)
        cache = self.worker.cache
        c = cache.counters if cache is not None else None

        def counter(name: str, doc: str, value) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value if c is not None else 0)

        yield counter("kvgraft_tokens_prefilled", "Prompt tokens computed", c and c.tokens_prefilled)
        yield counter("kvgraft_tokens_restored", "Prompt tokens grafted from the library", c and c.tokens_restored)
        yield counter("kvgraft_tokens_warm", "Prompt tokens the warm context still held", c and c.tokens_warm)
        yield counter("kvgraft_cache_hits_library", "Prompts that grafted a stored state", c and c.hits_library)
        yield counter("kvgraft_cache_hits_warm", "Prompts that reused the warm context", c and c.hits_warm)
        yield counter("kvgraft_cache_misses", "Prompts computed from the start", c and c.misses)
        yield counter("kvgraft_cache_states_stored", "Automatic states stored", c and c.stored)
        yield counter("kvgraft_cache_states_dropped", "Captured states dropped before storing", c and c.dropped)
        yield counter("kvgraft_cache_states_evicted", "Automatic states evicted past the budget", c and c.evicted)
        yield counter("kvgraft_graft_seconds", "Time spent grafting", c and c.graft_s)
        yield counter("kvgraft_prefill_seconds", "Time spent prefilling prompts", c and c.prefill_s)
        yield GaugeMetricFamily("kvgraft_queue_depth", "Requests waiting or running", value=self.worker.depth)
        yield from remote_metrics(cache.remote if cache is not None else None)
        n, size = (0, 0)
        if cache is not None:
            n, size = cache.last_size
        yield GaugeMetricFamily("kvgraft_cache_states", "Automatic states in the library", value=n)
        yield GaugeMetricFamily("kvgraft_cache_bytes", "Bytes of automatic states' blobs", value=size)


def remote_metrics(shared):
    """The fleet's shared cache (`serve --remote`): lookups, hits, what was refused and why, uploads."""
    if shared is None:
        return
    r = shared.counters
    for name, doc, value in (
        ("lookups", "Prompts looked up on the remote", r.lookups),
        ("hits", "States fetched from the remote and grafted", r.hits),
        ("misses", "Lookups that found no state to graft", r.misses),
        ("lookup_timeouts", "Lookups past their deadline (prefilled here)", r.lookup_timeouts),
        ("fetch_skipped_slow", "States found but slower to fetch than to prefill", r.fetch_skipped_slow),
        ("fetch_timeouts", "Fetches past their deadline (prefilled here)", r.fetch_timeouts),
        ("uploaded", "States uploaded", r.uploaded),
        ("upload_dropped", "States not uploaded: the upload queue was full", r.upload_dropped),
        ("upload_failed", "Uploads that failed", r.upload_failed),
        ("bytes_fetched", "Bytes fetched from the remote", r.bytes_fetched),
        ("bytes_uploaded", "Bytes uploaded to the remote", r.bytes_uploaded),
        ("fetch_seconds", "Time spent fetching states", r.fetch_s),
    ):
        yield CounterMetricFamily(f"kvgraft_remote_{name}", doc, value=value)
    refused = CounterMetricFamily("kvgraft_remote_refused", "Records or blobs never grafted, by reason", labels=["why"])
    for why, n in sorted(r.refused.items()):
        refused.add_metric([why], n)
    yield refused
