"""How a guest process tree is isolated: the bubblewrap / unshare / plain command line.

Three isolation modes, picked once at start-up (`detect`):
- `bwrap`: bubblewrap; own PID, mount, UTS, IPC and network namespaces (loopback only).
  The guest is PID 2 (bwrap is PID 1 and dies with the supervisor: --die-with-parent).
- `unshare`: util-linux unshare with the same namespaces; a small shell script binds the
  root together and chroots into it. The guest is PID 1 of its namespace.
- `none`: no isolation at all. The guest runs on the host with its root, volume and run
  directory passed as environment variables; the runtime says so loudly.

The guest's filesystem: its retained writable layer is its root (`/`), the base image is
mounted read-only beneath (default: the host's /usr, with the /bin, /lib, /sbin symlinks
seeded in the layer), volumes are bound at their mount paths (/data), /run/kibo is the
instance's run directory (the ready file) and /run/kibo/bin holds the guest agent.
With `--base-image DIR`, the root is an overlay (lower DIR, upper the layer) that the
supervisor mounts in its own mount namespace."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Guest exit codes with a meaning (the guest's "reboot(2)"): see process.py for the mapping.
EXIT_REBOOT = 100
EXIT_POWEROFF = 101

MODES = ("bwrap", "unshare", "none")

# Where the guest sees the instance's run directory and the agent.
GUEST_RUN = "/run/kibo"
GUEST_BIN = "/run/kibo/bin"

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The default entry: a small long-running agent. It answers readiness by writing the ready
# file once it runs, and turns the guest's own reboot/poweroff requests (SIGUSR1/SIGUSR2,
# sent by /run/kibo/bin/reboot and /run/kibo/bin/poweroff) into the reserved exit codes.
AGENT = f"""#!/bin/sh
# kibo guest agent: the guest's init. SIGTERM: shut down. SIGUSR1: reboot. SIGUSR2: power off.
RUN="${{KIBO_RUN:-{GUEST_RUN}}}"
waiting=
quit() {{ [ -n "$waiting" ] && kill "$waiting" 2>/dev/null; exit "$1"; }}
trap 'quit 0' TERM INT HUP
trap 'quit {EXIT_REBOOT}' USR1
trap 'quit {EXIT_POWEROFF}' USR2
echo $$ > "$RUN/agent.pid"
echo ready > "$RUN/ready.tmp" && mv -f "$RUN/ready.tmp" "$RUN/ready"
while :; do
    sleep 86400 &
    waiting=$!
    wait "$waiting"
done
"""
REBOOT = f"""#!/bin/sh
# Ask the guest to reboot (like reboot -f): the agent exits with {EXIT_REBOOT}.
RUN="${{KIBO_RUN:-{GUEST_RUN}}}"
exec kill -USR1 "$(cat "$RUN/agent.pid")"
"""
POWEROFF = f"""#!/bin/sh
# Ask the guest to power off (like poweroff -f): the agent exits with {EXIT_POWEROFF}.
RUN="${{KIBO_RUN:-{GUEST_RUN}}}"
exec kill -USR2 "$(cat "$RUN/agent.pid")"
"""
GUEST_SCRIPTS = {"agent": AGENT, "reboot": REBOOT, "poweroff": POWEROFF}

# The unshare mode's setup, run as PID 1 of the new namespaces before the guest:
# $1 root, $2 base (or ""), $3 hostname, then triples "bind SRC DEST" / "robind SRC DEST",
# then "--" and the guest command.
_UNSHARE_SETUP = r"""set -e
root=$1; base=$2; name=$3; shift 3
mount --make-rprivate /
mount --bind "$root" "$root"
if [ -z "$base" ]; then
    mkdir -p "$root/usr"; mount --bind /usr "$root/usr"; mount -o remount,bind,ro "$root/usr"
fi
mkdir -p "$root/proc" "$root/dev" "$root/tmp"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,size=1m tmpfs "$root/dev"
for d in null zero full random urandom tty; do
    touch "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"
done
ln -s /proc/self/fd "$root/dev/fd"
mkdir -p "$root/dev/shm"; mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/tmp"
while [ "$1" != "--" ]; do
    kind=$1; src=$2; dest=$root$3; shift 3
    mkdir -p "$dest"; mount --bind "$src" "$dest"
    if [ "$kind" = robind ]; then mount -o remount,bind,ro "$dest"; fi
