"""The printed table, and the goals the figures are held to (from issue 6)."""

from __future__ import annotations

from typing import Any

# key -> (comparison, goal); issue 14 raised issue 6's goals.
GOALS: dict[str, tuple[str, float]] = {
    "rpc_ceiling_ratio": (">=", 0.9),
    "rpc_ceiling_ratio_h2load": (">=", 0.9),
    "create_to_available_p99_ms": ("<", 5.0),
    "stop_to_stopped_p99_ms": ("<", 20.0),
    "durable_creates_per_s": (">=", 1000.0),
    "durable_creates_ceiling_ratio": (">=", 0.5),
    "scale_get_ratio_100k_vs_1k": ("<=", 1.5),
    "scale_list_ratio_100k_vs_1k": ("<=", 1.5),
    "watch_fanout_p99_ms": ("<", 250.0),
}


def goals() -> dict[str, str]:
    return {key: f"{op} {goal:g}" for key, (op, goal) in GOALS.items()}


def met(key: str, value: float | None) -> str:
    if key not in GOALS:
        return ""
    if value is None:
        return "n/a"
    op, goal = GOALS[key]
    ok = {">=": value >= goal, "<": value < goal, "<=": value <= goal}[op]
    return "yes" if ok else "NO"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _rows(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def table(result: dict[str, Any]) -> str:
    size = result["scale_size"]
    small = min(int(k) for k in result["sizes"])
    h2 = result["h2load"]
    main = [
        ("1 GetWorkspace / ceiling, QPS ratio (Python client)", "rpc_ceiling_ratio"),
        ("1 GetWorkspace / ceiling, QPS ratio (h2load)", "rpc_ceiling_ratio_h2load"),
        ("1 ceiling / GetWorkspace, server CPU per call", "rpc_ceiling_cpu_ratio"),
        ("1 GetWorkspace QPS at 64 in flight", "get_qps"),
        ("1 GetWorkspace p50 ms", "get_p50_ms"),
        ("1 GetWorkspace p99 ms", "get_p99_ms"),
        ("1 ceiling QPS at 64 in flight", "ceiling_qps"),
        ("2 CreateWorkspace -> AVAILABLE p50 ms", "create_to_available_p50_ms"),
        ("2 CreateWorkspace -> AVAILABLE p99 ms", "create_to_available_p99_ms"),
        ("2 StopWorkspace -> STOPPED p50 ms", "stop_to_stopped_p50_ms"),
        ("2 StopWorkspace -> STOPPED p99 ms", "stop_to_stopped_p99_ms"),
        ("3 durable creates/s, 64 clients, answered at commit", "durable_creates_per_s"),
        ("3 durable creates/s / ceiling Get QPS", "durable_creates_ceiling_ratio"),
        ("3 ... sustained until all AVAILABLE, /s", "durable_creates_to_available_per_s"),
        ("3 creates/s answered when AVAILABLE", "settled_creates_per_s"),
        (f"4 Get p50 at {size:,} / at {small:,}", "scale_get_ratio_100k_vs_1k"),
        (f"4 List(100) p50 at {size:,} / at {small:,}", "scale_list_ratio_100k_vs_1k"),
        (f"4 server RSS MiB, {size:,} stored", "server_rss_mib_100k"),
        (f"4 restart to SERVING s, {size:,} stored", "restart_to_serving_s_100k"),
        (f"4 restart to a create AVAILABLE s, {size:,} stored", "restart_to_first_create_available_s_100k"),
        (f"5 watch fan-out p99 ms ({result['watch_streams']:,} streams)", "watch_fanout_p99_ms"),
        ("5 the same on the bare grpc.aio server, p99 ms", "watch_fanout_ceiling_p99_ms"),
        ("5 watch fan-out p99 / the bare server's", "watch_fanout_ceiling_ratio"),
        ("5 server CPU µs per message delivered", "watch_server_cpu_us_per_message"),
        ("5 ... on the bare server", "watch_ceiling_cpu_us_per_message"),
        ("5 watch per-delivery p99 ms", "watch_delivery_p99_ms"),
        ("5 server RSS MiB with the streams", "watch_server_rss_mib"),
        ("6 Connect / gRPC", "connect_vs_grpc_ratio"),
    ]
    rows = [
        [name, _fmt(result.get(key)), result["goals"].get(key, ""), met(key, result.get(key))] for name, key in main
    ]
    out = [_rows(["figure", "value", "goal", "met"], rows)]
    if "skipped" in h2:
        out.append(f"h2load: {h2['skipped']}")
    growth = []
    for key, s in sorted(result["sizes"].items(), key=lambda kv: int(kv[0])):
        life, get = s["lifecycle"], s["get"]
        growth.append(
            [
                f"{int(key):,}",
                f"{s['stored']:,}",
                _fmt(s["restart_to_serving_s"]),
                _fmt(s["server_rss_mib_after_reads"], 0),
                _fmt(get["kibo"]["qps"]),
                f"{_fmt(get['kibo']['p50_ms'])}/{_fmt(get['kibo']['p99_ms'])}",
                _fmt(get["ratio"]),
                f"{_fmt(s['list']['p50_ms'])}/{_fmt(s['list']['p99_ms'])}" if "list" in s else "-",
                f"{_fmt(life['create_to_available_p50_ms'])}/{_fmt(life['create_to_available_p99_ms'])}",
                f"{_fmt(life['stop_to_stopped_p50_ms'])}/{_fmt(life['stop_to_stopped_p99_ms'])}",
                _fmt(s["creates_durable"]["per_s"]),
                _fmt(s["creates_settled"]["per_s"]),
            ]
        )
    headers = [
        "stored",
        "actual",
        "restart s",
        "RSS MiB",
        "Get QPS",
        "Get p50/p99",
        "/ceiling",
        "List p50/p99",
        "create p50/p99",
        "stop p50/p99",
        "durable/s",
        "settled/s",
    ]
    out += ["", "growth (figures 1-4 at each store size; latencies in ms):", _rows(headers, growth)]
    scale = result["scale"]
    rows = []
    for size in scale["sizes"]:
        key = str(size) if str(size) in scale["get"] else size
        get, lst = scale["get"][key], scale["list"][key]
        rows.append(
            [
                f"{size:,}",
                _fmt(scale["restart_to_serving_s"][key]),
                _fmt(scale["server_rss_mib_after_reads"][key], 0),
                _fmt(get["qps"]),
                f"{_fmt(get['p50_ms'])}/{_fmt(get['p99_ms'])}",
                _fmt(lst["qps"]),
                f"{_fmt(lst['p50_ms'])}/{_fmt(lst['p99_ms'])}",
                _fmt(scale["list_all_s"][key]),
            ]
        )
    headers = ["stored", "restart s", "RSS MiB", "Get QPS", "Get p50/p99", "List QPS", "List p50/p99", "list all s"]
    out += ["", "scale (two servers side by side, loads alternating; ms):", _rows(headers, rows)]
    out.append("")
    out.append(f"connect_vs_grpc_ratio: {result['notes']['connect_vs_grpc_ratio']}")
    out.append(f"scale: {result['notes']['scale']}")
    out.append(f"{result['command']}: {result['elapsed_s']:.0f}s")
    return "\n".join(out)
