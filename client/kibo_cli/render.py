"""Human views of workspaces, commands, cleanup status, events and volumes."""

from __future__ import annotations

from collections.abc import Iterable

import kibotos
from kibo.ctrl.v1 import command_pb2, workspace_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2
from kibo.ctrl.v1 import volume_service_pb2 as vol_pb2
from rich.console import Group, RenderableType
from rich.text import Text

from .output import enum_name, grid, kv, table, when

WP = workspace_pb2


def resources(spec: workspace_pb2.WorkspaceSpec) -> str:
    r = spec.resources
    return f"{r.vcpus} vCPU, {r.memory_mib} MiB memory, {r.writable_layer_gib} GiB writable layer"


def volume_fate(binding: workspace_pb2.VolumeBinding) -> str:
    return "deleted with the workspace" if binding.delete_with_workspace else "kept on delete (only unbound)"


def volumes(spec: workspace_pb2.WorkspaceSpec) -> str:
    lines = []
    for binding in spec.volumes:
        pool = f", pool {binding.storage_pool}" if binding.storage_pool else ""
        lines.append(f"{binding.volume_id} at {binding.mount_path}{pool}: {volume_fate(binding)}")
    return "\n".join(lines) or "-"


def network(spec: workspace_pb2.WorkspaceSpec) -> str:
    """`egress ALLOW_LISTED (10.0.0.0/8, api.github.com; ports 443; denied 10.9.0.0/16, evil.example)`."""
    policy = spec.network_policy
    egress = enum_name(WP.NetworkEgress, policy.egress, "NETWORK_EGRESS_")
    parts = []
    allowed = [*policy.allowed_cidrs, *policy.allowed_domains]
    if allowed:
        parts.append(", ".join(allowed))
    if policy.allowed_ports:
        parts.append(f"ports {', '.join(str(p) for p in policy.allowed_ports)}")
    denied = [*policy.denied_cidrs, *policy.denied_domains]
    if denied:
        parts.append(f"denied {', '.join(denied)}")
    return f"egress {egress}" + (f" ({'; '.join(parts)})" if parts else "")


def expiration(workspace: workspace_pb2.Workspace) -> str:
    exp = workspace.expiration
    if not exp.HasField("expire_time"):
        return f"none (revision {exp.revision})"
    action = enum_name(WP.ExpirationAction, exp.action, "EXPIRATION_ACTION_").lower()
    return f"{action} at {when(exp.expire_time)} (revision {exp.revision})"


def last_stop(workspace: workspace_pb2.Workspace) -> str:
    if not workspace.HasField("last_stop"):
        return "-"
    stop = workspace.last_stop
    cause = enum_name(WP.StopCause, stop.cause, "STOP_CAUSE_")
    return f"{cause}, command {stop.command_id}, durability {durability(stop.durability)}"


def durability(value: int) -> str:
    name = enum_name(WP.StopDurability, value, "STOP_DURABILITY_")
    if value == WP.STOP_DURABILITY_UNCONFIRMED:
        return f"{name} (not confirmed on disk)"
    if value == WP.STOP_DURABILITY_UNSPECIFIED:
        return "not known yet"
    return name


def failure(workspace: workspace_pb2.Workspace) -> str:
    if not workspace.HasField("failure"):
        return "-"
    stage = workspace.failure.stage or "no operation (it ended while running)"
    return f"{workspace.failure.message} (stage: {stage})"


def guest(workspace: workspace_pb2.Workspace) -> str:
    g = workspace.guest
    last = when(g.last_reset_time, g, "last_reset_time")
    responding = "responding" if g.responding else "not responding"
    return f"reset count {g.reset_count}, last reset {'never' if last == '-' else last}, {responding}"


def workspace(ws: workspace_pb2.Workspace) -> RenderableType:
    rows: list[tuple[str, str | Text]] = [
        ("Workspace", ws.workspace_id),
        ("State", Text(kibotos.state_name(ws.state) + (" (deletion started)" if ws.deletion_started else ""))),
        ("Resources", resources(ws.spec)),
        ("Volumes", volumes(ws.spec)),
        ("Network", network(ws.spec)),
        ("Expiration", expiration(ws)),
        ("Last stop", last_stop(ws)),
        ("Failure", failure(ws)),
        ("Guest", guest(ws)),
        ("Execution", f"generation {ws.execution_generation}, node {ws.node_id or '-'}"),
        ("Labels", kv(ws.labels)),
        ("Annotations", kv(ws.annotations)),
        ("Created", when(ws.create_time, ws, "create_time")),
        ("Updated", when(ws.update_time, ws, "update_time")),
    ]
    if ws.HasField("delete_time"):
        rows.append(("Deleted", when(ws.delete_time)))
    if ws.conditions:
        # One row, a line per condition: the grid's name column keeps its width.
        rows.append(("Conditions", "\n".join(condition(c) for c in ws.conditions)))
    return grid(rows)


def condition(c: workspace_pb2.Condition) -> str:
    status = "True" if c.status else "False"
    reason = f" {c.reason}" if c.reason else ""
    return f"{c.type} {status}{reason} {c.message}".rstrip()


