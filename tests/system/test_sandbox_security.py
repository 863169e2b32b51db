"""The sandbox as a security boundary (issue 10, findings 1-3): each attack replayed in a real guest.

A real `kibo-ctrl serve --runtime process` (bubblewrap) runs the guests; the attacks run
inside them through the data plane's exec (what a holder of the exec credential, or the
tenant's own code, can do), or at the guest's next boot after it replaced its /bin/sh.
Needs root and bubblewrap, like tests/system/test_process_runtime.py (whose helpers it uses)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.client import Client, S
from tests.server import ServerProcess
from tests.system.test_process_runtime import (
    FLAGS,
    DataPlane,
    _require_sandbox,
    agent_pid,
    create,
    delete,
    guest_path,
    instance_dir,
    reap,
    sandbox_server,
    state,
    text,
    tiny_image,
    wait_workspace,
)

CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


@pytest.fixture(scope="module")
def secure_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    # The default supervisor (the node supervisor holds the ready guests): what users run.
    with sandbox_server(server_factory, "--backend", "firecracker", "--supervisor", "auto") as server:
        yield server


@pytest.fixture
async def sc(secure_server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(secure_server.address) as connected:
        yield connected


def status_fields(text: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def guest_pids(server: ServerProcess, workspace: wp.Workspace) -> list[int]:
    """The host PIDs of every process in the guest's PID namespace (bwrap, the agent, what
    runs in the guest), found in its cgroup. (A data-plane job's outer half is in the cgroup
    too, but outside the guest: it never runs guest code.)"""
    import json

    spec = json.loads((instance_dir(server, workspace) / "spec.json").read_text())
    namespace = os.readlink(f"/proc/{agent_pid(server, workspace)}/ns/pid")
    pids = []
    for procs in spec["cgroup_procs"]:
        for pid in (int(p) for p in Path(procs).read_text().split()):
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                    pids.append(pid)
            except FileNotFoundError:
                pass  # gone meanwhile
    return sorted(pids)


def write_host(path: str, value: str) -> None:
    Path(path).write_text(value)


async def sh(data: DataPlane, credential: str, script: str) -> tuple[int, str, str]:
    code, out, err = await data.exec(credential, "sh", "-c", script)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


# The "shocker" attack: a file handle of the filesystem's root inode (ext4: inode 2), opened
# through the volume's mount, lists the host filesystem's root from inside the guest.
FILE_HANDLE_ATTACK = r"""
import ctypes, errno, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
NAME_TO_HANDLE_AT, OPEN_BY_HANDLE_AT = 303, 304
buf = ctypes.create_string_buffer(struct.pack("II", 128, 0) + b"\0" * 128)
mount_id = ctypes.c_int()
r = libc.syscall(NAME_TO_HANDLE_AT, -100, b"/data", buf, ctypes.byref(mount_id), 0)
print("name_to_handle_at", r, errno.errorcode.get(ctypes.get_errno(), "0") if r < 0 else "ok")
handle = ctypes.create_string_buffer(struct.pack("IiII", 8, 1, 2, 0))  # FILEID_INO32_GEN: ino 2, gen 0
mount_fd = os.open("/data", os.O_RDONLY | os.O_DIRECTORY)
fd = libc.syscall(OPEN_BY_HANDLE_AT, mount_fd, handle, os.O_RDONLY | os.O_DIRECTORY)
if fd < 0:
    print("open_by_handle_at", fd, errno.errorcode.get(ctypes.get_errno(), "?"))
else:
    print("open_by_handle_at", fd, "ok", sorted(os.listdir(fd)))
"""

# A /bin/sh of the guest's own making: the guest's init at its next boot. It records what it
# holds, then goes on as the real shell.
FAKE_SHELL = """#!/usr/bin/python3
import os, subprocess, sys
with open("/data/boot-status", "w") as f:
    f.write(open("/proc/self/status").read())
with open("/data/boot-handles", "w") as f:
    subprocess.run([sys.executable, "/data/attack.py"], stdout=f, stderr=subprocess.STDOUT)
