"""What an operator sees of the process: Prometheus metrics (metrics.py, served by
endpoint.py), structured log lines (logs.py, events.py), OpenTelemetry traces
(tracing.py), and the timing wrapper around each runtime (runtime.py).

Adapters over the ports the layers below declare (`transport/rpc.py` `RpcObserver`,
`store/base.py` `observe_commits`, the hub's listeners): nothing below this package
imports prometheus_client or OpenTelemetry (the engine sees only the `engine/trace.py`
context variable)."""
