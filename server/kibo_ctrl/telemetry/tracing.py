"""Traces with OpenTelemetry: a span per RPC (both transports), and the command's trace
continued by the loops: a span for its scheduling and for each runtime step the node
takes for it, and one for the command from acceptance to its terminal state.

Off by default. `from_env` turns it on when the standard variables ask for export:
`OTEL_TRACES_EXPORTER=otlp`, or `OTEL_EXPORTER_OTLP_ENDPOINT` /
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set (the OTLP/HTTP exporter reads the rest:
headers, timeout, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`...); `OTEL_SDK_DISABLED=true`
or `OTEL_TRACES_EXPORTER=none` keeps it off."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..domain.model import EventType
from ..engine import trace
from ..store.base import Changes
from ..transport.rpc import RpcObserver

PROPAGATOR = TraceContextTextMapPropagator()
# Events of a command's workspace that become spans of the command's trace.
TRACED_EVENTS = frozenset({EventType.SCHEDULED, EventType.UNSCHEDULABLE, EventType.INSTANCE_PHASE})


def from_env(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """A provider exporting OTLP/HTTP when the OTEL_* variables ask for it; else None (off)."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").lower()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if exporter == "none" or not (exporter == "otlp" or endpoint):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "kibo-ctrl"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def parent_context(trace_parent: str) -> otel_context.Context | None:
    return PROPAGATOR.extract({"traceparent": trace_parent}) if trace_parent else None


def traceparent_of(span: Span) -> str:
    """The W3C traceparent of `span` (what the propagator's inject writes, at a tenth of its cost)."""
    context = span.get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("kibo")

    def rpc_observer(self, transport: str) -> RpcTracing:
        return RpcTracing(self.tracer, transport)

    def on_changes(self, changes: Changes) -> None:
        """A hub listener: the spans of what the loops did for a traced command."""
        commands = {command.workspace_id: command for command in changes.commands.values() if command.trace_parent}
        for event in changes.events:
            command = commands.get(event.workspace_id)
            if command is None or event.type not in TRACED_EVENTS:
                continue
            start = int(event.time * 1e9)
            span = self.tracer.start_span(
                event.type.name.lower(),
                context=parent_context(command.trace_parent),
                start_time=start,
                attributes={"kibo.workspace_id": event.workspace_id, "kibo.message": event.message},
            )
            span.end(end_time=start)
        for command in changes.commands.values():
            if command.terminal and command.trace_parent:
                span = self.tracer.start_span(
                    f"command {command.kind.name.lower()}",
                    context=parent_context(command.trace_parent),
                    start_time=int(command.create_time * 1e9),
                    attributes={
                        "kibo.workspace_id": command.workspace_id,
                        "kibo.command_id": command.id,
                        "kibo.outcome": command.state.name.lower(),
                    },
                )
                if command.error is not None:
                    span.set_status(Status(StatusCode.ERROR, command.error.message))
                span.end(end_time=int(command.update_time * 1e9))

    @contextmanager
    def runtime_step(self, operation: str, node_id: str, workspace_id: str, trace_parent: str) -> Iterator[None]:
        """A span for one runtime operation, in the trace of the command it acts for."""
        with self.tracer.start_as_current_span(
            f"runtime {operation}",
            context=parent_context(trace_parent),
            attributes={"kibo.node_id": node_id, "kibo.workspace_id": workspace_id},
        ):
            yield

    def shutdown(self) -> None:
        self.provider.shutdown()


class RpcTracing:
    """transport/rpc.py `RpcObserver`: a SERVER span per call; a unary call's span is the
    current context while its handler runs (so the command it records carries it)."""

    def __init__(self, tracer: Tracer, transport: str) -> None:
        self._tracer = tracer
        self._transport = transport
        self._call: ContextVar[tuple[Span, Any, Token[str]] | None] = ContextVar(f"kibo_rpc_span_{transport}")

    def started(self, service: str, method: str, stream: bool) -> None:
        span = self._tracer.start_span(
            f"{service}/{method}",
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": method,
                "kibo.transport": self._transport,
            },
        )
        if stream:
            # A stream's steps may run after its caller moved on: its span is not made current.
            self._call.set((span, None, trace.current.set("")))
            return
        self._call.set((span, otel_context.attach(set_span_in_context(span)), trace.current.set(traceparent_of(span))))

    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None:
        call = self._call.get(None)
        if call is None:
            return
        span, attached, parent = call
        self._call.set(None)
        span.set_attribute("rpc.grpc.status_code", code)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()
        trace.current.reset(parent)
        if attached is not None:
            otel_context.detach(attached)


class Observers:
    """Several RpcObservers as one (metrics and traces)."""

    def __init__(self, *observers: RpcObserver) -> None:
        self._observers = observers

    def started(self, service: str, method: str, stream: bool) -> None:
        for observer in self._observers:
            observer.started(service, method, stream)

    def finished(self, service: str, method: str, stream: bool, code: str, seconds: float) -> None:
        for observer in reversed(self._observers):
            observer.finished(service, method, stream, code, seconds)


TraceParentOf = Callable[[str], Awaitable[str]]
