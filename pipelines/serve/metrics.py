"""The server's counters in Prometheus' text format (``GET /metrics``), on a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Callable


class Metrics:
    """Requests, audio seconds, tokens, drafts proposed and accepted, queue length, latency."""

    def __init__(self, queued: Callable[[], float] = lambda: 0, running: Callable[[], float] = lambda: 0) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tandem_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.audio = Counter("tandem_audio_seconds", "Seconds of audio transcribed", registry=r)
        self.tokens = Counter("tandem_tokens", "Tokens emitted, by kind (asr or chat)", ["kind"], registry=r)
        self.main_calls = Counter("tandem_main_calls", "Main-model passes, summed over rows", ["kind"], registry=r)
        self.drafted = Counter("tandem_drafted_tokens", "Draft tokens proposed", ["kind"], registry=r)
        self.accepted = Counter("tandem_accepted_tokens", "Draft tokens accepted", ["kind"], registry=r)
        self.latency = Histogram("tandem_request_latency_seconds", "Wall time of a request, upload to answer",
                                 ["endpoint"], registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
        self.batches = Histogram("tandem_batch_admitted_requests", "Requests admitted to a batch at once",
                                 ["kind"], registry=r, buckets=(1, 2, 4, 8, 16, 32, 64))
        Gauge("tandem_queue_length", "Requests waiting for the worker", registry=r).set_function(queued)
        Gauge("tandem_running_requests", "Requests being decoded", registry=r).set_function(running)

    def decoded(self, kind: str, tokens: float, main_calls: float, drafted: float, accepted: float) -> None:
        self.tokens.labels(kind).inc(tokens)
        self.main_calls.labels(kind).inc(main_calls)
        self.drafted.labels(kind).inc(drafted)
        self.accepted.labels(kind).inc(accepted)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
