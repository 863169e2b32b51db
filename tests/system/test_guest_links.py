"""A guest that swaps its files for links, and plants files where the host might read them
(issue 27, "not yet tried"), on a real `kibo-ctrl serve --runtime process` (bubblewrap).

- Links against the data plane: while a loop in the guest swaps /data/f between a regular file,
  symlinks to host paths (a canary made by this test, another workspace's volume, the host's
  /etc/shadow, through /proc/1/root and `..` too) and hard links, the client reads and writes
  it hundreds of times: no read returns what lies outside the guest, no write lands outside.
- Links against the stop's sync: the guest keeps swapping its files (volume and layer) for
  links to host paths through the whole graceful stop; the host's canary is untouched.
- Links against deletion: symlinks to a host directory (and a mode-000 directory holding
  more) in an image volume and in a plain-directory volume; deleting them follows none.
- Planting: the guest replaces its /bin/sh, writes .pth files at the host Python's own
  site-packages paths, writes the agent's PID file with a host process's PID, and replaces
  its /etc files with symlinks to host paths; after a stop, a server restart and a start, all
  of it ran only inside the sandbox, as the guest's root without capabilities.

Each race is bounded in count and time. Needs root and bubblewrap, like test_process_runtime."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import workspace_pb2 as wp

from tests.client import Client, S
from tests.server import ServerProcess
from tests.system.test_process_runtime import DataPlane, command_of, sandbox_server, volume_dir, wait_until

SMALL = wp.Resources(vcpus=1, memory_mib=128, writable_layer_gib=1)
# How long a race runs, and how many data-plane calls it makes at most.
RACE_SECONDS = 6.0
RACE_CALLS = 600
IN_FLIGHT = 8
pytestmark = pytest.mark.xdist_group("guest_links")


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    with sandbox_server(server_factory, "--supervisor", "auto") as started:  # the default, as users run it
        yield started


@pytest.fixture
async def guest_client(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client.connect(server.address) as connected:
        yield connected


class Canary:
    """A host directory the guest must never reach: a secret file, and names that must not
    appear in it. `unchanged` compares every entry's content, mode and times with the start."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "canary"
        self.dir.mkdir()
        self.secret = secrets.token_hex(16)
        self.file = self.dir / "secret"
        self.file.write_text(self.secret + "\n")
        (self.dir / "sub").mkdir()
        (self.dir / "sub" / "kept").write_text("kept\n")
        self._before = self._snapshot()

    def _snapshot(self) -> dict[str, tuple[bytes, int, int, int]]:
        found = {}
        for directory, names, files in os.walk(self.dir):
            for name in [*names, *files]:
                path = Path(directory) / name
                info = path.lstat()
                content = path.read_bytes() if path.is_file() else b""
                found[str(path.relative_to(self.dir))] = (content, info.st_mode, info.st_mtime_ns, info.st_uid)
        return found

    def unchanged(self) -> bool:
        return self._snapshot() == self._before


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    return Canary(tmp_path)


async def shell(data: DataPlane, credential: str, script: str) -> bytes:
    code, out, err = await data.exec(credential, "sh", "-c", script)
    assert code == 0, (script, out, err)
    return out


async def new_workspace(client: Client, data: DataPlane) -> tuple[wp.Workspace, str]:
    workspace = await client.create(resources=SMALL, data_volume_gib=1)
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    return workspace, await data.credential(workspace.workspace_id)


async def delete(client: Client, server: ServerProcess, workspace: wp.Workspace) -> None:
    await client.delete(workspace.workspace_id)
    layer = server.data_dir / "layers" / workspace.workspace_id
    volume = volume_dir(server, workspace)
    await wait_until(lambda: not layer.exists() and not volume.exists(), within=30)


def swap_loop(seconds: float, steps: list[str]) -> str:
    """A shell loop, detached from the job that starts it, running `steps` over and over for
    `seconds` (it also ends with the guest); SIGTERM does not stop it."""
    body = "; ".join(steps)
    loop = f"trap '' TERM; end=$(( $(date +%s) + {int(seconds) + 1} )); while [ $(date +%s) -lt $end ]; do {body}; done"
    return f"setsid sh -c {shlex_quote(loop)} </dev/null >/dev/null 2>&1 &"


