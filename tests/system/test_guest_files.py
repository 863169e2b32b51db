"""Files anywhere in a guest (issue 29), end to end on a real `kibo-ctrl serve --runtime process
--sandbox bwrap`, through the gRPC stubs: stat, list, mkdir, move and remove in the writable
layer and in a volume; a 1 GiB upload and download (streamed, checksums equal); a tree with
symlinks out and back as tar (links kept, never followed on the host); a download a client stops
reading (the server's memory bounded); a watch; hostile paths, archives and races (TOCTOU); a
revoke ending a running watch and download. Needs root and bubblewrap, like test_process_runtime."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import kibotos
import pytest
from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import data_plane_service_pb2_grpc as dp_grpc
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.server import ServerProcess
from tests.system.test_data_plane_client import delete, poll
from tests.system.test_data_plane_security import (
    RSS_BOUND_KIB,
    RssSampler,
    jobs,
    revoke,
    rss_kib,
    server_pid,
    written_bytes,
)
from tests.system.test_process_runtime import sandbox_server

# Room for the page cache of a 1 GiB upload (the guest's memory limit holds its file's pages).
SPEC = wp.WorkspaceSpec(resources=wp.Resources(vcpus=1, memory_mib=256))
OPTIONS = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
PART = 2 << 20
GIB = 1 << 30
# One worker for the module: its server, and the memory-watching test, are its own.
pytestmark = pytest.mark.xdist_group("guest_files")


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory) as started:
        yield started


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[kibotos.Client]:
    with kibotos.Client(server.address) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(server.address, options=OPTIONS) as channel:
        yield dp_grpc.DataPlaneServiceStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture
def workspace(sdk: kibotos.Client, server: ServerProcess) -> Iterator[str]:
    created = sdk.create_workspace(SPEC)
    workspace = sdk.wait_workspace(created.workspace, created.command.command_id, timeout=30)
    assert workspace.state == wp.WORKSPACE_STATE_AVAILABLE, workspace
    yield workspace.workspace_id
    delete(sdk, workspace.workspace_id, server)


@pytest.fixture
def credential(sdk: kibotos.Client, workspace: str) -> str:
    return str(sdk.issue_data_plane_credential(workspace).credential)


def sh(sdk: kibotos.Client, credential: str, script: str) -> bytes:
    done = sdk.exec_workspace_command(credential, ["sh", "-c", script])
    assert done.exit_code == 0, done
    return bytes(done.stdout)


def code_of(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def field_of(error: grpc.RpcError) -> str:
    """The ErrorDetail's field of a rejection."""
    from google.rpc import status_pb2
    from kibo.ctrl.v1 import error_pb2

    assert isinstance(error, grpc.Call)
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for packed in status_pb2.Status.FromString(value).details:
                detail = error_pb2.ErrorDetail()
                if packed.Unpack(detail):
                    return str(detail.field)
    return ""


def upload(stub: Any, credential: str, path: str, chunks: Iterator[bytes], **start: Any) -> int:
    """StartWorkspaceUpload, then the parts one after another, the last with finish."""
    started = stub.StartWorkspaceUpload(dp.StartWorkspaceUploadRequest(credential=credential, path=path, **start))
    offset = 0
    pending = next(chunks, b"")
    while True:
        following = next(chunks, None)
        request = dp.WriteWorkspaceUploadRequest(
            credential=credential,
            upload_id=started.upload_id,
            offset=offset,
            data=pending,
            finish=following is None,
        )
        answer = stub.WriteWorkspaceUpload(request)
        offset = answer.size
        if following is None:
            assert answer.finished
            return int(offset)
        pending = following


def parts(data: bytes) -> Iterator[bytes]:
    for at in range(0, len(data), PART):
        yield data[at : at + PART]
    if not data:
        yield b""


def download(stub: Any, credential: str, path: str, **request: Any) -> tuple[dp.FileInfo, bytes]:
    info = None
    data = bytearray()
    for part in stub.DownloadWorkspaceFile(
        dp.DownloadWorkspaceFileRequest(credential=credential, path=path, **request)
    ):
        if part.WhichOneof("part") == "info":
            assert info is None, "two infos"
            info = part.info
        else:
            assert info is not None, "data before the info"
            data += part.data
    assert info is not None
    return info, bytes(data)


def stat(stub: Any, credential: str, path: str) -> dp.FileInfo:
    return stub.StatWorkspacePath(dp.StatWorkspacePathRequest(credential=credential, path=path)).info


def listing(stub: Any, credential: str, path: str, depth: int = 1) -> dict[str, dp.FileInfo]:
    answer = stub.ListWorkspaceDirectory(
        dp.ListWorkspaceDirectoryRequest(credential=credential, path=path, depth=depth)
    )
    assert not answer.truncated
    return {entry.path: entry for entry in answer.entries}


# -- stat, list, mkdir, move, remove ----------------------------------------------------------------


