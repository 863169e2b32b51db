"""The trace context of the work in progress, as a W3C `traceparent` string: the port
through which tracing (telemetry/tracing.py) reaches the engine without the engine knowing
OpenTelemetry. A traced RPC sets `current`; the store runs each transaction in the
caller's context, so `steps.record_command` stores it with the command it creates, and
whoever later acts on that command (scheduling, the node's runtime steps) continues the
same trace from the record. Empty: no trace."""

from __future__ import annotations

from contextvars import ContextVar

current: ContextVar[str] = ContextVar("kibo_trace_parent", default="")
