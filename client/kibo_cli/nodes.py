"""`kibo node list|cordon|uncordon|drain`: the cluster's nodes (an operator token)."""

from __future__ import annotations

from typing import Annotated

import typer
from kibo.node.v1 import node_admin_service_pb2 as nodes_pb2

from . import output
from .output import Format
from .session import OutputOpt, connect, handle

app = typer.Typer(help="The cluster's nodes: list, cordon, uncordon, drain (an operator token).", no_args_is_help=True)
NodeId = Annotated[str, typer.Argument(help="The node's ID (kibo node list).", show_default=False)]


def _state(node: nodes_pb2.Node) -> str:
    return nodes_pb2.NodeState.Name(node.state).removeprefix("NODE_STATE_")


def _show(node: nodes_pb2.Node, fmt: Format) -> None:
    if fmt is Format.json:
        output.emit_json(node)
    else:
        output.stdout().print(f"{node.id}: {_state(node)} ({node.instances} instances)", markup=False)


GIB = 1 << 30


def _ratio(ratio: float) -> str:
    """How the figure was made: " (x16)" of the host's; nothing when it was given as is."""
    return f" (x{ratio:g})" if ratio else ""


def _storage(node: nodes_pb2.Node) -> str:
    """Declared capacity promised of what the node offers (sparse images: limits, not usage)."""
    if not node.storage_gib:
        return "-"
    return f"{node.storage_promised_bytes / GIB:.0f}/{node.storage_gib}" + _ratio(node.disk_allocation_ratio)


@app.command("list")
@handle
def node_list(fmt: OutputOpt = Format.text) -> None:
    """Every node: state (READY, SILENT, CORDONED, DRAINING, DRAINED), vCPU and memory used of
    what it offers (the host's x its allocation ratio), storage promised of what it offers,
    real free disk, conditions (DiskPressure: under its disk reserve, no new storage),
    instances, storage pool and labels."""
    with connect() as client:
        nodes = client.list_nodes()
    if fmt is Format.json:
        output.emit_json({"nodes": [output.to_dict(node) for node in nodes]})
        return
    table = output.table(
        "NODE", "STATE", "VCPU", "MEMORY MIB", "STORAGE GIB", "DISK FREE", "CONDITIONS", "INSTANCES", "POOL", "LABELS"
    )
    for node in nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items())) or "-"
        table.add_row(
            node.id,
            _state(node),
            f"{node.used_vcpus}/{node.vcpus}" + _ratio(node.cpu_allocation_ratio),
            f"{node.used_memory_mib}/{node.memory_mib}" + _ratio(node.memory_allocation_ratio),
            _storage(node),
            f"{node.disk_free_bytes / GIB:.1f} GiB" if node.disk_free_bytes else "-",
            ",".join(node.conditions) or "-",
            str(node.instances),
            node.storage_pool,
            labels,
        )
    output.stdout().print(table)


@app.command("cordon")
@handle
def node_cordon(node_id: NodeId, fmt: OutputOpt = Format.text) -> None:
    """No new workspaces are placed on the node; what runs there keeps running."""
    with connect() as client:
        _show(client.cordon_node(node_id), fmt)


@app.command("uncordon")
@handle
def node_uncordon(node_id: NodeId, fmt: OutputOpt = Format.text) -> None:
    """Place workspaces on the node again (also ends a drain)."""
    with connect() as client:
        _show(client.uncordon_node(node_id), fmt)


@app.command("forget")
@handle
def node_forget(
    node_id: NodeId,
    abandon_disks: Annotated[
        bool,
        typer.Option(
            "--abandon-disks",
            help="Let the workspaces and volumes whose disks are on the node start elsewhere with empty "
            "disks (their data there is lost). Without it, a node that holds disks is not forgotten.",
        ),
    ] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Declare a SILENT node lost for good (its host is gone): what ran there is released
    (its workspaces leave UNKNOWN, FAILED: start them again elsewhere) and it may never join
    again under its ID. Only an operator does this; kibo never does it on its own."""
    with connect() as client:
        response = client.forget_node(node_id, abandon_disks=abandon_disks)
    if fmt is Format.json:
        output.emit_json(response)
        return
    _show(response.node, fmt)
    if response.released_workspace_ids:
        output.stdout().print(f"released: {', '.join(response.released_workspace_ids)}", markup=False)
    abandoned = [*response.abandoned_workspace_ids, *response.abandoned_volume_ids]
    if abandoned:
        output.stdout().print(f"disks abandoned (start with empty ones): {', '.join(abandoned)}", markup=False)


@app.command("drain")
@handle
def node_drain(
    node_id: NodeId,
    move_stopped: Annotated[
        bool,
        typer.Option(
            "--move-stopped",
            help="Also move the disks of its STOPPED workspaces to other nodes (a move each; "
            "follow one with kibo command get ID).",
        ),
    ] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Cordon the node; it is DRAINING until its last instance is gone (its workspaces leave
    as they are stopped or deleted, and start again on another node), then DRAINED. A stopped
    workspace's disks stay on the node unless --move-stopped moves them."""
    with connect() as client:
        if not move_stopped:
            _show(client.drain_node(node_id), fmt)
            return
        response = client.drain_node_moving_stopped(node_id)
    if fmt is Format.json:
        output.emit_json(
            {
                "node": output.to_dict(response.node),
                "moves": [{"workspace_id": m.workspace_id, "command_id": m.command_id} for m in response.moves],
                "unmoved": list(response.unmoved),
            }
        )
        return
    _show(response.node, fmt)
    for move in response.moves:
        output.stdout().print(f"moving {move.workspace_id}: command {move.command_id}", markup=False)
    for unmoved in response.unmoved:
        output.stdout().print(f"not moved: {unmoved}", markup=False)
