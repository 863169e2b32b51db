"""Traces (issue 15): the spans of one create and one stop, captured in memory from a real
server in this process: the RPC's span, and the command's trace continued through
scheduling and the node agent's runtime steps to its terminal state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kibo_ctrl.app import App, Config
from kibo_ctrl.telemetry import tracing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.client import Client, S

CREATE = "kibo.ctrl.v1.WorkspaceService/CreateWorkspace"
STOP = "kibo.ctrl.v1.WorkspaceService/StopWorkspace"


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[App, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config(
        data_dir=tmp_path / "data",
        listen="127.0.0.1:0",
        http_listen="",
        runtime="sim",
        sim_step_ms=5,
        settle_ms=300,
        auth=False,
        tracer_provider=provider,
    )
    app = await App.start(config)
    try:
        yield app, exporter
    finally:
        await app.stop()


def one(spans: list[ReadableSpan], name: str, trace_id: int) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.context is not None and s.context.trace_id == trace_id]
    assert len(found) == 1, (name, [(s.name, s.context.trace_id if s.context else None) for s in spans])
    return found[0]


async def test_one_create_is_one_trace_from_the_rpc_to_the_runtime_step(
    traced: tuple[App, InMemorySpanExporter],
) -> None:
    app, exporter = traced
    async with Client.connect(f"127.0.0.1:{app.port}") as client:
        workspace = await client.create()
        await client.stop(workspace.workspace_id)
        await client.wait_for(workspace.workspace_id, S.WORKSPACE_STATE_STOPPED)
    spans = list(exporter.get_finished_spans())
    for rpc, command, step in ((CREATE, "command create", "runtime launch"), (STOP, "command stop", "runtime stop")):
        # The first call of each (the client resends until the command is terminal) made the command.
        calls = sorted((s for s in spans if s.name == rpc), key=lambda s: s.start_time or 0)
        assert calls, [s.name for s in spans]
        root = calls[0]
        assert root.context is not None and root.parent is None
        trace_id = root.context.trace_id
        assert root.attributes is not None and root.attributes["rpc.grpc.status_code"] == "OK"
        runtime = one(spans, step, trace_id)
        finished = one(spans, command, trace_id)
        assert runtime.parent is not None and runtime.parent.span_id == root.context.span_id
        assert runtime.attributes is not None and runtime.attributes["kibo.workspace_id"] == workspace.workspace_id
        assert finished.attributes is not None and finished.attributes["kibo.outcome"] == "succeeded"
        assert (finished.end_time or 0) >= (runtime.end_time or 0) - 10_000_000  # ends with the command
    create_trace = sorted((s for s in spans if s.name == CREATE), key=lambda s: s.start_time or 0)[0].context
    assert create_trace is not None
    one(spans, "scheduled", create_trace.trace_id)


def test_tracing_is_off_unless_the_otel_variables_ask_for_export() -> None:
    assert tracing.from_env({}) is None
    assert tracing.from_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) is None
    assert tracing.from_env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) is None
    provider = tracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert provider is not None
    provider.shutdown()
