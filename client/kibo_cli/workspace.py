"""`kibo workspace ...`: create, get, list, stop, start, delete, wait, cleanup-status,
events, instances, labels, resize, expire; bind-volume, rebind-volume, unbind-volume,
network-policy and revoke-access (workspace_config.py); exec (data_plane.py); shell,
start-process, ps, kill, logs (workspace_processes.py); cp, ls, stat, mkdir, mv, rm, watch
(workspace_files.py)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import Annotated

import kibotos
import typer
from kibo.ctrl.v1 import command_pb2, workspace_pb2
from kibo.ctrl.v1 import observation_service_pb2 as obs_pb2

from . import (
    data_plane,
    exit_codes,
    exposures,
    output,
    parsing,
    render,
    workspace_config,
    workspace_files,
    workspace_processes,
)
from .exit_codes import ExitCode
from .output import Format, note
from .progress import Progress
from .session import (
    CLI_SETTLE,
    DEFAULT_TIMEOUT,
    CommandIdOpt,
    NoWaitOpt,
    OutputOpt,
    TimeoutOpt,
    YesOpt,
    accepted,
    command_id_or_new,
    confirm,
    connect,
    fail,
    handle,
    report,
    run_command,
    timeout_seconds,
)

app = typer.Typer(help="Create, inspect, stop, start and delete workspaces.", no_args_is_help=True)

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
FORCE_CAPABILITY = "workspace.stop.force"


class ExpireAction(enum.StrEnum):
    stop = "stop"
    delete = "delete"

    def wire(self) -> int:
        if self is ExpireAction.delete:
            return int(workspace_pb2.EXPIRATION_ACTION_DELETE)
        return int(workspace_pb2.EXPIRATION_ACTION_STOP)


def _show_workspace(workspace: workspace_pb2.Workspace, fmt: Format) -> None:
    if fmt is Format.json:
        output.emit_json(workspace)
    else:
        output.stdout().print(render.workspace(workspace))


def _emit_result(workspace: workspace_pb2.Workspace, command: command_pb2.WorkspaceCommand, fmt: Format) -> bool:
    """JSON of the final workspace and command; True when done (JSON printed)."""
    if fmt is Format.json:
        output.emit_json({"workspace": output.to_dict(workspace), "command": output.to_dict(command)})
        return True
    return False


def _final(result: kibotos.WaitResult, response: kibotos.CommandResponse) -> command_pb2.WorkspaceCommand:
    return result.command if result.command is not None else response.command


# -- create ----------------------------------------------------------------------------


@app.command()
@handle
def create(
    vcpus: Annotated[int, typer.Option(help="vCPUs (0: the server default).")] = 0,
    memory: Annotated[str | None, typer.Option(help="Memory: MiB, or with a unit (512Mi, 2Gi).")] = None,
    writable_layer: Annotated[int, typer.Option(help="Writable layer size, GiB (0: the server default).")] = 0,
    volume: Annotated[
        list[str] | None,
        typer.Option(help="Bind an existing volume (repeatable). Kept on delete unless --delete-with-workspace."),
    ] = None,
    mount_path: Annotated[
        list[str] | None, typer.Option(help="Mount path of each --volume, in order (default /mnt/<volume ID>).")
    ] = None,
    delete_with_workspace: Annotated[
        bool, typer.Option("--delete-with-workspace", help="Delete the --volume volumes with the workspace.")
    ] = False,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE label (repeatable).")] = None,
    annotation: Annotated[list[str] | None, typer.Option(help="KEY=VALUE annotation (repeatable).")] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE a node's labels must have to run it (repeatable; kibo node list shows them)."),
    ] = None,
    expire_in: Annotated[str | None, typer.Option(help="Expire after this long, e.g. 8h.")] = None,
    expire_action: Annotated[ExpireAction, typer.Option(help="What expiry does.")] = ExpireAction.stop,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    command_id: CommandIdOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the workspace ID.")] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Create a workspace (with its own volume at /data) and wait until it is AVAILABLE."""
    command_id = command_id_or_new(command_id)
    volumes, paths = volume or [], mount_path or []
    if len(paths) > len(volumes):
        raise fail("more --mount-path than --volume", ExitCode.USAGE)
    try:
        memory_mib = parsing.memory_mib(memory) if memory else 0
        spec = workspace_pb2.WorkspaceSpec(
            resources=workspace_pb2.Resources(vcpus=vcpus, memory_mib=memory_mib, writable_layer_gib=writable_layer),
            labels=parsing.pairs(label),
            annotations=parsing.pairs(annotation, "annotation"),
            node_selector=parsing.pairs(node_selector, "node selector"),
            volumes=[
                workspace_pb2.VolumeBinding(
                    volume_id=volume_id,
                    mount_path=paths[i] if i < len(paths) else f"/mnt/{volume_id}",
                    delete_with_workspace=delete_with_workspace,
                )
                for i, volume_id in enumerate(volumes)
            ],
        )
        expire_time = parsing.time_or_duration(expire_in) if expire_in else None
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    seconds = timeout_seconds(timeout)
    action = expire_action.wire() if expire_time is not None else 0
    with connect() as client:
        if no_wait:
            response = client.create_workspace(
                spec, command_id=command_id, expire_time=expire_time, expiration_action=action, settle=False
            )
            if quiet:
                output.stdout().print(response.workspace.workspace_id, markup=False)
            else:
                accepted(response, fmt)
            return
        settled, result = run_command(
            client,
            "creating",
            lambda options, on_answer: client.create_workspace(
                spec,
                command_id=command_id,
                expire_time=expire_time,
                expiration_action=action,
                settle=options,
                on_answer=on_answer,
            ),
            timeout=seconds,
            what="the creation",
        )
    if quiet:
        output.stdout().print(result.workspace.workspace_id, markup=False)
    elif not _emit_result(result.workspace, _final(result, settled), fmt):
        _show_workspace(result.workspace, fmt)