os.execv("/usr/bin/dash", ["sh", *sys.argv[1:]])
"""


async def test_no_guest_process_holds_a_capability_not_even_after_a_reboot(
    sc: Client, secure_server: ServerProcess
) -> None:
    workspace = await create(sc)
    data = DataPlane(sc)
    credential = await data.credential(workspace.workspace_id)
    # Every process in the guest, as it sees them, and the data plane's command itself.
    script = "for s in /proc/[0-9]*/status; do grep -E '^(Cap|NoNewPrivs|Seccomp:)' $s; echo; done"
    code, out, _ = await sh(data, credential, script)
    assert code == 0
    blocks = [status_fields(block) for block in out.split("\n\n") if block.strip()]
    assert len(blocks) >= 3  # bwrap, the agent, its sleep, this shell
    for fields in blocks:
        assert all(int(fields[cap], 16) == 0 for cap in CAP_SETS), fields
        assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2", fields
    # Its ids are its own: guest root is an unprivileged host uid.
    code, out, _ = await sh(data, credential, "cat /proc/self/uid_map /proc/self/gid_map")
    maps = [line.split() for line in out.splitlines()]
    assert maps == [["0", "100000", "65536"], ["0", "100000", "65536"]]
    # From the host: every process in the guest's cgroup is host uid 100000 without capabilities.
    pids = guest_pids(secure_server, workspace)
    assert len(pids) >= 3  # bwrap, the agent, its sleep
    for pid in pids:
        fields = status_fields(text(f"/proc/{pid}/status"))
        assert fields["Uid"].split() == ["100000"] * 4, (pid, fields["Uid"])
        assert all(int(fields[cap], 16) == 0 for cap in CAP_SETS), (pid, fields)

    # The reboot trick: the guest replaces /bin/sh in its layer and reboots; its init then
    # tries the file-handle attack too.
    await data.write(credential, "/data/attack.py", FILE_HANDLE_ATTACK.encode())
    fake = FAKE_SHELL.replace("'", "'\\''")
    code, _, err = await sh(
        data, credential, f"rm /bin && mkdir /bin && printf '%s' '{fake}' > /bin/sh && chmod 755 /bin/sh"
    )
    assert code == 0, err
    try:
        await data.exec(credential, "/usr/bin/dash", "/run/kibo/bin/reboot")
    except grpc.aio.AioRpcError as error:
        # The reboot may kill the job that asked for it before its answer is out (like
        # `ssh host reboot`): refused as killed, never anything else.
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "killed" in (error.details() or ""), error
    await wait_workspace(sc, workspace.workspace_id, lambda w: w.guest.reset_count == 1 and w.guest.responding, 20)
    rebooted = await sc.get(workspace.workspace_id)
    boot = status_fields(text(guest_path(secure_server, rebooted, "/data/boot-status")))
    assert all(int(boot[cap], 16) == 0 for cap in CAP_SETS), boot
    assert boot["NoNewPrivs"] == "1" and boot["Seccomp"] == "2"
    assert boot["Uid"].split() == ["0"] * 4  # root of its own namespace, and nothing more
    handles = text(guest_path(secure_server, rebooted, "/data/boot-handles"))
    assert "open_by_handle_at -1 EPERM" in handles and "name_to_handle_at -1 EPERM" in handles, handles
    await delete(sc, await sc.get(workspace.workspace_id), secure_server)


async def test_file_handles_cannot_open_host_files(sc: Client, secure_server: ServerProcess) -> None:
    workspace = await create(sc)
    data = DataPlane(sc)
    credential = await data.credential(workspace.workspace_id)
    code, out, err = await data.exec(credential, "python3", "-c", FILE_HANDLE_ATTACK)
    assert code == 0, err
    lines = dict(line.split(" ", 1) for line in out.decode().splitlines())
    assert lines["name_to_handle_at"].split()[-1] in ("EPERM", "ENOSYS"), out
    assert lines["open_by_handle_at"].split()[-1] in ("EPERM", "ENOSYS"), out
    await delete(sc, workspace, secure_server)


async def test_kernel_tunables_and_sys_are_not_writable(sc: Client, secure_server: ServerProcess) -> None:
    workspace = await create(sc)
    data = DataPlane(sc)
    credential = await data.credential(workspace.workspace_id)
    before = text("/proc/sys/kernel/core_pattern")
    try:
        code, _, err = await sh(data, credential, "echo '|/tmp/pwn' > /proc/sys/kernel/core_pattern")
        assert code != 0 and ("Read-only" in err or "Permission denied" in err), err
        assert text("/proc/sys/kernel/core_pattern") == before
    finally:
        if text("/proc/sys/kernel/core_pattern") != before:  # the attack worked: undo it on the host
            write_host("/proc/sys/kernel/core_pattern", before)
    # Not one sysctl is writable (the issue found 777), nor /proc/sysrq-trigger, nor /sys.
    code, out, _ = await sh(data, credential, "find /proc/sys -type f -writable 2>/dev/null | wc -l")
    assert code == 0 and int(out) == 0
    for target in ("/proc/sysrq-trigger", "/sys/kernel/uevent_helper", "/sys/fs/cgroup/cgroup.procs"):
        code, _, _ = await sh(data, credential, f"echo x > {target}")
        assert code != 0, target
    code, _, _ = await sh(data, credential, "mount -o remount,rw /proc/sys")
    assert code != 0
    # Host-wide kernel state is hidden.
    code, out, _ = await sh(data, credential, "cat /proc/keys /proc/timer_list 2>/dev/null | wc -c")
    assert int(out) == 0
    await delete(sc, workspace, secure_server)


async def test_the_guest_sees_no_host_path_of_the_control_plane(sc: Client, secure_server: ServerProcess) -> None:
    workspace = await create(sc)
    data = DataPlane(sc)
    credential = await data.credential(workspace.workspace_id)
    data_dir = str(secure_server.data_dir.resolve())
    _, cmdline, _ = await sh(data, credential, "tr '\\0' ' ' < /proc/1/cmdline; tr '\\0' ' ' < /proc/1/environ")
    assert cmdline.startswith("bwrap --args")
    assert data_dir not in cmdline and "/run/kibo-stage" not in cmdline, cmdline
    # Nor do the guest's open files (its output goes to the log through a pipe).
    _, fds, _ = await sh(data, credential, "for p in /proc/[0-9]*; do ls -l $p/fd/; done")
    assert data_dir not in fds and "supervisor.log" not in fds, fds
    _, mountinfo, _ = await sh(data, credential, "cat /proc/self/mountinfo")
    # Every mount's source shows relative to its own filesystem: the layer and the volume are
    # images, /run/kibo a tmpfs, the agent a copy in the supervisor's tmpfs: no host path.
    sources = {line.split()[3] for line in mountinfo.splitlines()}
    assert not [source for source in sources if data_dir in source], mountinfo
    assert not any("runtime/bin" in source for source in sources)
    await delete(sc, workspace, secure_server)


async def test_symlinks_planted_in_the_layer_are_not_followed_by_the_server(
    sc: Client, secure_server: ServerProcess
) -> None:
    workspace = await create(sc)
    data = DataPlane(sc)
    credential = await data.credential(workspace.workspace_id)
    with tempfile.TemporaryDirectory(prefix="kibo-host-") as host:
        os.chmod(host, 0o755)
        code, _, err = await sh(
            data,
            credential,
            f"rm -f /etc/hosts /etc/passwd && ln -s {host}/hosts /etc/hosts && ln -s {host}/passwd /etc/passwd"
            f" && rm -rf /var /root && ln -s {host}/var /var && ln -s {host} /root && ln -sfn {host} /home",
        )
        assert code == 0, err
        stopped = (await sc.stop(workspace.workspace_id)).workspace
        assert stopped.state == S.WORKSPACE_STATE_STOPPED
        started = (await sc.start(workspace.workspace_id)).workspace
        assert started.state == S.WORKSPACE_STATE_AVAILABLE
        # The server (root) wrote nothing at the host paths the guest pointed to.
        assert os.listdir(host) == []
        # The guest's links are its own business: they stand, resolved inside its tree.
        assert os.readlink(f"/proc/{agent_pid(secure_server, started)}/root/etc/hosts") == f"{host}/hosts"
        assert state(secure_server, started)["state"] == "ready"
    await delete(sc, await sc.get(workspace.workspace_id), secure_server)


async def test_no_isolation_is_never_picked_silently(server_factory: Callable[..., ServerProcess]) -> None:
    """The removed unshare mode is refused by name; only an explicit `--sandbox none` runs unisolated."""
    _require_sandbox()
    with pytest.raises(RuntimeError) as failed:
        server_factory(*FLAGS[:2], "--sandbox", "unshare", *FLAGS[4:])
    assert "sandbox 'unshare' was removed" in str(failed.value)


async def test_a_base_image_is_the_guests_own_and_shows_no_host_path(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Over an overlaid base image (root's files on the host), the guest's root may change
    them (an idmapped lower layer: copied up into its layer), and its mount table names no
    host path of the image or the layer."""
    _require_sandbox()
    image = tiny_image(tmp_path / "image")
    server = server_factory(*FLAGS, "--base-image", str(image))
    try:
        async with Client.connect(server.address) as client:
            workspace = await create(client)
            data = DataPlane(client)
            credential = await data.credential(workspace.workspace_id)
            code, out, err = await data.exec(
                credential, "sh", "-c", "echo mine > /etc/image-release; cat /etc/image-release"
            )
            assert (code, out) == (0, b"mine\n"), err
            assert text(image / "etc" / "image-release") == "tiny\n"  # the image is untouched
            code, out, _ = await data.exec(credential, "cat", "/proc/self/mountinfo")
            assert code == 0
            assert str(image) not in out.decode()
            overlay = next(line for line in out.decode().splitlines() if " - overlay " in line)
            assert "lowerdir=lower," in overlay and str(tmp_path) not in overlay, overlay
            await delete(client, workspace, server)
        server.stop()
    finally:
        server.kill()
        reap(server.data_dir)