def workspaces(items: Iterable[workspace_pb2.Workspace]) -> RenderableType:
    result = table("WORKSPACE", "STATE", "RESOURCES", "LABELS", "CREATED")
    for ws in items:
        r = ws.spec.resources
        result.add_row(
            ws.workspace_id,
            kibotos.state_name(ws.state),
            f"{r.vcpus} vCPU / {r.memory_mib} MiB / {r.writable_layer_gib} GiB",
            Text(kv(ws.labels)),
            when(ws.create_time, ws, "create_time"),
        )
    return result


def command_error(command: command_pb2.WorkspaceCommand) -> str:
    if not command.HasField("error"):
        return "-"
    error = kibotos.CommandFailedError(command)
    code = error.status_code
    return f"{code.name if code is not None else command.error.code}: {command.error.message}"


def command(cmd: command_pb2.WorkspaceCommand) -> RenderableType:
    rows: list[tuple[str, str | Text]] = [
        ("Command", cmd.command_id),
        ("Workspace", cmd.workspace_id or "-"),
        ("Kind", enum_name(command_pb2.CommandKind, cmd.kind, "COMMAND_KIND_")),
        ("State", kibotos.command_state_name(cmd.state)),
        ("Error", command_error(cmd)),
    ]
    if cmd.kind in (command_pb2.COMMAND_KIND_STOP, command_pb2.COMMAND_KIND_FORCE_STOP):
        rows.append(("Stop cause", enum_name(WP.StopCause, cmd.stop_cause, "STOP_CAUSE_")))
        rows.append(("Durability", durability(cmd.result.durability)))
    rows.append(("Created", when(cmd.create_time, cmd, "create_time")))
    rows.append(("Updated", when(cmd.update_time, cmd, "update_time")))
    return grid(rows)


def cleanup(c: obs_pb2.WorkspaceCleanup) -> RenderableType:
    head = grid(
        [
            ("Workspace", c.workspace_id),
            ("State", enum_name(obs_pb2.CleanupState, c.state, "CLEANUP_STATE_")),
            ("Completeness", enum_name(obs_pb2.CleanupCompleteness, c.completeness, "CLEANUP_COMPLETENESS_")),
        ]
    )
    components = table("COMPONENT", "STATUS", "SOURCE", "OBSERVED")
    for row in c.components:
        components.add_row(
            enum_name(obs_pb2.CleanupComponent, row.component, "CLEANUP_COMPONENT_"),
            enum_name(obs_pb2.ComponentStatus, row.status, "COMPONENT_STATUS_"),
            enum_name(obs_pb2.CleanupSource, row.source, "CLEANUP_SOURCE_"),
            when(row.observe_time, row, "observe_time"),
        )
    parts: list[RenderableType] = [head, Text(""), Text("Components", style="bold"), components]
    if c.HasField("release"):
        parts += [
            Text(""),
            Text("Release (unfinished; these times are diagnostics, not deadlines)", style="bold"),
            grid(
                [
                    ("Pending since", when(c.release.pending_since, c.release, "pending_since")),
                    ("Last confirmed", when(c.release.last_confirmed_time, c.release, "last_confirmed_time")),
                ]
            ),
        ]
    else:
        parts += [Text(""), Text("Release: nothing unfinished")]
    return Group(*parts)


def events(items: Iterable[obs_pb2.WorkspaceEvent]) -> RenderableType:
    result = table("TIME", "EVENT", "CHANGE", "COMMAND", "MESSAGE")
    for event in items:
        change = ""
        if event.from_state or event.to_state:
            change = f"{kibotos.state_name(event.from_state)} -> {kibotos.state_name(event.to_state)}"
        result.add_row(
            when(event.event_time, event, "event_time"),
            enum_name(obs_pb2.EventType, event.type, "EVENT_TYPE_"),
            change,
            Text(event.command_id or "-"),
            Text(event.message),
        )
    return result


def instances(items: Iterable[obs_pb2.Instance]) -> RenderableType:
    result = table("INSTANCE", "GENERATION", "NODE", "PHASE", "HOLDS EXECUTION", "RESTARTS", "REASON")
    for instance in items:
        result.add_row(
            Text(instance.instance_id),
            str(instance.execution_generation),
            Text(instance.node_id or "-"),
            enum_name(obs_pb2.InstancePhase, instance.phase, "INSTANCE_PHASE_"),
            "yes" if instance.holds_execution else "no",
            str(instance.restart_count),
            Text(instance.reason or "-"),
        )
    return result


def volume(v: vol_pb2.Volume) -> RenderableType:
    return grid(
        [
            ("Volume", v.volume_id),
            ("State", enum_name(vol_pb2.VolumeState, v.state, "VOLUME_STATE_")),
            ("Capacity", f"{v.capacity_gib} GiB"),
            ("Storage pool", v.storage_pool or "-"),
            ("Bound to", v.workspace_id or "-"),
            ("Created", when(v.create_time, v, "create_time")),
        ]
    )
