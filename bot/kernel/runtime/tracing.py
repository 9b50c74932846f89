"""Traces of an alert's path and a change's, by OpenTelemetry, sent by OTLP over HTTP/protobuf
to the collector ``[tracing] otlp_endpoint`` names (docs/operations.md, "Traces").

Off (the endpoint unset), ``span`` yields a handle that does nothing and OpenTelemetry is never
imported: ``ruleloop --help`` and a bot without a collector pay nothing. On, ``start_tracing``
builds a tracer provider of its own (a batch span processor on a thread, so a slow or dead
collector costs spans, logged by the exporter, never an alert) and ``span`` opens spans on it.
Each span carries the incident and change ids in force (``logs.log_ids``) as ``incident_id``
and ``change_id``. OpenTelemetry's context lives in ContextVars, so a task or thread started
inside a span (asyncio copies the context) has it for parent: a diagnosis started by a webhook
is in the webhook's trace.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from bot.kernel.runtime.logs import IDS

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from bot.kernel.config import TracingSettings

log = logging.getLogger("ruleloop.tracing")

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for spans under the collector's base URL
Attribute = str | bool | int | float

P = ParamSpec("P")
R = TypeVar("R")


class Spanned:
    """The span a ``with span(...)`` block is in; its attributes can be added as they become
    known. Without tracing it does nothing."""

    def __init__(self, current: Span | None = None) -> None:
        self._span = current

    def set(self, **attributes: Attribute | None) -> None:
        """Add attributes (None: left out)."""
        if self._span is not None:
            self._span.set_attributes(_kept(attributes))


OFF = Spanned()


@dataclass
class Tracing:
    """The bot's traces while on: its tracer provider and the tracer ``span`` opens spans on."""

    provider: TracerProvider
    tracer: Tracer
    endpoint: str

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every span ended so far; False when they were not all sent in time."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left, stop the exporter's thread and turn tracing off."""
        global _current
        if _current is self:
            _current = None
        self.provider.shutdown()


_current: Tracing | None = None  # the one the process traces with (None: off)


def start_tracing(settings: TracingSettings, *, instance: str | None = None) -> Tracing | None:
    """Tracing as ``settings`` say, in place of any before (which is shut down): None, and off,
    without ``otlp_endpoint``. ``instance``: this replica (the spans' service.instance.id)."""
    global _current
    if _current is not None:
        _current.shutdown()
    if settings.otlp_endpoint is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    endpoint = settings.otlp_endpoint + TRACES_PATH
    resource = Resource.create(
        {"service.name": settings.service_name}
        | ({"service.instance.id": instance} if instance else {})
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
    )
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=settings.timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _current = Tracing(provider=provider, tracer=provider.get_tracer("ruleloop"), endpoint=endpoint)
    log.info("traces go to %s (sampled: %s)", endpoint, settings.sample_ratio)
    return _current


@contextlib.contextmanager
def span(name: str, *, root: bool = False, **attributes: Attribute | None) -> Iterator[Spanned]:
    """A span around the block, a child of the span in force (``root``: a trace of its own,
    linked to that span); an exception leaving the block is recorded on it. Off: nothing."""
    tracing = _current
    if tracing is None:
        yield OFF
        return
    from opentelemetry import context, trace

    links = []
    if root and (outer := trace.get_current_span().get_span_context()).is_valid:
        links.append(trace.Link(outer))
    with tracing.tracer.start_as_current_span(
        name,
        context=context.Context() if root else None,
        links=links,
        attributes=_kept({**_ids(), **attributes}),
    ) as current:
        yield Spanned(current)


def traced(name: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """An async function that runs inside ``span(name)``."""

    def wrap(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(name):
                return await function(*args, **kwargs)

        return run

    return wrap


def annotate(**attributes: Attribute | None) -> None:
    """Add attributes to the span in force (None: left out); off: nothing."""
    if _current is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_kept(attributes))


def _ids() -> dict[str, int | None]:
    return {attribute: var.get() for attribute, _, var in IDS}


def _kept(attributes: Mapping[str, Attribute | None]) -> dict[str, Attribute]:
    return {key: value for key, value in attributes.items() if value is not None}