def shlex_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


async def race(calls: list[Callable[[], object]], seconds: float = RACE_SECONDS) -> tuple[int, list[object]]:
    """Run the calls round-robin, IN_FLIGHT at a time, until RACE_CALLS or `seconds`: how
    many ran, and what each returned (or raised)."""
    deadline = time.monotonic() + seconds
    results: list[object] = []
    index = 0

    async def worker() -> None:
        nonlocal index
        while index < RACE_CALLS and time.monotonic() < deadline:
            call = calls[index % len(calls)]
            index += 1
            try:
                results.append(await call())  # type: ignore[misc]
            except grpc.aio.AioRpcError as error:
                results.append(error.code())

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return index, results


# -- the data plane's file calls -----------------------------------------------------------------


async def test_file_calls_stay_in_the_guest_while_it_swaps_links(
    guest_client: Client, server: ServerProcess, canary: Canary
) -> None:
    data = DataPlane(guest_client)
    other, other_credential = await new_workspace(guest_client, data)
    mine, credential = await new_workspace(guest_client, data)
    try:
        # Another workspace's volume holds a secret of its own.
        other_secret = secrets.token_hex(16)
        await shell(data, other_credential, f"echo {other_secret} > /data/secret")
        other_volume = volume_dir(server, other)
        host_shadow = await asyncio.to_thread(Path("/etc/shadow").read_bytes)
        # The guest's own file at the canary's host path: a symlink resolved in the guest's
        # root finds this one, never the host's.
        await shell(data, credential, f"mkdir -p {canary.dir} && echo guest-copy > {canary.file}")
        targets = [
            str(canary.file),
            f"/proc/1/root{canary.file}",
            f"/proc/self/root{canary.file}",
            "../../../../../.." + str(canary.file),
            f"{other_volume}/mnt/secret",
            f"{other_volume}/volume.img",
            "/etc/shadow",
            f"/proc/1/cwd/../../../../..{canary.file}",
        ]
        steps = ["echo guest > /data/f.new && mv -f /data/f.new /data/f"]
        for target in targets:
            steps += [
                f"ln -sfn {shlex_quote(target)} /data/f",
                f"ln -sfn {shlex_quote(target)} /data/w",
                "rm -f /data/w",
                f"rm -rf /data/d; ln -sfn {shlex_quote(str(canary.dir))} /data/d",
                "rm -f /data/d; mkdir -p /data/d",
            ]
        # Hard links: to a file of the guest's layer (another filesystem: refused) and within /data.
        steps += ["ln -f /etc/passwd /data/f 2>/dev/null || true", "ln -f /data/f /data/h 2>/dev/null || true"]
        await shell(
            data, credential, "mkdir -p /data/d && echo guest > /data/f && " + swap_loop(RACE_SECONDS + 4, steps)
        )
        written = secrets.token_hex(8).encode()
        ran, results = await race(
            [
                lambda: data.read(credential, "/data/f"),
                lambda: data.read(credential, "/data/h"),
                lambda: data.write(credential, "/data/w", written),
                lambda: data.write(credential, "/data/d/x", written),
                lambda: data.write(credential, "/data/f", written),
            ]
        )
        contents = [r for r in results if isinstance(r, bytes)]
        codes = {r for r in results if isinstance(r, grpc.StatusCode)}
        seen = Counter(content[:16] for content in contents)
        print(f"\n{ran} file calls during the swaps: reads returned {dict(seen)}, errors {codes}")
        assert ran >= 100
        # The reads met the links: some found the guest's own file at the canary's path (what
        # else they found depends on the interleaving: the guest's "guest", or what the writes
        # left; under load a run saw only the latter).
        assert seen[b"guest-copy\n"], seen
        for content in contents:
            assert canary.secret.encode() not in content
            assert other_secret.encode() not in content
            assert content != host_shadow or content == await data.read(credential, "/etc/shadow")
        assert codes <= {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}, codes
        assert canary.unchanged()
        # Nothing was written into the other workspace's volume either.
        assert await shell(data, other_credential, "ls -A /data") == b"secret\n"
        assert await shell(data, other_credential, "cat /data/secret") == f"{other_secret}\n".encode()
    finally:
        await delete(guest_client, server, mine)
        await delete(guest_client, server, other)
    assert canary.unchanged()


