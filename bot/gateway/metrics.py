"""The gateway's own Prometheus metrics, on a registry per app (served at the gateway's /metrics).

These names are a contract: the bot's ``queue_cancel`` probe reads them.

  ruleloop_gateway_requests_total{outcome}        inference requests by how they ended:
      ok              the engine answered 2xx and the response reached the client
      client_cancel   the client went away first; the upstream request was closed at once
      deadline        X-Request-Timeout (or the default) passed; the upstream request was closed
      upstream_error  the engine was unreachable, answered non-2xx, or broke the stream
      rejected        429: the in-flight token budget was spent (never admitted)
      invalid         4xx for a bad request: JSON, model, timeout header, size (never admitted)
  ruleloop_gateway_output_tokens_total{kind}      output tokens the engine streamed through us:
      delivered (requests that ended ok) or wasted (client_cancel, deadline, upstream_error)
  ruleloop_gateway_prompt_tokens_total{kind}      prompt tokens (the admission estimate) of
      admitted requests, and of those the wasted ones (admitted requests that did not end ok)
  ruleloop_gateway_ttft_seconds                   histogram: request arrival -> first body byte
      of a streamed answer (vLLM sends its first event with the first token)
  ruleloop_gateway_tpot_seconds                   histogram: (last - first byte) / (tokens - 1),
      streamed requests that ended ok with more than one token
  ruleloop_gateway_inflight_tokens                gauge: admitted token cost not yet released
  ruleloop_gateway_inflight_requests              gauge: admitted requests not yet finished
  ruleloop_gateway_max_inflight_tokens            gauge: the budget's limit (0: unlimited)
  ruleloop_gateway_upstream_requests_total{connection}   requests the engine answered, by the
      connection they went on: new (opened for it) or kept (a kept-alive one); about one new
      per request means the engine closes idle connections faster than requests come

They add up: ok + client_cancel + deadline + upstream_error = admitted requests, and
delivered + wasted = all output tokens seen. Token counts come from the stream's ``usage``
when the client asked for it, else one token per streamed choice event.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.gateway.budget import TokenBudget

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
                3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)  # fmt: skip


class RelayOutcome(StrEnum):
    """How an inference request ended, as the gateway counts it."""

    OK = "ok"
    CLIENT_CANCEL = "client_cancel"
    DEADLINE = "deadline"
    UPSTREAM_ERROR = "upstream_error"
    REJECTED = "rejected"
    INVALID = "invalid"


@runtime_checkable
class ConnectionCounts(Protocol):
    """What the upstream transport counts (``UpstreamTransport``)."""

    sent_on_new: int
    sent_on_kept: int


class _UpstreamRequests(Collector):
    """The transport's own counts, read at scrape time (nothing added per request)."""

    def __init__(self, counts: ConnectionCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "ruleloop_gateway_upstream_requests",
            "Requests the engine answered, by connection: new (opened for it) or kept.",
            labels=["connection"],
        )
        family.add_metric(["new"], self._counts.sent_on_new)
        family.add_metric(["kept"], self._counts.sent_on_kept)
        yield family


class GatewayMetrics:
    """All gateway metrics on one registry; label children are bound once, not per request."""

    def __init__(
        self,
        budget: TokenBudget,
        registry: CollectorRegistry | None = None,
        *,
        upstream: object = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        if isinstance(upstream, ConnectionCounts):  # the default transport; not a test's mock
            r.register(_UpstreamRequests(upstream))
        requests = Counter(
            "ruleloop_gateway_requests", "Inference requests by outcome.", ["outcome"], registry=r
        )
        self._requests = {o: requests.labels(o.value) for o in RelayOutcome}
        output = Counter(
            "ruleloop_gateway_output_tokens",
            "Output tokens streamed through the gateway, delivered or wasted.",
            ["kind"],
            registry=r,
        )
        self._delivered, self._wasted_output = output.labels("delivered"), output.labels("wasted")
        prompt = Counter(
            "ruleloop_gateway_prompt_tokens",
            "Prompt tokens (admission estimate) of admitted requests, and of those wasted.",
            ["kind"],
            registry=r,
        )
        self._admitted_prompt, self._wasted_prompt = (
            prompt.labels("admitted"),
            prompt.labels("wasted"),
        )
        self._ttft = Histogram(
            "ruleloop_gateway_ttft_seconds", "Arrival to first streamed byte.",
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self._tpot = Histogram(
            "ruleloop_gateway_tpot_seconds", "Time per output token after the first.",
            buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        Gauge(
            "ruleloop_gateway_inflight_tokens", "Admitted token cost not yet released.", registry=r
        ).set_function(lambda: budget.in_flight_tokens)
        Gauge(
            "ruleloop_gateway_inflight_requests", "Admitted requests not yet finished.", registry=r
        ).set_function(lambda: budget.in_flight_requests)
        Gauge(
            "ruleloop_gateway_max_inflight_tokens",
            "The token budget's limit (0: none).",
            registry=r,
        ).set_function(lambda: budget.limit)

    def refused(self, outcome: RelayOutcome) -> None:
        """Count a request answered before admission (rejected or invalid)."""
        self._requests[outcome].inc()

    def admitted(self, prompt_tokens: int) -> None:
        """Count an admitted request's prompt tokens."""
        self._admitted_prompt.inc(prompt_tokens)

    def finished(
        self,
        outcome: RelayOutcome,
        *,
        prompt_tokens: int,
        output_tokens: int,
        ttft_s: float | None,
        tpot_s: float | None,
    ) -> None:
        """Count an admitted request's end, its tokens and latencies."""
        self._requests[outcome].inc()
        if outcome is RelayOutcome.OK:
            if output_tokens:
                self._delivered.inc(output_tokens)
            if tpot_s is not None:
                self._tpot.observe(tpot_s)
        else:
            self._wasted_prompt.inc(prompt_tokens)
            if output_tokens:
                self._wasted_output.inc(output_tokens)
        if ttft_s is not None:
            self._ttft.observe(ttft_s)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