done
shift
hostname "$name"
exec chroot "$root" "$@"
"""


@dataclass(frozen=True)
class GuestPlan:
    """Everything the sandbox command line needs, in host paths."""

    root: Path  # the writable root: the layer, or the overlay mount point
    base: Path | None  # a base image mounted as overlay lower (None: the host's /usr)
    binds: tuple[tuple[Path, str], ...]  # (host directory, guest path), read-write
    run_dir: Path  # -> /run/kibo
    bin_dir: Path  # -> /run/kibo/bin, read-only
    hostname: str
    command: tuple[str, ...]  # the entry command; empty: the guest agent
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    # How many processes below the spawned one the guest's entry process is.
    entry_depth: int


def command(mode: str, plan: GuestPlan) -> Command:
    entry = list(plan.command) or ["/bin/sh", f"{GUEST_BIN}/agent"]
    guest_env = {"PATH": GUEST_PATH, "HOME": "/root", "TERM": "dumb", **plan.env}
    if mode == "bwrap":
        argv = [
            "bwrap",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-ipc",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            plan.hostname,
            "--bind",
            str(plan.root),
            "/",
        ]
        if plan.base is None:
            argv += ["--ro-bind", "/usr", "/usr"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for source, target in plan.binds:
            argv += ["--bind", str(source), target]
        argv += ["--bind", str(plan.run_dir), GUEST_RUN, "--ro-bind", str(plan.bin_dir), GUEST_BIN]
        argv += ["--chdir", "/", "--clearenv"]
        for key, value in guest_env.items():
            argv += ["--setenv", key, value]
        return Command([*argv, "--", *entry], {"PATH": GUEST_PATH}, "/", entry_depth=2)
    if mode == "unshare":
        binds: list[str] = []
        for source, target in plan.binds:
            binds += ["bind", str(source), target]
        binds += ["bind", str(plan.run_dir), GUEST_RUN, "robind", str(plan.bin_dir), GUEST_BIN]
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            _UNSHARE_SETUP,
            "kibo-setup",
            str(plan.root),
            str(plan.base or ""),
            plan.hostname,
            *binds,
            "--",
            "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in guest_env.items()),
            *entry,
        ]
        return Command(argv, {"PATH": GUEST_PATH}, "/", entry_depth=1)
    if mode == "none":
        # No namespaces: the guest sees host paths; tell it where its parts are.
        env = {
            **guest_env,
            "KIBO_RUN": str(plan.run_dir),
            "KIBO_ROOT": str(plan.root),
            **{f"KIBO_MOUNT_{i}": f"{target}={source}" for i, (source, target) in enumerate(plan.binds)},
        }
        if plan.binds:
            env["KIBO_DATA"] = str(plan.binds[0][0])
        if not plan.command:
            entry = ["/bin/sh", str(plan.bin_dir / "agent")]
        return Command(entry, env, str(plan.root), entry_depth=0)
    raise ValueError(f"unknown sandbox mode {mode!r}; choose one of {', '.join(MODES)}")


def _works(argv: list[str]) -> bool:
    if shutil.which(argv[0]) is None:
        return False
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def probe(mode: str) -> bool:
    """Whether this machine can run guests in `mode` (runs a tiny sandbox)."""
    if mode == "bwrap":
        return _works(
            [
                "bwrap",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-ipc",
                "--die-with-parent",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
                "true",
            ]
        )
    if mode == "unshare":
        return _works(
            ["unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--net", "--mount-proc", "true"]
        ) and _works(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", "/mnt"])
    return mode == "none"


def detect(wanted: str) -> str:
    """The isolation mode to use: `wanted` if it works, or for `auto` the best that works."""
    if wanted == "auto":
        return next(mode for mode in MODES if probe(mode))
    if wanted not in MODES:
        raise ValueError(f"unknown sandbox {wanted!r}; choose auto, {', '.join(MODES)}")
    if not probe(wanted):
        raise RuntimeError(f"sandbox {wanted!r} does not work on this machine (is it installed? are we root?)")
    return wanted


def seed_layer(root: Path, host_usr: bool) -> None:
    """Give a new writable layer the skeleton a guest expects (idempotent)."""
    for name in ("proc", "dev", "tmp", "run/kibo", "root", "etc", "var/tmp", "home"):
        (root / name).mkdir(parents=True, exist_ok=True)
    if host_usr:
        (root / "usr").mkdir(exist_ok=True)
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            link = root / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(target)
        etc = root / "etc"
        defaults = {
            "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": "root:x:0:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
        }
        for name, text in defaults.items():
            path = etc / name
            if not path.exists():
                path.write_text(text)
