"""`kibo workspace cp|ls|stat|mkdir|mv|rm|watch`: files anywhere in a running workspace (kibotos'
workspace_access(...).files). Transfers stream in parts of 2 MiB (never whole in memory), a
directory as a tar stream made or unpacked as it goes, with progress on a terminal.

A server without the streamed file calls (an older one: UNIMPLEMENTED) still takes `cp` of one
file up to 3 MiB under a volume mount, through ReadWorkspaceFile / WriteWorkspaceFile."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat as stat_bits
import sys
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Annotated, BinaryIO

import grpc
import kibotos
import typer
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibotos.data_plane import MAX_FILE_BYTES
from rich.text import Text

from . import data_plane, output
from .exit_codes import ExitCode
from .output import Format, note
from .progress import Progress
from .session import OutputOpt, connect, fail, handle

WorkspaceId = Annotated[str, typer.Argument(help="The workspace ID (ws-...).", show_default=False)]
GuestPath = Annotated[str, typer.Argument(help="An absolute path in the guest.", show_default=False)]
# WORKSPACE_ID:/path: the ID has no `/`, so `./a:b` and `/x:y` are local paths.
_REMOTE = re.compile(r"(?P<workspace>[^/:]+):(?P<path>.*)", re.DOTALL)
_TYPES = {
    dp.FILE_TYPE_FILE: "file",
    dp.FILE_TYPE_DIRECTORY: "directory",
    dp.FILE_TYPE_SYMLINK: "symlink",
    dp.FILE_TYPE_OTHER: "other",
}
_MODE_TYPE = {
    dp.FILE_TYPE_FILE: stat_bits.S_IFREG,
    dp.FILE_TYPE_DIRECTORY: stat_bits.S_IFDIR,
    dp.FILE_TYPE_SYMLINK: stat_bits.S_IFLNK,
}

CP_HELP = (
    "Copy files and directories into or out of an AVAILABLE workspace.\n\n"
    "Exactly one side is WORKSPACE_ID:/path, an absolute path anywhere in the guest (e.g. "
    "ws-...:/root/notes.txt, ws-...:/data/); the other is a local path, or - for stdin (upload) or "
    "stdout (download). Any size: the data streams in parts, never whole in memory. A directory is "
    "copied whole, as a tar stream (symlinks kept as links, never followed); into an existing "
    "directory it keeps its name, else it takes the name given; downloaded to - it is written as a "
    "tar stream. A file uploaded into an existing directory (or a path ending in /) keeps its name; "
    "it is created or replaced whole (never half-written), with the local file's permission bits "
    "(0644 from stdin). A download is written beside its target and renamed when complete. On a "
    "terminal a progress line shows the bytes moved and the rate."
)


def _local_error(error: OSError, what: str) -> typer.Exit:
    return fail(f"cannot {what} {error.filename or ''}: {error.strerror or error}", ExitCode.ERROR)


def _access(client: kibotos.Client, workspace_id: str) -> kibotos.WorkspaceAccess:
    """The workspace's data plane, its credential issued now (so that a workspace that is not
    AVAILABLE is reported with the next step to take)."""
    access = client.workspace_access(workspace_id, retry_unavailable=data_plane.RETRY_SECONDS)
    try:
        access.credential()
    except kibotos.KiboError as error:
        raise data_plane.explain(error, workspace_id) from None
    return access


def _unimplemented(error: kibotos.KiboError) -> bool:
    return error.code == grpc.StatusCode.UNIMPLEMENTED


def _check_path(path: str, what: str = "path") -> None:
    if not path.startswith("/"):
        raise fail(f"{what} {path!r}: give an absolute path in the guest", ExitCode.USAGE)


# -- progress -------------------------------------------------------------------------------------


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


class _Transfer:
    """Progress of a copy on stderr: a live line on a terminal (kibo_cli.progress), nothing
    otherwise; one line at the end either way."""

    def __init__(self, label: str) -> None:
        self.label = label
        console = output.stderr()
        self._progress = Progress(label, console) if console.is_terminal else None
        self.started = time.monotonic()
        self.done = 0

    def __enter__(self) -> _Transfer:
        if self._progress is not None:
            self._progress.__enter__()
            self._progress.show("starting")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, value, traceback)

    def rate(self) -> str:
        seconds = max(time.monotonic() - self.started, 1e-6)
        return f"{_mib(int(self.done / seconds))}/s"

    def update(self, done: int, total: int | None) -> None:
        self.done = done
        if self._progress is None:
            return
        amount = f"{_mib(done)} of {_mib(total)} ({100 * done // total}%)" if total else _mib(done)
        self._progress.show(f"{amount}, {self.rate()}")

    def finished(self, what: str) -> None:
        note(f"{self.label}: {what} ({_mib(self.done)} in {time.monotonic() - self.started:.1f}s, {self.rate()})")


# -- cp -------------------------------------------------------------------------------------------


def _side(text: str) -> tuple[str, str] | None:
    """(workspace ID, path) when `text` names a workspace path, else None (a local path)."""
    match = _REMOTE.fullmatch(text)
    if match is None:
        return None
    return match["workspace"], match["path"]


@handle
def cp(
    src: Annotated[
        str, typer.Argument(help="WORKSPACE_ID:/path, a local file or directory, or - (stdin).", show_default=False)
    ],
    dst: Annotated[str, typer.Argument(help="WORKSPACE_ID:/path, a local path, or - (stdout).")],
) -> None:
    source, target = _side(src), _side(dst)
    if (source is None) == (target is None):
        raise fail(
            "give exactly one side as WORKSPACE_ID:/path (the other is a local path or -)",
            ExitCode.USAGE,
            hint="kibo workspace cp notes.txt ws-...:/data/notes.txt, or the other way round",
        )
    remote = source or target
    assert remote is not None
    workspace_id, path = remote
    if not path.startswith("/"):
        raise fail(
            f"{workspace_id}:{path}: the workspace path must be absolute (e.g. /data/..., /root/...)", ExitCode.USAGE
        )
    with connect() as client:
        access = _access(client, workspace_id)
        if target is not None:
            _upload(client, access, src, path)
        else:
            _download(client, access, path, dst)


def _kind(files: kibotos.Files, path: str) -> int | None:
    """The type of what is at `path` in the guest; None when nothing is (or the server is too old
    to say: UNIMPLEMENTED)."""
    try:
        return int(files.stat(path).type)
    except kibotos.NotFoundError:
        return None
    except kibotos.KiboError as error:
        if _unimplemented(error):
            return None
        raise


def _upload(client: kibotos.Client, access: kibotos.WorkspaceAccess, local: str, path: str) -> None:
    files, workspace_id = access.files, access.workspace_id
    if local == "-":
        if path.endswith("/"):
            raise fail(f"{workspace_id}:{path}: name the file to write from stdin", ExitCode.USAGE)
        source: BinaryIO = sys.stdin.buffer
        mode = 0
        name = ""
    else:
        file = Path(local)
        try:
            status = file.stat()
        except OSError as error:
            raise _local_error(error, "read") from None
        mode, name = status.st_mode & 0o777, file.name  # (no setuid, setgid or sticky bit, as cp)
        if stat_bits.S_ISDIR(status.st_mode):
            _upload_directory(files, workspace_id, file, path)
            return
    if path.endswith("/") or (name and _kind(files, path) == dp.FILE_TYPE_DIRECTORY):
        path = f"{path.rstrip('/')}/{name}"
    label = f"{workspace_id}:{path}"
    with _Transfer(label) as transfer:
        try:
            if local == "-":
                size = files.upload(path, source, mode=mode, progress=transfer.update)
            else:
                size = files.upload(path, local, mode=mode, progress=transfer.update)
        except kibotos.KiboError as error:
            if not _unimplemented(error):
                raise
            transfer.done = size = _legacy_upload(client, access, local, path, mode)
        except OSError as error:
            raise _local_error(error, "read") from None
    transfer.finished(f"{size} bytes written")


def _upload_directory(files: kibotos.Files, workspace_id: str, directory: Path, path: str) -> None:
    if path.endswith("/") or _kind(files, path) == dp.FILE_TYPE_DIRECTORY:
        path = f"{path.rstrip('/')}/{directory.resolve().name}"
    label = f"{workspace_id}:{path}"
    with _Transfer(label) as transfer:
        try:
            files.upload_dir(path, directory, progress=transfer.update)
        except OSError as error:
            raise _local_error(error, "read") from None
    transfer.finished(f"{directory} copied")


def _legacy_upload(client: kibotos.Client, access: kibotos.WorkspaceAccess, local: str, path: str, mode: int) -> int:
    """An older server (no streamed uploads): one message of up to 3 MiB, under a volume mount."""
    try:
        content = data_plane.stdin_bytes() if local == "-" else _small_file(Path(local))
    except OSError as error:
        raise _local_error(error, "read") from None
    return client.write_workspace_file(
        access.credential(), path, content, mode=mode, retry_unavailable=data_plane.RETRY_SECONDS
    )


def _small_file(file: Path) -> bytes:
    if file.stat().st_size > MAX_FILE_BYTES:
        raise fail(
            f"{file} is larger than {MAX_FILE_BYTES >> 20} MiB, the most this server takes in one file "
            "(it has no streamed uploads: an older kibo-ctrl)",
            ExitCode.INVALID_ARGUMENT,
        )
    return file.read_bytes()


def _download(client: kibotos.Client, access: kibotos.WorkspaceAccess, path: str, local: str) -> None:
    files, workspace_id = access.files, access.workspace_id
    kind = _kind(files, path)
    name = PurePosixPath(path).name or "root"
    label = f"{workspace_id}:{path}"
    if kind == dp.FILE_TYPE_DIRECTORY:
        if local == "-":
            files.download(path, sys.stdout.buffer, archive=True)
            return
        target = Path(local)
        if target.is_dir():
            target = target / name
        with _Transfer(label) as transfer:
            try:
                files.download_dir(path, target, progress=transfer.update)
            except OSError as error:
                raise _local_error(error, "write") from None
        transfer.finished(f"copied to {target}")
        return
    if local == "-":
        try:
            files.download(path, sys.stdout.buffer)
        except kibotos.KiboError as error:
            if not _unimplemented(error):
                raise
            data_plane.write_out(sys.stdout.buffer, _legacy_read(client, access, path))
        return
    file = Path(local)
    if file.is_dir():
        file = file / name
    temporary = file.with_name(f".{file.name}.kibo-{os.getpid()}.tmp")
    with _Transfer(label) as transfer:
        try:
            try:
                files.download(path, temporary, progress=transfer.update)
            except kibotos.KiboError as error:
                if not _unimplemented(error):
                    raise
                content = _legacy_read(client, access, path)
                temporary.write_bytes(content)
                transfer.done = len(content)
            temporary.replace(file)
        except OSError as error:
            raise _local_error(error, "write") from None
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()
    transfer.finished(f"copied to {file}")


def _legacy_read(client: kibotos.Client, access: kibotos.WorkspaceAccess, path: str) -> bytes:
    """An older server (no streamed downloads): one message of up to 3 MiB, under a volume mount."""
    return client.read_workspace_file(access.credential(), path, retry_unavailable=data_plane.RETRY_SECONDS)


# -- ls, stat -------------------------------------------------------------------------------------


def _mode_text(info: dp.FileInfo) -> str:
    return stat_bits.filemode(_MODE_TYPE.get(info.type, 0) | info.mode)


def _name(info: dp.FileInfo, under: str) -> str:
    shown = info.path[len(under) :].lstrip("/") if info.path.startswith(under) else info.path
    shown = shown or info.name
    if info.type == dp.FILE_TYPE_SYMLINK:
        return f"{shown} -> {info.symlink_target}"
    return f"{shown}/" if info.type == dp.FILE_TYPE_DIRECTORY else shown


def _columns(rows: Sequence[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows as ls -l aligns them: columns two spaces apart, those in `right` right-aligned, the
    last one as it is (no padding after it)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell if i == len(row) - 1 else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells))
    return lines


@handle
def ls(
    workspace_id: WorkspaceId,
    path: GuestPath,
    long: Annotated[bool, typer.Option("-l", "--long", help="Mode, owner, group, size and mtime too.")] = False,
    depth: Annotated[int, typer.Option("--depth", "-d", min=1, max=32, help="Levels down (1: its own entries).")] = 1,
    fmt: OutputOpt = Format.text,
) -> None:
    """List a directory of an AVAILABLE workspace, anywhere in the guest.

    --depth levels down (paths then relative to PATH); directories end with /, symlinks show their
    target (never followed)."""
    _check_path(path)
    with connect() as client:
        listing = _access(client, workspace_id).files.list_dir(path, depth=depth)
    entries = sorted(listing.entries, key=lambda e: e.path)
    if fmt is Format.json:
        output.emit_json({"entries": [output.to_dict(e) for e in entries], "truncated": listing.truncated})
        return
    under = path.rstrip("/")
    console = output.stdout()
    if long:
        rows = [
            (
                _mode_text(entry),
                entry.owner or str(entry.uid),
                entry.group or str(entry.gid),
                str(entry.size),
                output.when(entry.modify_time),
                _name(entry, under),
            )
            for entry in entries
        ]
        for line in _columns(rows, right=(3,)):
            console.print(output.printable(line), markup=False, highlight=False)
    else:
        for entry in entries:
            console.print(output.printable(_name(entry, under)), markup=False, highlight=False)
    if listing.truncated:
        note(f"kibo: only the first {len(entries)} entries are listed (the most the workspace sends)")


@handle
def stat(workspace_id: WorkspaceId, path: GuestPath, fmt: OutputOpt = Format.text) -> None:
    """Describe what is at a path of an AVAILABLE workspace.

    Its type, size, mode, owner and group (names from the guest's /etc/passwd and /etc/group) and
    mtime; a symlink is described, not followed."""
    _check_path(path)
    with connect() as client:
        info = _access(client, workspace_id).files.stat(path)
    if fmt is Format.json:
        output.emit_json(info)
        return
    rows: list[tuple[str, str | Text]] = [
        ("path", info.path),
        ("type", _TYPES.get(info.type, "unknown")),
        ("size", str(info.size)),
        ("mode", f"{_mode_text(info)} ({info.mode:04o})"),
        ("owner", f"{info.owner or '-'} ({info.uid})"),
        ("group", f"{info.group or '-'} ({info.gid})"),
        ("modified", output.when(info.modify_time)),
    ]
    if info.type == dp.FILE_TYPE_SYMLINK:
        rows.append(("target", info.symlink_target))
    output.stdout().print(output.grid(rows))


# -- mkdir, mv, rm --------------------------------------------------------------------------------


@handle
def mkdir(
    workspace_id: WorkspaceId,
    path: GuestPath,
    parents: Annotated[
        bool, typer.Option("--parents", "-p", help="Make missing parents; no error if it exists.")
    ] = False,
    mode: Annotated[str, typer.Option("--mode", "-m", help="Permission bits, octal (default 755).")] = "",
) -> None:
    """Make a directory in an AVAILABLE workspace."""
    _check_path(path)
    bits = _octal(mode) if mode else 0
    with connect() as client:
        _access(client, workspace_id).files.make_dir(path, parents=parents, mode=bits)


def _octal(text: str) -> int:
    if not re.fullmatch(r"[0-7]{1,4}", text):
        raise fail(f"--mode {text}: give octal permission bits, e.g. 755", ExitCode.USAGE)
    return int(text, 8)


@handle
def mv(workspace_id: WorkspaceId, source: GuestPath, destination: GuestPath) -> None:
    """Rename a file or directory in an AVAILABLE workspace.

    A file at the destination is replaced."""
    _check_path(source, "source")
    _check_path(destination, "destination")
    with connect() as client:
        _access(client, workspace_id).files.move(source, destination)


@handle
def rm(
    workspace_id: WorkspaceId,
    path: GuestPath,
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Remove a directory and what it holds.")] = False,
) -> None:
    """Remove a file, a symlink or a directory in an AVAILABLE workspace.

    A symlink is removed, not what it points to; a directory that is not empty needs -r."""
    _check_path(path)
    with connect() as client:
        _access(client, workspace_id).files.remove(path, recursive=recursive)


# -- watch ----------------------------------------------------------------------------------------


def _change_line(change: kibotos.FileChange) -> str:
    kind = f"{change.kind}{'/' if change.is_directory else ''}"
    if change.kind == "rename":
        return f"{kind} {change.path} -> {change.new_path or '(out of the watch)'}"
    return f"{kind} {change.path}"


@handle
def watch(
    workspace_id: WorkspaceId,
    path: GuestPath,
    recursive: Annotated[
        bool, typer.Option("--recursive", "-r", help="Its subdirectories too, new ones included.")
    ] = False,
    fmt: OutputOpt = Format.text,
) -> None:
    """Print the changes under a directory of an AVAILABLE workspace as they happen.

    One a line (create, write, remove, rename, chmod; a directory's kind ends with /), until
    Ctrl-C; with -o json, one JSON object a line. The first line on stderr says the watch is in
    place."""
    _check_path(path)
    console = output.stdout()
    with connect() as client:
        events = _access(client, workspace_id).files.watch_dir(path, recursive=recursive)
        try:
            for event in events:
                if isinstance(event, kibotos.WatchReady):
                    note(f"watching {workspace_id}:{path} (Ctrl-C to stop)")
                elif isinstance(event, kibotos.WatchOverflow):
                    note("kibo: the guest dropped events (its queue overflowed): rescan what matters")
                elif fmt is Format.json:
                    typer.echo(json.dumps(dataclasses.asdict(event)))
                else:
                    console.print(output.printable(_change_line(event)), markup=False, highlight=False)
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        finally:
            events.close()