@pytest.mark.parametrize("base", ["/root/work", "/data/work"], ids=["writable-layer", "volume"])
def test_stat_list_mkdir_move_remove(sdk: kibotos.Client, stub: Any, credential: str, base: str) -> None:
    stub.MakeWorkspaceDirectory(
        dp.MakeWorkspaceDirectoryRequest(credential=credential, path=f"{base}/a/b", parents=True)
    )
    made = stat(stub, credential, f"{base}/a/b")
    assert (made.type, made.mode, made.owner, made.group, made.name) == (
        dp.FILE_TYPE_DIRECTORY,
        0o755,
        "root",
        "root",
        "b",
    )
    # Without parents, a missing parent is NOT_FOUND; an existing directory with parents is fine.
    missing = code_of(
        lambda: stub.MakeWorkspaceDirectory(dp.MakeWorkspaceDirectoryRequest(credential=credential, path=f"{base}/x/y"))
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND and field_of(missing) == "path", missing
    stub.MakeWorkspaceDirectory(dp.MakeWorkspaceDirectoryRequest(credential=credential, path=f"{base}/a", parents=True))
    stub.MakeWorkspaceDirectory(dp.MakeWorkspaceDirectoryRequest(credential=credential, path=f"{base}/m", mode=0o700))
    assert stat(stub, credential, f"{base}/m").mode == 0o700
    # Names come from the guest's own /etc/passwd and /etc/group (read as files, never through
    # the host's NSS, where uid 0 is "root").
    script = f"echo hello > {base}/a/f && chmod 640 {base}/a/f && ln -s f {base}/a/l"
    sh(sdk, credential, script + " && sed -i 's/^root:/toor:/' /etc/passwd && sed -i 's/^root:/wheel0:/' /etc/group")
    info = stat(stub, credential, f"{base}/a/f")
    assert (info.type, info.size, info.mode, info.uid, info.gid) == (dp.FILE_TYPE_FILE, 6, 0o640, 0, 0)
    assert (info.owner, info.group, info.path, info.name) == ("toor", "wheel0", f"{base}/a/f", "f"), info
    assert abs(info.modify_time.seconds - time.time()) < 60
    link = stat(stub, credential, f"{base}/a/l")
    assert (link.type, link.symlink_target) == (dp.FILE_TYPE_SYMLINK, "f")

    one = listing(stub, credential, f"{base}/a")
    assert set(one) == {f"{base}/a/b", f"{base}/a/f", f"{base}/a/l"}
    assert one[f"{base}/a/l"].type == dp.FILE_TYPE_SYMLINK
    deep = listing(stub, credential, base, depth=3)
    assert set(deep) == {f"{base}/a", f"{base}/m", f"{base}/a/b", f"{base}/a/f", f"{base}/a/l"}

    stub.MoveWorkspacePath(
        dp.MoveWorkspacePathRequest(credential=credential, source=f"{base}/a/f", destination=f"{base}/g")
    )
    assert sh(sdk, credential, f"cat {base}/g; test ! -e {base}/a/f && echo gone") == b"hello\ngone\n"
    # Across file systems (the writable layer and the volume): copied, then removed.
    other = "/data/moved" if base.startswith("/root") else "/root/moved"
    stub.MoveWorkspacePath(dp.MoveWorkspacePathRequest(credential=credential, source=f"{base}/a", destination=other))
    assert sh(sdk, credential, f"readlink {other}/l; test ! -e {base}/a && echo gone") == b"f\ngone\n"

    # Remove: a symlink, not what it points to; a directory needs recursive when not empty.
    sh(sdk, credential, f"ln -s {base}/g {base}/to-g")
    stub.RemoveWorkspacePath(dp.RemoveWorkspacePathRequest(credential=credential, path=f"{base}/to-g"))
    assert sh(sdk, credential, f"cat {base}/g") == b"hello\n"
    full = code_of(lambda: stub.RemoveWorkspacePath(dp.RemoveWorkspacePathRequest(credential=credential, path=other)))
    assert full.code() == grpc.StatusCode.FAILED_PRECONDITION and "ENOTEMPTY" in str(full.details()), full
    assert "not empty" in str(full.details()) and "recursive" in str(full.trailing_metadata()), full
    there = code_of(
        lambda: stub.MakeWorkspaceDirectory(dp.MakeWorkspaceDirectoryRequest(credential=credential, path=other))
    )
    assert there.code() == grpc.StatusCode.FAILED_PRECONDITION and "already exists" in str(there.details()), there
    stub.RemoveWorkspacePath(dp.RemoveWorkspacePathRequest(credential=credential, path=other, recursive=True))
    gone = code_of(lambda: stat(stub, credential, other))
    assert gone.code() == grpc.StatusCode.NOT_FOUND and field_of(gone) == "path"


def test_a_listing_is_bounded(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """More than 10,000 entries: the first 10,000 and `truncated`, in one message."""
    sh(sdk, credential, "mkdir /root/many && cd /root/many && seq 1 10050 | xargs touch")
    answer = stub.ListWorkspaceDirectory(dp.ListWorkspaceDirectoryRequest(credential=credential, path="/root/many"))
    assert answer.truncated and len(answer.entries) == 10_000
    deep = stub.ListWorkspaceDirectory(dp.ListWorkspaceDirectoryRequest(credential=credential, path="/", depth=32))
    assert deep.truncated and len(deep.entries) <= 10_000


# -- uploads and downloads --------------------------------------------------------------------------


def _block(seed: bytes) -> bytes:
    return b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(PART // 32))


def _stream(seed: bytes, size: int) -> Iterator[bytes]:
    """`size` bytes in parts, the same for the same seed, made as they are sent (never held whole)."""
    block = _block(seed)
    for at in range(0, size, PART):
        yield block[: min(PART, size - at)]


def test_upload_and_download_of_1_gib(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    sent = hashlib.sha256()

    def counted() -> Iterator[bytes]:
        for chunk in _stream(b"gib", GIB):
            sent.update(chunk)
            yield chunk

    began = time.monotonic()
    assert upload(stub, credential, "/var/tmp/big.bin", counted(), mode=0o600) == GIB
    uploaded = time.monotonic() - began
    assert sh(sdk, credential, "sha256sum /var/tmp/big.bin").split()[0].decode() == sent.hexdigest()
    received = hashlib.sha256()
    size = 0
    began = time.monotonic()
    for part in stub.DownloadWorkspaceFile(
        dp.DownloadWorkspaceFileRequest(credential=credential, path="/var/tmp/big.bin")
    ):
        if part.WhichOneof("part") == "info":
            assert (part.info.size, part.info.mode, part.info.type) == (GIB, 0o600, dp.FILE_TYPE_FILE)
        else:
            received.update(part.data)
            size += len(part.data)
    downloaded = time.monotonic() - began
    assert (size, received.hexdigest()) == (GIB, sent.hexdigest())
    print(f"1 GiB: upload {GIB / uploaded / 2**20:.0f} MiB/s, download {GIB / downloaded / 2**20:.0f} MiB/s")
    # From an offset (a broken download's resume).
    tail = b"".join(
        p.data
        for p in stub.DownloadWorkspaceFile(
            dp.DownloadWorkspaceFileRequest(credential=credential, path="/var/tmp/big.bin", offset=GIB - 100)
        )
    )
    assert tail == _block(b"gib")[-100:]


def test_small_files_and_offsets(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    assert upload(stub, credential, "/root/empty", parts(b"")) == 0
    assert download(stub, credential, "/root/empty")[1] == b""
    data = os.urandom(5 * PART + 123)
    assert upload(stub, credential, "/root/new/dir/file", parts(data), parents=True) == len(data)
    info, got = download(stub, credential, "/root/new/dir/file")
    assert got == data and (info.size, info.mode) == (len(data), 0o644)
    assert download(stub, credential, "/root/new/dir/file", offset=len(data) - 10)[1] == data[-10:]
    assert download(stub, credential, "/root/new/dir/file", offset=len(data) + 10)[1] == b""
    # Replacing a file is whole: the old content until the finish, then the new one.
    started = stub.StartWorkspaceUpload(
        dp.StartWorkspaceUploadRequest(credential=credential, path="/root/new/dir/file")
    )
    stub.WriteWorkspaceUpload(
        dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id, offset=0, data=b"new")
    )
    assert download(stub, credential, "/root/new/dir/file")[1] == data
    # A part sent twice: FAILED_PRECONDITION naming where to go on from.
    again = code_of(
        lambda: stub.WriteWorkspaceUpload(
            dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id, offset=0, data=b"new")
        )
    )
    assert again.code() == grpc.StatusCode.FAILED_PRECONDITION and "go on from offset 3" in str(again.details())
    done = stub.WriteWorkspaceUpload(
        dp.WriteWorkspaceUploadRequest(
            credential=credential, upload_id=started.upload_id, offset=3, data=b"!", finish=True
        )
    )
    assert (done.size, done.finished) == (4, True)
    assert download(stub, credential, "/root/new/dir/file")[1] == b"new!"
    # A finish sent again (its answer lost) is answered as the first.
    repeat = stub.WriteWorkspaceUpload(
        dp.WriteWorkspaceUploadRequest(
            credential=credential, upload_id=started.upload_id, offset=3, data=b"!", finish=True
        )
    )
    assert (repeat.size, repeat.finished) == (4, True)
    assert b".kibo-" not in sh(sdk, credential, "ls -A /root/new/dir")


def test_a_cancelled_upload_leaves_nothing(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    for archive in (False, True):
        path = "/root/cancelled" + ("-dir" if archive else "")
        started = stub.StartWorkspaceUpload(
            dp.StartWorkspaceUploadRequest(credential=credential, path=path, archive=archive)
        )
        data = _tar({"a/b": b"x" * 100_000}) if archive else b"y" * 100_000
        stub.WriteWorkspaceUpload(
            dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id, offset=0, data=data)
        )
        stub.CancelWorkspaceUpload(dp.CancelWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id))
        assert sh(sdk, credential, f"ls -A /root; test ! -e {path} && echo none").endswith(b"none\n")
        assert b"kibo" not in sh(sdk, credential, "ls -A /root")
        last = dp.WriteWorkspaceUploadRequest(
            credential=credential, upload_id=started.upload_id, offset=len(data), data=b"z", finish=True
        )
        later = code_of(lambda last=last: stub.WriteWorkspaceUpload(last))
        assert later.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND), later


def test_upload_errors_are_the_guests(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    sh(sdk, credential, "mkdir -p /root/d && echo f > /root/file")
    # The job fails at once: its first part meets it failed, or about to (a pipe closed before the
    # node knows its end), and gets its error either way.
    for data in (b"data", b"x" * PART, b"x" * PART + b"y", b"x" * PART + b"y"):
        missing = code_of(lambda data=data: upload(stub, credential, "/root/no/such/dir/f", parts(data)))
        assert missing.code() == grpc.StatusCode.NOT_FOUND and "/root/no/such/dir/f" in str(missing.details()), missing
    over_dir = code_of(lambda: upload(stub, credential, "/root/d", parts(b"data")))
    assert over_dir.code() == grpc.StatusCode.FAILED_PRECONDITION and "EISDIR" in str(over_dir.details()), over_dir
    big = code_of(
        lambda: stub.WriteWorkspaceUpload(
            dp.WriteWorkspaceUploadRequest(
                credential=credential, upload_id="kibo-upload-0123456789abcdef", data=b"x" * (PART + 1)
            )
        )
    )
    assert big.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(big) == "data"
    for upload_id in ("", "x" * 5000, "kibo-upload-0123", "my-server", "kibo-upload-0123456789ABCDEF"):
        bad = code_of(
            lambda upload_id=upload_id: stub.WriteWorkspaceUpload(
                dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=upload_id, data=b"x")
            )
        )
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(bad) == "upload_id", upload_id
    unknown = code_of(
        lambda: stub.WriteWorkspaceUpload(
            dp.WriteWorkspaceUploadRequest(credential=credential, upload_id="kibo-upload-0123456789abcdef", data=b"x")
        )
    )
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    directory = code_of(lambda: download(stub, credential, "/root/d"))
    assert directory.code() == grpc.StatusCode.FAILED_PRECONDITION and "EISDIR" in str(directory.details())
    fifo = sh(sdk, credential, "mkfifo /root/fifo && echo ok")
    assert fifo == b"ok\n"
    refused = code_of(lambda: download(stub, credential, "/root/fifo"))  # never hangs on the FIFO
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(refused) == "path", refused


# -- tar streams and symlinks -----------------------------------------------------------------------


def _tar(
    files: dict[str, bytes],
    links: dict[str, str] | None = None,
    hard: dict[str, str] | None = None,
    special: dict[str, bytes] | None = None,
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, target in (hard or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.LNKTYPE, target
            tar.addfile(info)
        for name, kind in (special or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info)
    return out.getvalue()


def test_a_tree_with_symlinks_out_and_back_as_tar(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """Links are kept as links both ways: the one to /etc/passwd and the one to ../../.. are never
    followed (neither in the guest nor on the host: the host's /etc/passwd never appears)."""
    host_passwd = Path("/etc/passwd").read_bytes()
    sh(
        sdk,
        credential,
        "mkdir -p /root/tree/sub/deep && echo top > /root/tree/top && ln -s /etc/passwd /root/tree/passwd"
        " && ln -s ../../.. /root/tree/sub/up && ln /root/tree/top /root/tree/sub/hard"
        " && head -c 300000 /dev/urandom > /root/tree/sub/deep/blob && mkfifo /root/tree/fifo"
        " && echo guest-passwd-marker >> /etc/passwd",
    )
    info, archive = download(stub, credential, "/root/tree", archive=True)
    assert (info.type, info.size, info.path) == (dp.FILE_TYPE_DIRECTORY, 0, "/root/tree")  # its size not known ahead
    assert host_passwd not in archive and b"guest-passwd-marker" not in archive  # no /etc/passwd's bytes at all
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        blob = tar.extractfile(members["sub/deep/blob"])
        assert blob is not None
        blob_data = blob.read()
    assert set(members) == {"top", "passwd", "sub", "sub/up", "sub/hard", "sub/deep", "sub/deep/blob"}  # no FIFO
    assert members["passwd"].issym() and members["passwd"].linkname == "/etc/passwd"
    assert members["sub/up"].issym() and members["sub/up"].linkname == "../../.."
    assert members["sub/hard"].islnk() and members["sub/hard"].linkname == "top"
    assert blob_data == sh(sdk, credential, "cat /root/tree/sub/deep/blob")

    # Back, into a new directory: the same tree, links as links.
    assert upload(stub, credential, "/root/copy", parts(archive), archive=True) == len(archive)
    shown = sh(
        sdk,
        credential,
        "cd /root/copy && readlink passwd sub/up && cat top && stat -c %h top"
        " && cmp sub/deep/blob /root/tree/sub/deep/blob && echo same",
    )
    assert shown == b"/etc/passwd\n../../..\ntop\n2\nsame\n"
    # Through the stat call, the symlink is described, not followed.
    assert stat(stub, credential, "/root/copy/passwd").symlink_target == "/etc/passwd"
    # Downloading the symlink to /etc/passwd reads the guest's own file (resolved in its root).
    assert b"guest-passwd-marker" in download(stub, credential, "/root/copy/passwd")[1]


HOSTILE_ARCHIVES = {
    "dot-dot": lambda: _tar({"ok": b"1", "../escaped": b"x"}),
    "deep-dot-dot": lambda: _tar({"ok": b"1", "a/../../escaped": b"x"}),
    "absolute": lambda: _tar({"ok": b"1", "/root/escaped": b"x"}),
    "through-a-symlink": lambda: _tar_through(),
    "hard-link-out": lambda: _tar({"ok": b"1"}, hard={"h": "../victim"}),
    "hard-link-absolute": lambda: _tar({"ok": b"1"}, hard={"h": "/root/victim"}),
    # (Names are unpacked into a staging directory one level below the target first.)
    "hard-link-out-of-staging": lambda: _tar({"ok": b"1"}, hard={"h": "../../victim"}),
    "fifo": lambda: _tar({"ok": b"1"}, special={"f": tarfile.FIFOTYPE}),
    "device": lambda: _tar({"ok": b"1"}, special={"null": tarfile.CHRTYPE}),
}


def _tar_through() -> bytes:
    """A symlink to the parent, then a file written through it (the classic escape)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("lnk")
        info.type, info.linkname = tarfile.SYMTYPE, "/root"
        tar.addfile(info)
        data = b"x"
        info = tarfile.TarInfo("lnk/escaped")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("name", HOSTILE_ARCHIVES, ids=HOSTILE_ARCHIVES.keys())
def test_a_hostile_archive_is_refused_whole(sdk: kibotos.Client, stub: Any, credential: str, name: str) -> None:
    sh(sdk, credential, "mkdir -p /root/target && echo v > /root/victim")
    before = sh(sdk, credential, "ls -AR /root")
    archive = HOSTILE_ARCHIVES[name]()
    refused = code_of(lambda: upload(stub, credential, "/root/target", parts(archive), archive=True))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(refused) == "path", refused
    assert sh(sdk, credential, "ls -AR /root") == before  # nothing written, not even "ok"
    assert sh(sdk, credential, "cat /root/victim") == b"v\n"


# -- hostile paths and races ---------------------------------------------------------------------------


LONG = "/root/" + "d/" * 2100 + "f"
BAD_PATHS = {
    "relative": ("root/x", "must be an absolute path"),
    "empty": ("", "give an absolute guest path"),
    "nul": ("/root/a\0b", "contains a NUL byte"),
    "over-PATH_MAX": (LONG, "longer than 4095 bytes"),
}


@pytest.mark.parametrize("case", BAD_PATHS.values(), ids=BAD_PATHS.keys())
def test_bad_paths_are_refused_naming_the_field(stub: Any, credential: str, case: tuple[str, str]) -> None:
    path, says = case
    calls: dict[str, Callable[[], object]] = {
        "path": lambda: stat(stub, credential, path),
        "source": lambda: stub.MoveWorkspacePath(
            dp.MoveWorkspacePathRequest(credential=credential, source=path, destination="/root/x")
        ),
        "destination": lambda: stub.MoveWorkspacePath(
            dp.MoveWorkspacePathRequest(credential=credential, source="/root/x", destination=path)
        ),
    }
    for field, call in calls.items():
        error = code_of(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(error) == field, (field, error)
        assert says in str(error.details())
    for call in (
        lambda: listing(stub, credential, path),
        lambda: stub.MakeWorkspaceDirectory(dp.MakeWorkspaceDirectoryRequest(credential=credential, path=path)),
        lambda: stub.RemoveWorkspacePath(dp.RemoveWorkspacePathRequest(credential=credential, path=path)),
        lambda: download(stub, credential, path),
        lambda: stub.StartWorkspaceUpload(dp.StartWorkspaceUploadRequest(credential=credential, path=path)),
        lambda: next(
            iter(stub.WatchWorkspaceDirectory(dp.WatchWorkspaceDirectoryRequest(credential=credential, path=path)))
        ),
    ):
        error = code_of(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(error) == "path", error


MARKER = b"kibo-guest-passwd-marker"


def _marked_passwd(sdk: kibotos.Client, credential: str) -> bytes:
    """The guest's /etc/passwd, with a line the host's does not have (told apart for sure)."""
    guest = sh(
        sdk,
        credential,
        f"grep -q {MARKER.decode()} /etc/passwd || echo {MARKER.decode()} >> /etc/passwd; cat /etc/passwd",
    )
    assert MARKER in guest and MARKER not in Path("/etc/passwd").read_bytes()
    return guest


def test_dot_dot_and_symlinks_resolve_inside_the_guest(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """`..` past the root is the root; a symlink to a host path leads to the guest's own."""
    guest_passwd = _marked_passwd(sdk, credential)
    sh(sdk, credential, "ln -s /etc/passwd /root/pw && ln -s ../../../../../../etc /root/etc-up")
    assert download(stub, credential, "/../../../../etc/passwd")[1] == guest_passwd
    assert download(stub, credential, "/root/../../etc/passwd")[1] == guest_passwd
    for path in ("/root/pw", "/root/etc-up/passwd"):
        assert download(stub, credential, path)[1] == guest_passwd, path
    assert "/root/etc-up/passwd" in listing(stub, credential, "/root/etc-up")
    # The server's data directory, by its host path, is not in the guest.
    missing = code_of(lambda: stat(stub, credential, str(Path(__file__).resolve())))
    assert missing.code() == grpc.StatusCode.NOT_FOUND, missing


SWAPPER = (
    "while :; do"
    " ln -sf /etc/passwd /root/x.tmp && mv -T /root/x.tmp /root/x;"
    " cp /root/real /root/x.new && mv -T /root/x.new /root/x;"
    " ln -sf /etc/passwd /root/dir/f.tmp && mv -T /root/dir/f.tmp /root/dir/f;"
    " cp /root/real /root/dir/f.new && mv -T /root/dir/f.new /root/dir/f;"
    " done"
)


def test_a_file_replaced_by_a_symlink_during_a_transfer(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """TOCTOU: while downloads run, a guest process keeps swapping a file for a symlink to
    /etc/passwd (and back): each download is a guest file whole (the real one, or the guest's
    /etc/passwd the link leads to in the guest), or fails; the host's never comes out."""
    host_passwd = Path("/etc/passwd").read_bytes()
    guest_passwd = _marked_passwd(sdk, credential)
    sh(
        sdk,
        credential,
        "head -c 1000000 /dev/urandom > /root/real && mkdir /root/dir"
        " && cp /root/real /root/dir/f && cp /root/real /root/x",
    )
    real = download(stub, credential, "/root/real")[1]
    swapping = threading.Thread(
        target=lambda: sdk.exec_workspace_command(credential, ["sh", "-c", SWAPPER], timeout=5), daemon=True
    )
    swapping.start()
    outcomes = {"real": 0, "guest-passwd": 0, "failed": 0, "archives": 0}
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        try:
            data = download(stub, credential, "/root/x")[1]
        except grpc.RpcError:
            outcomes["failed"] += 1
        else:
            assert data in (real, guest_passwd), data[:200]
            outcomes["real" if data == real else "guest-passwd"] += 1
        try:
            archive = download(stub, credential, "/root/dir", archive=True)[1]
        except grpc.RpcError:
            outcomes["failed"] += 1
            continue
        assert host_passwd not in archive and MARKER not in archive
        outcomes["archives"] += 1
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.issym():
                    assert member.linkname == "/etc/passwd", member
                elif member.isfile():
                    got = tar.extractfile(member)
                    assert got is not None
                    content = got.read()
                    # A copy being written is archived as far as it was (a prefix of the real one).
                    assert content == real or (member.name.endswith(".new") and real.startswith(content)), member
    swapping.join(15)
    print(f"TOCTOU downloads: {outcomes}")
    assert outcomes["real"] and outcomes["guest-passwd"] and outcomes["archives"], outcomes  # both sides seen


# -- a client that stops reading; a watch; revoke -----------------------------------------------------


def test_a_download_the_client_stops_reading(
    server: ServerProcess, sdk: kibotos.Client, stub: Any, credential: str, workspace: str
) -> None:
    """The guest's reader is held, and the server's memory stays bounded (as the exec flood's)."""
    sh(sdk, credential, "head -c 600M /dev/zero > /var/tmp/large")
    start_kib = rss_kib(server_pid(server))
    call = stub.DownloadWorkspaceFile(dp.DownloadWorkspaceFileRequest(credential=credential, path="/var/tmp/large"))
    received = 0
    for part in call:
        received += len(part.data)
        if received >= 4 << 20:
            break
    with RssSampler(server_pid(server)) as sampler:
        time.sleep(2.0)
    peak = max(sampler.samples) - start_kib
    sent = max(written_bytes(pid) for pid in jobs(server, workspace))  # the guest's sendfile so far
    print(f"a stalled download: server RSS +{peak} KiB, the guest's reader sent {sent >> 20} MiB")
    assert peak < RSS_BOUND_KIB, f"the server grew by {peak >> 10} MiB"
    # Back-pressure reached the guest: its reader is held, far from the 600 MiB, and stays held.
    assert sent < 64 << 20, f"the guest sent {sent >> 20} MiB"
    time.sleep(0.5)
    assert max(written_bytes(pid) for pid in jobs(server, workspace)) == sent, "the guest's reader went on"
    call.cancel()
    poll(lambda: not jobs(server, workspace))


def test_a_watch_sees_create_write_rename_remove_in_order(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    sh(sdk, credential, "mkdir -p /root/watched/sub")
    events = stub.WatchWorkspaceDirectory(
        dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/watched", recursive=True)
    )
    assert next(events).ready
    sh(
        sdk,
        credential,
        "cd /root/watched/sub && : > f && echo data >> f && mv f g && rm g && chmod 700 /root/watched/sub"
        " && mkdir new && touch new/inner",
    )
    seen: list[tuple[int, str, str]] = []
    for event in events:
        change = event.change
        seen.append((change.type, change.path, change.new_path))
        if change.path == "/root/watched/sub/new/inner":
            break
    events.cancel()
    E = dp.FileEventType
    assert seen[:5] == [
        (E.Value("FILE_EVENT_TYPE_CREATE"), "/root/watched/sub/f", ""),
        (E.Value("FILE_EVENT_TYPE_WRITE"), "/root/watched/sub/f", ""),
        (E.Value("FILE_EVENT_TYPE_RENAME"), "/root/watched/sub/f", "/root/watched/sub/g"),
        (E.Value("FILE_EVENT_TYPE_REMOVE"), "/root/watched/sub/g", ""),
        (E.Value("FILE_EVENT_TYPE_CHMOD"), "/root/watched/sub", ""),
    ], seen


def test_revoke_ends_a_running_watch_and_download(
    server: ServerProcess, sdk: kibotos.Client, stub: Any, credential: str, workspace: str
) -> None:
    sh(sdk, credential, "mkdir /root/w && head -c 200M /dev/zero > /var/tmp/revoked")
    # A deadline: a call the revoke did not end fails with DEADLINE_EXCEEDED, not a hang.
    watch = stub.WatchWorkspaceDirectory(
        dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/w"), timeout=10
    )
    assert next(watch).ready
    download_call = stub.DownloadWorkspaceFile(
        dp.DownloadWorkspaceFileRequest(credential=credential, path="/var/tmp/revoked"), timeout=10
    )
    assert next(download_call).WhichOneof("part") == "info"
    poll(lambda: len(jobs(server, workspace)) >= 2)
    since = time.monotonic()
    revoke(sdk, workspace)
    for call in (watch, download_call):
        with pytest.raises(grpc.RpcError) as ended:
            for _ in call:
                pass
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
    assert time.monotonic() - since < 5
    poll(lambda: not jobs(server, workspace))


def test_concurrent_downloads_and_watches_are_capped(stub: Any, credential: str, sdk: kibotos.Client) -> None:
    sh(sdk, credential, "head -c 100M /dev/zero > /var/tmp/capped && mkdir /root/capped")
    downloads = [
        stub.DownloadWorkspaceFile(dp.DownloadWorkspaceFileRequest(credential=credential, path="/var/tmp/capped"))
        for _ in range(4)
    ]
    for call in downloads:
        assert next(call).WhichOneof("part") == "info"
    fifth = code_of(lambda: download(stub, credential, "/var/tmp/capped"))
    assert fifth.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, fifth
    watches = [
        stub.WatchWorkspaceDirectory(dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/capped"))
        for _ in range(4)
    ]
    for call in watches:
        assert next(call).ready
    extra = code_of(
        lambda: next(
            iter(
                stub.WatchWorkspaceDirectory(
                    dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/capped")
                )
            )
        )
    )
    assert extra.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, extra
    for call in (*downloads, *watches):
        call.cancel()
    poll(lambda: _works(stub, credential))


def _works(stub: Any, credential: str) -> bool:
    try:
        next(
            iter(
                stub.WatchWorkspaceDirectory(
                    dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/capped")
                )
            )
        )
        return True
    except grpc.RpcError:
        return False


@pytest.mark.parametrize("archive", [False, True], ids=["file", "archive"])
def test_a_revoke_ends_a_running_upload_and_leaves_nothing(
    server: ServerProcess, sdk: kibotos.Client, stub: Any, credential: str, workspace: str, archive: bool
) -> None:
    """The node ends the old credential's processes, uploads among them: the file being written
    had no name in the guest (O_TMPFILE), and an archive's staging directory is removed (the
    upload is told with SIGTERM first), so nothing of either is left."""
    started = stub.StartWorkspaceUpload(
        dp.StartWorkspaceUploadRequest(credential=credential, path="/root/revoked", archive=archive)
    )
    data = _tar({"big": b"x" * PART}) if archive else b"x" * PART
    part = dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id, data=data[: PART // 2])
    stub.WriteWorkspaceUpload(part)
    if archive:  # its staging directory is there, in the target, while the archive comes
        poll(lambda: b".kibo" in sh(sdk, credential, "ls -A /root/revoked 2>/dev/null; true"))
    revoke(sdk, workspace)
    refused = code_of(lambda: stub.WriteWorkspaceUpload(part))
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused
    fresh = str(sdk.issue_data_plane_credential(workspace).credential)
    poll(lambda: not jobs(server, workspace))
    left = sh(sdk, fresh, "ls -A /root /root/revoked 2>/dev/null; true")
    assert b".kibo" not in left and (archive or b"revoked" not in left), left


def test_an_upload_id_reaches_uploads_only(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """A process's tag is not an upload ID: its input is not written, nor is it signalled."""
    started = stub.StartWorkspaceProcess(
        dp.StartWorkspaceProcessRequest(credential=credential, shell="cat > /root/stdin", tag="server", background=True)
    )
    assert next(started).started.tag == "server"
    for rpc, request in (
        ("WriteWorkspaceUpload", dp.WriteWorkspaceUploadRequest(credential=credential, upload_id="server", data=b"x")),
        ("CancelWorkspaceUpload", dp.CancelWorkspaceUploadRequest(credential=credential, upload_id="server")),
    ):
        refused = code_of(lambda rpc=rpc, request=request: getattr(stub, rpc)(request))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(refused) == "upload_id", refused
    listed = stub.ListWorkspaceProcesses(dp.ListWorkspaceProcessesRequest(credential=credential)).processes
    assert [p.running for p in listed if p.tag == "server"] == [True]
    assert sh(sdk, credential, "cat /root/stdin") == b""
    stub.SignalWorkspaceProcess(
        dp.SignalWorkspaceProcessRequest(credential=credential, process=dp.ProcessSelector(tag="server"))
    )


def test_the_guests_root_is_not_removed(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    for path in ("/", "//", "/root/..", "/."):
        refused = code_of(
            lambda path=path: stub.RemoveWorkspacePath(dp.RemoveWorkspacePathRequest(credential=credential, path=path))
        )
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(refused) == "path", (path, refused)
    assert sh(sdk, credential, "ls /etc/passwd") == b"/etc/passwd\n"


def test_a_watch_that_is_not_read_says_it_overflowed(sdk: kibotos.Client, stub: Any, credential: str) -> None:
    """Its client stops reading: the watch's output holds the guest's watcher, the kernel's queue of
    events fills (16,384) and drops the rest; the watch says so instead of going silent."""
    sh(sdk, credential, "mkdir /root/flood")
    events = stub.WatchWorkspaceDirectory(
        dp.WatchWorkspaceDirectoryRequest(credential=credential, path="/root/flood"), timeout=90
    )
    assert next(events).ready
    # 80,000 events, none read meanwhile: past what the pipe, the server and gRPC's window hold
    # (~1 MiB of JSON lines each), then past the kernel's 16,384. (The deadline leaves room for
    # a suite that runs slow on a loaded machine: it was 20 s, and ran out once.)
    sh(sdk, credential, "cd /root/flood && seq 1 40000 | xargs touch")
    seen = 0
    for event in events:
        if event.overflow:
            break
        seen += 1
    else:
        raise AssertionError("the watch ended without saying it overflowed")
    events.cancel()
    print(f"overflow after {seen} events")
    assert seen < 80_000


def test_an_upload_belongs_to_its_workspace(
    server: ServerProcess, sdk: kibotos.Client, stub: Any, credential: str
) -> None:
    """Another workspace's credential naming an upload's ID finds nothing (not its path either)."""
    started = stub.StartWorkspaceUpload(dp.StartWorkspaceUploadRequest(credential=credential, path="/root/mine"))
    created = sdk.create_workspace(SPEC)
    other = sdk.wait_workspace(created.workspace, created.command.command_id, timeout=30).workspace_id
    try:
        theirs = str(sdk.issue_data_plane_credential(other).credential)
        for call in (
            lambda: stub.WriteWorkspaceUpload(
                dp.WriteWorkspaceUploadRequest(credential=theirs, upload_id=started.upload_id, data=b"x", finish=True)
            ),
            lambda: stub.CancelWorkspaceUpload(
                dp.CancelWorkspaceUploadRequest(credential=theirs, upload_id=started.upload_id)
            ),
        ):
            refused = code_of(call)
            assert refused.code() == grpc.StatusCode.NOT_FOUND and "/root/mine" not in str(refused.details()), refused
    finally:
        delete(sdk, other, server)
    done = stub.WriteWorkspaceUpload(
        dp.WriteWorkspaceUploadRequest(credential=credential, upload_id=started.upload_id, data=b"mine", finish=True)
    )
    assert (done.size, done.finished) == (4, True)
    assert sh(sdk, credential, "cat /root/mine") == b"mine"