# -- the stop's sync ---------------------------------------------------------------------------


async def test_a_stop_syncs_while_the_guest_swaps_its_files_for_links(
    guest_client: Client, server: ServerProcess, canary: Canary
) -> None:
    """Graceful stop (the guest's loop ignores SIGTERM, so it swaps until it is killed at the
    end of the grace): the sync is of the images and their filesystems, never a walk of the
    guest's names, so the host's canary is untouched; the next start has the guest's files."""
    data = DataPlane(guest_client)
    mine, credential = await new_workspace(guest_client, data)
    try:
        steps = []
        for directory in ("/data", "/root"):
            for target in (str(canary.file), str(canary.dir), "/", f"/proc/1/root{canary.dir}"):
                steps += [
                    f"ln -sfn {shlex_quote(target)} {directory}/s",
                    f"rm -f {directory}/s; echo guest > {directory}/s",
                    f"rm -rf {directory}/t; ln -sfn {shlex_quote(target)} {directory}/t",
                ]
        await shell(data, credential, "echo kept > /data/kept && " + swap_loop(30, steps))
        await asyncio.sleep(0.5)
        stopped = await guest_client.stop(mine.workspace_id)
        # The sync succeeded: the stop's data is confirmed durable.
        assert (await command_of(guest_client, stopped)).result.durability == wp.STOP_DURABILITY_CONFIRMED
        await guest_client.wait_for(mine.workspace_id, S.WORKSPACE_STATE_STOPPED, within=30)
        assert canary.unchanged()
        started = await guest_client.start(mine.workspace_id)
        assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE
        credential = await data.credential(mine.workspace_id)
        assert await shell(data, credential, "cat /data/kept") == b"kept\n"
    finally:
        await delete(guest_client, server, mine)
    assert canary.unchanged()


# -- deletion ----------------------------------------------------------------------------------


PLANTS = [
    "ln -s {dir} {at}/host",
    "ln -s {file} {at}/secret-link",
    "ln -s / {at}/root-link",
    "mkdir -p {at}/locked/deeper && ln -s {dir} {at}/locked/deeper/in && ln -s {file} {at}/locked/f",
    "chmod 000 {at}/locked/deeper {at}/locked",
    "ln -s /proc/1/root{dir} {at}/proc-link",
]


async def test_deleting_volumes_follows_no_link_the_guest_planted(
    guest_client: Client, server: ServerProcess, canary: Canary
) -> None:
    """An image volume (/data) and a plain-directory volume (from before images: deletion
    walks its tree on the host) full of links to a host directory: both deleted, the host
    directory and its files are all still there."""
    data = DataPlane(guest_client)
    volume = await guest_client.create_volume(capacity_gib=1)
    plain = server.data_dir / "volumes" / volume.volume_id
    plain.mkdir(parents=True)
    (plain / "legacy.txt").write_text("from before images\n")  # a volume made before images
    binding = wp.VolumeBinding(volume_id=volume.volume_id, mount_path="/mnt/plain", delete_with_workspace=True)
    workspace = await guest_client.create(resources=SMALL, data_volume_gib=1, volumes=[binding])
    assert workspace.state == S.WORKSPACE_STATE_AVAILABLE, workspace
    credential = await data.credential(workspace.workspace_id)
    assert not (plain / "volume.img").exists()  # used as the plain directory it is
    for at in ("/data", "/mnt/plain"):
        script = " && ".join(step.format(dir=canary.dir, file=canary.file, at=at) for step in PLANTS)
        await shell(data, credential, script)
    assert (plain / "host").is_symlink()  # the guest's links are in the host's tree
    await guest_client.delete(workspace.workspace_id)
    await wait_until(lambda: not plain.exists() and not volume_dir(server, workspace).exists(), within=30)
    assert canary.unchanged()