# -- the helpers, without a sandbox ---------------------------------------------------------


def test_shifting_an_old_layer_follows_no_symlink_and_keeps_outside_links(tmp_path: Path) -> None:
    """A layer from before the guests had their own ids (root's files) is chowned into the
    range once; a symlink to a host file and a hard link of one are not a way to chown it."""
    from kibo_ctrl.runtime.process.idmap import IdRange, shift_tree, shifted

    host_file = tmp_path / "host-secret"
    host_file.write_text("host")
    tree = tmp_path / "layer" / "upper"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hosts").write_text("guest")
    (tree / "link").symlink_to(host_file)
    os.link(host_file, tree / "hardlink")
    (tree / "own-a").write_text("x")
    os.link(tree / "own-a", tree / "etc" / "own-b")  # both links inside: shifted
    os.chown(tree / "etc" / "hosts", 1000, 1000)
    ids = IdRange(200000, 65536)
    shift_tree(tree, ids)
    assert shifted(tree, ids)
    assert os.listdir(tree.parent) == ["upper"]  # the mark is on the tree (nothing left when it goes)
    assert (os.stat(tree).st_uid, os.stat(tree / "etc").st_uid) == (200000, 200000)
    assert os.stat(tree / "etc" / "hosts").st_uid == 201000
    assert os.lstat(tree / "link").st_uid == 200000
    assert os.stat(tree / "own-a").st_uid == 200000
    assert os.stat(host_file).st_uid == 0  # neither through the symlink nor the hard link


def test_seeding_a_layer_never_leaves_it(tmp_path: Path) -> None:
    """The layer's skeleton is made beneath it: a guest's absolute symlinks resolve inside
    its tree, what it put at a name stays, and nothing is made at a host path."""
    from kibo_ctrl.runtime.process import sandbox

    host = tmp_path / "host"
    host.mkdir()
    layer = tmp_path / "upper"
    layer.mkdir()
    (layer / "etc").mkdir()
    (layer / "etc" / "hosts").symlink_to(host / "hosts")
    (layer / "var").symlink_to(host / "var")
    (layer / "root").symlink_to("/../../../../..")
    sandbox.seed_layer(layer, host_usr=True, owner=(100000, 100000))
    assert list(host.iterdir()) == []
    assert os.readlink(layer / "etc" / "hosts") == str(host / "hosts")
    assert (layer / "etc" / "passwd").read_text().startswith("root:x:0:0:")
    assert os.stat(layer / "etc" / "passwd").st_uid == 100000
    assert os.lstat(layer / "bin").st_uid == 100000 and os.readlink(layer / "bin") == "usr/bin"
