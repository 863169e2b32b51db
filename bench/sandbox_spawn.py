"""Spawn-and-exit of one sandbox (`/bin/true`), three ways: `python -m bench.sandbox_spawn [--runs N]`.

- `bwrap-plain`: bubblewrap as before issue 10 (host root, full bounding set, no seccomp).
- `bwrap-hardened`: as supervisor.py runs guests now: a new user namespace mapped to
  100000+65536, bwrap as its root with an empty bounding set, --cap-drop ALL, the seccomp
  filter, read-only /proc/sys and the masked /proc entries, options through --args.
- `crun`: Debian's crun with the equivalent OCI config (user namespace with the same
  mapping, no capabilities, noNewPrivileges, the same refused calls as OCI seccomp JSON,
  its default masked/read-only paths), cgroups disabled, run from a private mount
  namespace with /sys/fs/cgroup/unified unmounted (crun refuses cgroup "hybrid mode").

Needs root, bwrap, crun. Prints p50/p99 in ms per way."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kibo_ctrl.runtime.process import sandbox, seccomp, userns
from kibo_ctrl.runtime.process.idmap import IdRange


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_root(directory: Path, ids: IdRange) -> Path:
    root = directory / "root"
    for name in ("proc", "dev", "tmp", "usr", "etc"):
        (root / name).mkdir(parents=True)
    for name, target in sandbox.USR_LINKS:
        (root / name).symlink_to(target)
    for path in [root, *root.rglob("*")]:
        os.lchown(path, *ids.root)
    return root


def bwrap_plain(root: Path) -> list[str]:
    return [
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-ipc",
        "--die-with-parent",
        "--bind",
        str(root),
        "/",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "/bin/true",
    ]


def run_bwrap_hardened(root: Path, ids: IdRange, program: Path) -> None:
    with userns.GuestNamespace(ids.base, ids.count) as namespace:
        # The masks bound from /dev/null, not the runtime's staged empty file: the same mounts.
        masks = sandbox.proc_protection("/dev/null")
        options = [*bwrap_plain(root)[1:-1], "--unshare-cgroup", "--cap-drop", "ALL", *masks]
        seccomp_fd = os.open(program, os.O_RDONLY)
        args = os.memfd_create("bwrap-args", 0)
        os.write(args, b"".join(a.encode() + b"\0" for a in [*options, "--seccomp", str(seccomp_fd)]))
        os.lseek(args, 0, os.SEEK_SET)
        try:
            subprocess.run(
                ["bwrap", "--args", str(args), "--", "/bin/true"],
                check=True,
                pass_fds=(seccomp_fd, args),
                preexec_fn=namespace.enter,
            )
        finally:
            os.close(seccomp_fd)
            os.close(args)


def oci_bundle(directory: Path, root: Path, ids: IdRange) -> Path:
    bundle = directory / "bundle"
    bundle.mkdir()
    subprocess.run(["crun", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(root), "readonly": False}
    config["process"].update(args=["/bin/true"], terminal=False, noNewPrivileges=True)
    config["process"]["capabilities"] = {k: [] for k in config["process"]["capabilities"]}
    config["mounts"] = [m for m in config["mounts"] if m["destination"] in ("/proc", "/dev", "/dev/pts")]
    config["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]})
    config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]})
    linux = config["linux"]
    linux["namespaces"].append({"type": "user"})
    linux["uidMappings"] = [{"containerID": 0, "hostID": ids.base, "size": ids.count}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": ids.base, "size": ids.count}]
    linux.pop("resources", None)
    rules = [{"names": list(seccomp.REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    rules += [
        {
            "names": [name],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        }
        for name, flag in seccomp.REFUSED_WITH_FLAG
    ]
    rules.append({"names": list(seccomp.UNIMPLEMENTED), "action": "SCMP_ACT_ERRNO", "errnoRet": 38})
    linux["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": rules}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    arguments = parser.parse_args()
    ids = IdRange()
    with tempfile.TemporaryDirectory(prefix="kibo-spawn-") as scratch:
        directory = Path(scratch)
        os.chmod(directory, 0o755)
        root = make_root(directory, ids)
        program = seccomp.write_filter(directory / "seccomp.bpf")
        bundle = oci_bundle(directory, root, ids) if shutil.which("crun") else None
        ways = {
            "bwrap-plain": lambda: subprocess.run(bwrap_plain(root), check=True),
            "bwrap-hardened": lambda: run_bwrap_hardened(root, ids, program),
        }
        if bundle is not None:
            state = directory / "crun-state"
            ways["crun"] = lambda: subprocess.run(
                ["crun", "--root", str(state), "--cgroup-manager=disabled", "run", "--bundle", str(bundle), "bench"],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        for name, way in ways.items():
            way()  # warm up
            times = []
            for _ in range(arguments.runs):
                start = time.perf_counter()
                way()
                times.append((time.perf_counter() - start) * 1000)
            print(f"{name:15} p50 {percentile(times, 0.5):6.1f} ms  p99 {percentile(times, 0.99):6.1f} ms")


if __name__ == "__main__":
    if os.environ.get("KIBO_SPAWN_PRIVATE") != "1":
        # crun needs the cgroup v2 "unified" mount gone: a private mount namespace for this run.
        script = 'umount /sys/fs/cgroup/unified 2>/dev/null; exec "$@"'
        command = [sys.executable, "-m", "bench.sandbox_spawn", *sys.argv[1:]]
        env = {**os.environ, "KIBO_SPAWN_PRIVATE": "1"}
        sys.exit(
            subprocess.run(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "-", *command], env=env
            ).returncode
        )
    main()