# -- what the host runs at the next start --------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A host process whose PID the guest writes where its agent's PID goes."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


async def test_what_a_guest_plants_runs_only_inside_it_after_a_server_restart(
    guest_client: Client, server: ServerProcess, tmp_path: Path
) -> None:
    """The guest plants: its own /bin/sh (the agent's interpreter at the next start), .pth
    files at the host Python's site-packages paths and the server's virtualenv's, a host
    process's PID in /run/kibo/agent.pid, symlinks to host paths in place of its /etc files,
    and tries to replace its agent (read-only). Stop, restart the server, start: the planted
    sh ran, inside the sandbox, as the guest's root without capabilities; nothing ran on the
    host (each would leave a marker in a host directory that must stay absent)."""
    data = DataPlane(guest_client)
    marker = tmp_path / "planted"  # must never exist on the host
    host_sh, agent = Path("/usr/bin/dash"), server.data_dir / "runtime" / "bin" / "agent"
    before = {path: _sha256(path) for path in (host_sh, agent)}
    workspace, credential = await new_workspace(guest_client, data)
    wid = workspace.workspace_id
    site_dirs = {sys.prefix, sys.base_prefix}
    pth = f"import os; os.makedirs('{marker}', exist_ok=True); open('{marker}/pth', 'a').write('ran')\n"
    wrapper = (
        "#!/usr/bin/dash\n"
        f"mkdir -p {marker} && grep CapEff /proc/self/status > {marker}/sh\n"
        "echo ran >> /data/planted-sh-ran\n"
        'exec /usr/bin/dash "$@"\n'
    )
    with sleeper() as host_process:
        script = [
            # /bin is the layer's symlink to /usr/bin (read-only): a directory of the guest's own.
            "rm /bin && mkdir /bin && for f in /usr/bin/*; do ln -s $f /bin/; done && rm /bin/sh",
            f"printf %s {shlex_quote(wrapper)} > /bin/sh && chmod 755 /bin/sh",
            *(
                f"mkdir -p {prefix}/lib/python3.11/site-packages && "
                f"printf %s {shlex_quote(pth)} > {prefix}/lib/python3.11/site-packages/zz-kibo-planted.pth"
                for prefix in site_dirs
            ),
            f"echo {host_process.pid} > /run/kibo/agent.pid",
            f"for f in hosts passwd nsswitch.conf; do rm /etc/$f && ln -s {marker}/$f /etc/$f; done",
            "! echo planted > /run/kibo/bin/agent 2>/dev/null",
        ]
        await shell(data, credential, " && ".join(script))
        await guest_client.stop(wid)
        await guest_client.wait_for(wid, S.WORKSPACE_STATE_STOPPED, within=30)
        server.stop()
        server.start()
        async with Client.connect(server.address) as again:
            started = await again.start(wid)
            assert started.workspace.state == S.WORKSPACE_STATE_AVAILABLE, started.workspace
            data = DataPlane(again)
            credential = await data.credential(wid)
            # The planted sh ran the agent, in the guest: its marker is in the guest's own /tmp...
            assert b"ran" in await shell(data, credential, "cat /data/planted-sh-ran")
            cap = await shell(data, credential, f"cat {marker}/sh")
            assert cap.split() == [b"CapEff:", b"0000000000000000"], cap
            # ...and a Python on the host, like the server's own, read no planted .pth.
            await asyncio.to_thread(subprocess.run, [sys.executable, "-c", "pass"], check=True, timeout=30)
            assert not marker.exists(), sorted(p.name for p in marker.iterdir())
            assert host_process.poll() is None  # the PID in agent.pid was never signalled
            assert {path: _sha256(path) for path in before} == before
            await again.delete(wid)
            await wait_until(lambda: not (server.data_dir / "layers" / wid).exists(), within=30)
    assert not marker.exists()