# -- reads -----------------------------------------------------------------------------


@app.command()
@handle
def get(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    """Show a workspace: state, resources, volumes, network, expiration, last stop, failure, guest."""
    with connect() as client:
        _show_workspace(client.get_workspace(workspace_id), fmt)


@app.command("list")
@handle
def list_(
    include_deleted: Annotated[bool, typer.Option("--include-deleted", help="Also list DELETED workspaces.")] = False,
    label: Annotated[list[str] | None, typer.Option(help="Only with this KEY=VALUE label (repeatable).")] = None,
    state: Annotated[str | None, typer.Option(help="Only in this state, e.g. AVAILABLE.")] = None,
    filter_: Annotated[
        str | None, typer.Option("--filter", help='A raw filter: state = STOPPED AND labels.team != "infra".')
    ] = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """List workspaces (deleted ones only with --include-deleted)."""
    terms: list[str] = []
    if state:
        terms.append(f"state = {state.upper().removeprefix('WORKSPACE_STATE_')}")
    try:
        for key, value in parsing.pairs(label).items():
            terms.append(f'labels.{key} = "{value}"')
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    if filter_:
        terms.append(filter_)
    with connect() as client:
        items = list(client.list_workspaces(include_deleted=include_deleted, filter=" AND ".join(terms)))
    if fmt is Format.json:
        output.emit_json({"workspaces": [output.to_dict(w) for w in items]})
    else:
        output.stdout().print(render.workspaces(items))


@app.command()
@handle
def events(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    """The workspace's lifecycle events: state changes, commands, resets, server stops."""
    with connect() as client:
        items = list(client.list_workspace_events(workspace_id, page_size=1000))
    if fmt is Format.json:
        output.emit_json({"events": [output.to_dict(e) for e in items]})
    else:
        output.stdout().print(render.events(items))


@app.command()
@handle
def instances(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    """The workspace's instances: one per execution, the current one and any still held (node, phase, restarts)."""
    with connect() as client:
        items = client.list_workspace_instances(workspace_id)
    if fmt is Format.json:
        output.emit_json({"instances": [output.to_dict(i) for i in items]})
    else:
        output.stdout().print(render.instances(items))


@app.command(
    "cleanup-status",
    help=(
        "Which parts of the workspace's execution are released and which are still held.\n\n"
        "Read-only: triggers nothing. Exits 17 when the observation is PARTIAL and 18 when it is "
        "UNKNOWN (unknown parts are never shown as released)."
    ),
)
@handle
def cleanup_status(workspace_id: WorkspaceId, fmt: OutputOpt = Format.text) -> None:
    with connect() as client:
        cleanup = client.get_workspace_cleanup(workspace_id)
    if fmt is Format.json:
        output.emit_json(cleanup)
    else:
        output.stdout().print(render.cleanup(cleanup))
    if cleanup.completeness == obs_pb2.CLEANUP_COMPLETENESS_PARTIAL:
        note("kibo: the observation is PARTIAL: parts shown UNKNOWN may still be held")
        raise typer.Exit(int(ExitCode.CLEANUP_PARTIAL))
    if cleanup.completeness in (obs_pb2.CLEANUP_COMPLETENESS_UNKNOWN, obs_pb2.CLEANUP_COMPLETENESS_UNSPECIFIED):
        note("kibo: the observation is UNKNOWN: nothing here can be taken as released")
        raise typer.Exit(int(ExitCode.CLEANUP_UNKNOWN))


# -- lifecycle -------------------------------------------------------------------------


@app.command(
    help=(
        "Stop a workspace: sync the guest's writes, stop the instance, keep volumes and writable "
        "layer.\n\n"
        "--force is for a stop that cannot finish (a stuck stop, FAILED still holding execution): "
        'one short sync only, so the result is "not confirmed on disk". It asks for confirmation '
        "unless --yes, which is required when stdin is not a terminal.\n\n"
        "--all (instead of an ID) stops every AVAILABLE workspace, or with --label those with these "
        "labels, several at once; it names them and asks first, unless --yes. None AVAILABLE: "
        "nothing to do, exit 0."
    )
)
@handle
def stop(
    workspace_id: Annotated[
        str | None, typer.Argument(help="The workspace ID (ws-...); none with --all.", show_default=False)
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Force stop: do not wait for the guest's writes (the last ones may be lost)."),
    ] = False,
    all_: Annotated[bool, typer.Option("--all", help="Stop every AVAILABLE workspace (graceful stops).")] = False,
    label: Annotated[
        list[str] | None, typer.Option(help="With --all: only those with this KEY=VALUE label (repeatable).")
    ] = None,
    yes: YesOpt = False,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    if all_:
        if workspace_id is not None or force or command_id is not None:
            raise fail(
                "--all stops every AVAILABLE workspace gracefully, each with a command ID of its own: "
                "give no workspace ID, --force or --command-id with it",
                ExitCode.USAGE,
            )
        _stop_all(label, yes=yes, no_wait=no_wait, seconds=timeout_seconds(timeout), fmt=fmt)
        return
    if workspace_id is None or label:
        raise fail("give the workspace ID to stop, or --all (with any --label)", ExitCode.USAGE)
    command_id = command_id_or_new(command_id)
    seconds = timeout_seconds(timeout)
    with connect() as client:
        if force:
            if FORCE_CAPABILITY not in client.get_capabilities():
                raise fail(f"this server does not declare {FORCE_CAPABILITY}", ExitCode.ERROR)
            # Like delete: a "y" piped in is not someone confirming a possible loss of writes.
            confirm(
                f"Force stop {workspace_id}? It does not wait for the guest's writes; the last ones may be lost.",
                yes,
                require_terminal=True,
            )
        if no_wait:
            accepted(client.stop_workspace(workspace_id, force=force, command_id=command_id, settle=False), fmt)
            return
        response, result = run_command(
            client,
            f"{'force ' if force else ''}stopping {workspace_id}",
            lambda options, on_answer: client.stop_workspace(
                workspace_id, force=force, command_id=command_id, settle=options, on_answer=on_answer
            ),
            timeout=seconds,
            what="the stop",
        )
    command = _final(result, response)
    if _emit_result(result.workspace, command, fmt):
        return
    console = output.stdout()
    state = kibotos.state_name(result.workspace.state)
    console.print(f"{workspace_id} is {state} (command {command.command_id})", markup=False)
    if command.result.durability == workspace_pb2.STOP_DURABILITY_UNCONFIRMED:
        console.print(
            "Writes: not confirmed on disk. The last writes may be lost; the next start recovers the "
            "filesystem from its journal.",
            markup=False,
        )
    elif command.result.durability == workspace_pb2.STOP_DURABILITY_CONFIRMED:
        console.print("Writes: confirmed on disk.", markup=False)


# How many stops `stop --all` has in flight at once.
STOP_ALL_AT_ONCE = 8


def _stop_all(label: list[str] | None, *, yes: bool, no_wait: bool, seconds: float, fmt: Format) -> None:
    """`kibo workspace stop --all [--label K=V]`: what README's "stop it all" runs. Lists the
    AVAILABLE workspaces (with those labels), names them, asks, then stops them several at once
    and waits for each; one that cannot be stopped is reported and the others go on."""
    try:
        labels = parsing.pairs(label)
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    terms = ["state = AVAILABLE", *(f'labels.{key} = "{value}"' for key, value in labels.items())]
    with connect() as client:
        ids = [w.workspace_id for w in client.list_workspaces(filter=" AND ".join(terms))]
        connection = client.connection
    which = "AVAILABLE workspace" + (f" with {', '.join(f'{k}={v}' for k, v in labels.items())}" if labels else "")
    if not ids:
        note(f"kibo: no {which}: nothing to stop")
        if fmt is Format.json:
            output.emit_json({"workspaces": []})
        return
    for workspace_id in ids:
        note(f"Will stop {workspace_id}.")
    confirm(f"Stop {len(ids)} {which}{'s' if len(ids) > 1 else ''}?", yes, require_terminal=True)
    console = output.stdout()

    def say(workspace: workspace_pb2.Workspace, command: command_pb2.WorkspaceCommand) -> None:
        """Each result as it comes (text); -o json prints them all at the end."""
        if fmt is Format.json:
            return
        state = kibotos.state_name(workspace.state)
        line = f"{workspace.workspace_id} is {state} (command {command.command_id})"
        if not kibotos.is_terminal(command):  # --no-wait
            line = f"{workspace.workspace_id}: command {command.command_id} accepted, workspace {state}"
        console.print(line, markup=False)

    done, failures = asyncio.run(_stop_each(connection, ids, say, no_wait=no_wait, seconds=seconds))
    if fmt is Format.json:
        stopped = [{"workspace": output.to_dict(w), "command": output.to_dict(c)} for w, c in done]
        output.emit_json({"workspaces": stopped})
    if failures:
        note(f"kibo: {len(failures)} of {len(ids)} not stopped: {', '.join(failures)}")
        raise typer.Exit(int(next(iter(failures.values()))))


Stopped = tuple[workspace_pb2.Workspace, command_pb2.WorkspaceCommand]


async def _stop_each(
    connection: kibotos.Connection,
    ids: list[str],
    on_done: Callable[[workspace_pb2.Workspace, command_pb2.WorkspaceCommand], None],
    *,
    no_wait: bool,
    seconds: float,
) -> tuple[list[Stopped], dict[str, ExitCode]]:
    """Stop each workspace (at most STOP_ALL_AT_ONCE at a time), settle and wait for it; return
    the stopped ones in order and, per workspace that was not, its exit code (said on stderr)."""
    deadline = time.monotonic() + seconds
    slots = asyncio.Semaphore(STOP_ALL_AT_ONCE)
    done: dict[str, Stopped] = {}
    failures: dict[str, ExitCode] = {}
    async with kibotos.AsyncClient(connection=connection) as client:

        async def one(workspace_id: str) -> None:
            command_id = kibotos.new_command_id("kibo")
            async with slots:
                try:
                    if no_wait:
                        response = await client.stop_workspace(workspace_id, command_id=command_id, settle=False)
                        done[workspace_id] = (response.workspace, response.command)
                        on_done(*done[workspace_id])
                        return
                    options = kibotos.SettleOptions(
                        timeout=max(0.1, deadline - time.monotonic()),
                        initial_backoff=CLI_SETTLE.initial_backoff,
                        max_backoff=CLI_SETTLE.max_backoff,
                    )
                    response = await client.stop_workspace(workspace_id, command_id=command_id, settle=options)
                    result = await client.wait(workspace_id, command_id, timeout=max(0.1, deadline - time.monotonic()))
                except kibotos.KiboError as error:
                    note(f"kibo: {workspace_id} was not stopped:")
                    report(error)
                    failures[workspace_id] = exit_codes.of(error)
                    return
            done[workspace_id] = (result.workspace, _final(result, response))
            on_done(*done[workspace_id])

        await asyncio.gather(*(one(workspace_id) for workspace_id in ids))
    return [done[i] for i in ids if i in done], failures


@app.command()
@handle
def start(
    workspace_id: WorkspaceId,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Start a STOPPED workspace (or a FAILED one that holds no execution): a new instance."""
    command_id = command_id_or_new(command_id)
    seconds = timeout_seconds(timeout)
    with connect() as client:
        if no_wait:
            accepted(client.start_workspace(workspace_id, command_id=command_id, settle=False), fmt)
            return
        response, result = run_command(
            client,
            f"starting {workspace_id}",
            lambda options, on_answer: client.start_workspace(
                workspace_id, command_id=command_id, settle=options, on_answer=on_answer
            ),
            timeout=seconds,
            what="the start",
        )
    command = _final(result, response)
    if _emit_result(result.workspace, command, fmt):
        return
    output.stdout().print(
        f"{workspace_id} is {kibotos.state_name(result.workspace.state)} "
        f"(execution generation {result.workspace.execution_generation}, command {command.command_id})",
        markup=False,
    )


@app.command(
    help=(
        "Delete a workspace and wait (up to --timeout, default 1h) until it is DELETED.\n\n"
        "First says, for each bound volume, whether it is deleted with the workspace or kept. "
        "Asks for confirmation unless --yes, which is required when stdin is not a terminal. "
        "Giving up the wait never cancels the delete."
    )
)
@handle
def delete(
    workspace_id: WorkspaceId,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (required without a terminal).")
    ] = False,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    command_id = command_id_or_new(command_id)
    seconds = timeout_seconds(timeout)
    with connect() as client:
        workspace = client.get_workspace(workspace_id)
        # Already DELETED: nothing is left to lose, so no volume lines and no question; the
        # server answers (its refusal, or the result of the delete resent with its command ID).
        if workspace.state != workspace_pb2.WORKSPACE_STATE_DELETED:
            for binding in workspace.spec.volumes:
                fate = (
                    "will be deleted with the workspace" if binding.delete_with_workspace else "will be kept (unbound)"
                )
                note(f"Volume {binding.volume_id} at {binding.mount_path} {fate}.")
            note("The writable layer will be deleted; credentials issued for the workspace become invalid.")
            confirm(f"Delete workspace {workspace_id}?", yes, require_terminal=True)
        if no_wait:
            accepted(client.delete_workspace(workspace_id, command_id=command_id, settle=False), fmt)
            return
        response, result = run_command(
            client,
            f"deleting {workspace_id}",
            lambda options, on_answer: client.delete_workspace(
                workspace_id, command_id=command_id, settle=options, on_answer=on_answer
            ),
            timeout=seconds,
            deleted=True,
            what="the delete",
        )
    command = _final(result, response)
    if _emit_result(result.workspace, command, fmt):
        return
    console = output.stdout()
    console.print(f"{workspace_id} is {kibotos.state_name(result.workspace.state)} (command {command.command_id})")
    kept = [b.volume_id for b in workspace.spec.volumes if not b.delete_with_workspace]
    if kept:
        console.print(f"Kept volumes: {', '.join(kept)}", markup=False)


@app.command(
    help=(
        "Wait until the command (if given) is terminal and the workspace is steady (AVAILABLE, "
        "STOPPED, FAILED or DELETED). Exits 9 if the command failed or the workspace is FAILED."
    )
)
@handle
def wait(
    workspace_id: WorkspaceId,
    command: Annotated[
        str | None, typer.Option("--command", help="Wait for this command too (its ID).", show_default=False)
    ] = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    fmt: OutputOpt = Format.text,
) -> None:
    seconds = timeout_seconds(timeout)
    with connect() as client:
        deleted = bool(command) and client.get_command(command or "").kind == command_pb2.COMMAND_KIND_DELETE
        try:
            with Progress(f"waiting for {workspace_id}") as progress:
                result = client.wait(
                    workspace_id, command, deleted=deleted, timeout=seconds, on_update=progress.on_update
                )
        except kibotos.WaitTimeoutError as error:
            raise fail(error.message, ExitCode.WAIT_TIMEOUT) from None
    if fmt is Format.json:
        data = {"workspace": output.to_dict(result.workspace)}
        if result.command is not None:
            data["command"] = output.to_dict(result.command)
        output.emit_json(data)
    else:
        _show_workspace(result.workspace, fmt)
    if result.workspace.state == workspace_pb2.WORKSPACE_STATE_FAILED:
        note(f"kibo: {workspace_id} is FAILED: {result.workspace.failure.message}")
        raise typer.Exit(int(ExitCode.COMMAND_FAILED))


# -- configuration ---------------------------------------------------------------------


def _edit(current: dict[str, str], changes: list[str], what: str) -> dict[str, str]:
    result = dict(current)
    for change in changes:
        if change.endswith("-") and "=" not in change:
            result.pop(change[:-1], None)
        else:
            key, value = parsing.pair(change, what)
            result[key] = value
    return result


@app.command()
@handle
def labels(
    workspace_id: WorkspaceId,
    changes: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE sets a label, KEY- removes it. None: show them.")
    ] = None,
    annotation: Annotated[
        list[str] | None, typer.Option("--annotation", "-a", help="KEY=VALUE sets an annotation, KEY- removes it.")
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace all labels/annotations given instead of merging.")
    ] = False,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Show or change a workspace's labels and annotations (any state but DELETED)."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        workspace = client.get_workspace(workspace_id)
        if changes or annotation:
            try:
                new_labels = _edit({} if replace and changes else dict(workspace.labels), changes or [], "label")
                new_annotations = _edit(
                    {} if replace and annotation else dict(workspace.annotations), annotation or [], "annotation"
                )
            except typer.BadParameter as error:
                raise fail(str(error.message), ExitCode.USAGE) from None
            workspace = client.set_workspace_labels(
                workspace_id, new_labels, new_annotations, command_id=command_id
            ).workspace
    if fmt is Format.json:
        output.emit_json({"labels": dict(workspace.labels), "annotations": dict(workspace.annotations)})
    else:
        output.stdout().print(
            output.grid([("Labels", output.kv(workspace.labels)), ("Annotations", output.kv(workspace.annotations))])
        )


@app.command()
@handle
def resize(
    workspace_id: WorkspaceId,
    vcpus: Annotated[int, typer.Option(help="vCPUs (0: keep).")] = 0,
    memory: Annotated[str | None, typer.Option(help="Memory: MiB, or with a unit (512Mi, 2Gi).")] = None,
    writable_layer: Annotated[int, typer.Option(help="Writable layer size, GiB (0: keep).")] = 0,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Change CPU, memory or writable-layer size (the workspace must be STOPPED)."""
    command_id = command_id_or_new(command_id)
    try:
        memory_mib = parsing.memory_mib(memory) if memory else 0
    except typer.BadParameter as error:
        raise fail(str(error.message), ExitCode.USAGE) from None
    if not (vcpus or memory_mib or writable_layer):
        raise fail("nothing to change: give --vcpus, --memory or --writable-layer", ExitCode.USAGE)
    with connect() as client:
        response = client.resize_workspace(
            workspace_id, vcpus=vcpus, memory_mib=memory_mib, writable_layer_gib=writable_layer, command_id=command_id
        )
    if not _emit_result(response.workspace, response.command, fmt):
        output.stdout().print(f"{workspace_id}: {render.resources(response.workspace.spec)}", markup=False)


@app.command()
@handle
def move(
    workspace_id: WorkspaceId,
    to: Annotated[str, typer.Option("--to", help="The node to hold the workspace's disks from now on.")],
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Answer once the move is accepted.")] = False,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Move a STOPPED workspace's disks (writable layer and volumes) to another node (an
    operator's command). Waits with progress until the target holds a checked copy; the
    source keeps its copy until then. Resumable: after a crash of a node or of the server the
    move goes on by itself; `kibo command get ID` follows it. A start waits until it ends."""
    command_id = command_id_or_new(command_id)
    with connect() as client:
        response = client.move_workspace(workspace_id, to, command_id=command_id)
        command = response.command
        if not no_wait:
            with Progress(f"moving {workspace_id} to {to}") as progress:
                while not kibotos.is_terminal(command):
                    done, total = command.progress.done_bytes, command.progress.total_bytes
                    share = f"{done >> 20}/{total >> 20} MiB" if total else "listing its files"
                    progress.show(f"{share}, {command.progress.detail}")
                    time.sleep(0.5)
                    command = client.get_command(command.command_id)
    if fmt is Format.json:
        output.emit_json(
            {
                "command_id": command.command_id,
                "state": kibotos.command_state_name(command.state),
                "done_bytes": command.progress.done_bytes,
                "total_bytes": command.progress.total_bytes,
                "detail": command.progress.detail,
                "error": command.error.message,
            }
        )
    elif command.state == command_pb2.COMMAND_STATE_FAILED:
        output.stdout().print(f"{workspace_id}: move failed: {command.error.message}", markup=False)
    else:
        output.stdout().print(
            f"{workspace_id}: {kibotos.command_state_name(command.state)}, {command.progress.detail} "
            f"({command.progress.done_bytes >> 20} MiB of data)",
            markup=False,
        )
    if command.state == command_pb2.COMMAND_STATE_FAILED:
        raise typer.Exit(int(ExitCode.COMMAND_FAILED))


@app.command()
@handle
def expire(
    workspace_id: WorkspaceId,
    in_: Annotated[str | None, typer.Option("--in", help="Expire after this long, e.g. 8h.")] = None,
    at: Annotated[
        str | None, typer.Option("--at", help="Expire at this time (RFC 3339, e.g. 2030-01-02T03:04:05Z).")
    ] = None,
    action: Annotated[ExpireAction, typer.Option(help="What expiry does.")] = ExpireAction.stop,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the expiration.")] = False,
    if_revision: Annotated[
        int, typer.Option("--if-revision", help="Only if the expiration revision is still this (0: do not check).")
    ] = 0,
    command_id: CommandIdOpt = None,
    fmt: OutputOpt = Format.text,
) -> None:
    """Set (AVAILABLE) or clear (AVAILABLE, STOPPED) the workspace's expiration."""
    command_id = command_id_or_new(command_id)
    if sum(bool(x) for x in (in_, at, clear)) != 1:
        raise fail("give exactly one of --in, --at or --clear", ExitCode.USAGE)
    with connect() as client:
        response: kibotos.CommandResponse
        if clear:
            response = client.clear_workspace_expiration(
                workspace_id, expected_expiration_revision=if_revision, command_id=command_id
            )
        else:
            try:
                when = parsing.time_or_duration(in_ or at or "")
            except typer.BadParameter as error:
                raise fail(str(error.message), ExitCode.USAGE) from None
            response = client.set_workspace_expiration(
                workspace_id,
                when,
                action.wire(),
                expected_expiration_revision=if_revision,
                command_id=command_id,
            )
    if not _emit_result(response.workspace, response.command, fmt):
        output.stdout().print(f"{workspace_id}: expiration {render.expiration(response.workspace)}", markup=False)


# -- the data plane (data_plane.py) ------------------------------------------------------

app.command("exec", help=data_plane.EXEC_HELP, cls=data_plane.ExecCommand)(data_plane.exec_command)
app.command("shell")(workspace_processes.shell)
app.command("start-process", cls=data_plane.ExecCommand)(workspace_processes.start_process)
app.command("ps")(workspace_processes.ps)
app.command("kill")(workspace_processes.kill)
app.command("logs")(workspace_processes.logs)
app.command("cp", help=workspace_files.CP_HELP)(workspace_files.cp)
for _name in ("ls", "stat", "mkdir", "mv", "rm", "watch"):
    app.command(_name)(getattr(workspace_files, _name))

# -- bindings, network policy, data-plane access (workspace_config.py) -------------------

app.command("bind-volume")(workspace_config.bind_volume)
app.command("rebind-volume")(workspace_config.rebind_volume)
app.command("unbind-volume")(workspace_config.unbind_volume)
app.command("network-policy")(workspace_config.network_policy)
app.command("revoke-access")(workspace_config.revoke_access)

# -- exposures: URLs to guest ports (exposures.py) ---------------------------------------

app.command("expose")(exposures.expose)
app.command("exposures")(exposures.exposures)
app.command("unexpose")(exposures.unexpose)
