"""How a guest process tree is isolated: the bubblewrap (or, said loudly, plain) command line.

Two isolation modes, picked once at start-up (`detect`):
- `bwrap`: bubblewrap inside the guest's own user namespace (see idmap.py and
  supervisor.py): own user, PID, mount, UTS, IPC, cgroup and network namespaces (loopback
  only; as root, the network namespace is the guest's slot of runtime/process/network/,
  entered by the supervisor, which bwrap then keeps: `GuestPlan.netns`). The guest is PID 2
  (bwrap is PID 1 and dies with the supervisor). No process of
  the guest holds a capability (all sets and the bounding set empty), no_new_privs is set,
  and the seccomp filter of seccomp.py applies to everything in it. /proc/sys, /proc/bus,
  /proc/fs, /proc/irq and /proc/sysrq-trigger are read-only, the entries of
  MASKED_PATHS are hidden (the host's disks, boot command line, kernel configuration,
  memory zones and interrupts among them), /sys is absent.
  Rootless (the control plane is not root, `rootless()`): the same, except that the
  guest's user namespace maps only the control plane's own uid and gid (`guest_id_map`), so
  a guest that escapes is that user (said at start-up: `rootless_warning`; capability
  `runtime.process.isolation.bwrap-rootless`), and the stage directory is the user's
  (`stage_dir`).
- `none`: no isolation at all, only with an explicit `--sandbox none`. The guest runs on
  the host with its root, volume and run directory passed as environment variables, and
  the runtime says loudly that this is no security boundary.

(util-linux `unshare`, the former middle mode, was removed: it ran the guest as host root
with a chroot that a capable guest leaves.)

The guest's filesystem: its retained writable layer is its root (`/`), the base image is
mounted read-only beneath (default: the host's /usr, with the /bin, /lib, /sbin symlinks
seeded in the layer), volumes are bound at their mount paths (/data), /run/kibo is the
instance's run directory (the ready file) and /run/kibo/bin, read-only, holds the guest
agent (a copy in the supervisor's stage tmpfs). With `--base-image DIR`, the root is an
overlay (lower DIR, upper the layer) that the supervisor mounts in its own mount namespace.
The bubblewrap options reach bwrap through a file descriptor (`--args`), so the guest's
/proc/1/cmdline shows no host path."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import safepath
from .idmap import IdRange

# Guest exit codes with a meaning (the guest's "reboot(2)"): see runtime.py for the mapping.
EXIT_REBOOT = 100
EXIT_POWEROFF = 101

MODES = ("bwrap", "none")

# Where the supervisor stages a bwrap guest's trees (a tmpfs over it in its own mount
# namespace; on the host an empty directory): reachable by the guest's unprivileged uid,
# unlike the data directory.
STAGE_DIR = "/run/kibo-stage"

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
# The empty file masked /proc files are bound from (/run/kibo/bin/empty): a masked file
# reads as empty. (/dev/null, bound under /proc's nodev, refused every open with EACCES.)
EMPTY = "empty"
# The guest's resolv.conf, staged with the scripts (the supervisor writes it from the spec).
RESOLV_CONF = "resolv.conf"
GUEST_SCRIPTS = {"agent": AGENT, "reboot": REBOOT, "poweroff": POWEROFF, EMPTY: ""}

# Read-only in the guest, and hidden (an empty file or directory over them), like the OCI
# runtimes' defaults: kernel tunables, host devices' state, and what leaks host-wide state.
READ_ONLY_PATHS = ("/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sysrq-trigger")
MASKED_PATHS = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    # Issue 27.5, and the rest of its kind (SECURITY.md, the sandbox, item 5, says why each
    # other /proc file stays). The host's block devices, one loop device per workspace with
    # its size and I/O counters: a guest has no block device (its /dev holds none, /sys is
    # absent), its disks are mounted filesystems whose sizes statfs gives, so it sees none.
    "/proc/partitions",
    "/proc/diskstats",
    "/proc/mdstat",  # the host's RAID arrays and their member disks
    "/proc/swaps",  # the host's swap devices and files, by path
    "/proc/cmdline",  # the host's boot command line (root device, console, tunables)
    "/proc/config.gz",  # the host kernel's build configuration
    # The host's memory and devices at work: per-zone and fragmentation counters, every
    # device's interrupts per CPU, softirqs per CPU (other tenants' activity, as it happens),
    # and the hardware's memory and I/O port map.
    "/proc/zoneinfo",
    "/proc/buddyinfo",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/iomem",
    "/proc/ioports",
)


@dataclass(frozen=True)
class GuestPlan:
    """Everything the sandbox command line needs, in host paths."""

    root: Path  # the writable root: the layer, or the overlay mount point
    base: Path | None  # a base image mounted as overlay lower (None: the host's /usr)
    binds: tuple[tuple[Path, str], ...]  # (host directory, guest path), read-write
    run_dir: Path  # -> /run/kibo
    bin_dir: Path  # the agent scripts (-> /run/kibo/bin, read-only; bwrap: staged, as run_dir/bin)
    hostname: str
    command: tuple[str, ...]  # the entry command; empty: the guest agent
    env: dict[str, str] = field(default_factory=dict)
    # The guest's network namespace (/run/netns/..., runtime/process/network/): the supervisor
    # puts the guest in it and bwrap makes none ("": a namespace of its own, loopback only).
    netns: str = ""
    # The guest's /etc/resolv.conf ("": its own file): naming its gateway, where the resolver is.
    resolv_conf: str = ""


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    # How many processes below the spawned one the guest's entry process is.
    entry_depth: int


def proc_protection(empty: str) -> list[str]:
    """bwrap options that make kernel tunables read-only and hide host-wide /proc entries
    (only those this kernel has: bwrap cannot mount over a missing file): a directory under
    an empty read-only tmpfs, a file under `empty` (an empty file), read-only."""
    options: list[str] = []
    for path in READ_ONLY_PATHS:
        if os.path.exists(path):
            options += ["--ro-bind", path, path]
    for path in MASKED_PATHS:
        if os.path.isdir(path):
            options += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            options += ["--ro-bind", empty, path]
    return options


def command(mode: str, plan: GuestPlan) -> Command:
    entry = list(plan.command) or ["/bin/sh", f"{GUEST_BIN}/agent"]
    guest_env = {"PATH": GUEST_PATH, "HOME": "/root", "TERM": "dumb", **plan.env}
    if mode == "bwrap":
        # Run by the supervisor inside the guest's user namespace, as its root with an empty
        # bounding set (supervisor.py); --cap-drop ALL empties the guest's other sets.
        argv = [
            "bwrap",
            "--unshare-pid",
            *(() if plan.netns else ("--unshare-net",)),
            "--unshare-uts",
            "--unshare-ipc",
            "--unshare-cgroup",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            plan.hostname,
            # The supervisor stages the guest's trees where the guest's uid can reach them
            # (the `staged` sources: see supervisor.py) and /run/kibo in a tmpfs of its own.
            "--bind",
            str(plan.root),
            "/",
        ]
        if plan.base is None:
            argv += ["--ro-bind", "/usr", "/usr"]
        argv += ["--proc", "/proc", *proc_protection(str(plan.run_dir / "bin" / EMPTY))]
        argv += ["--dev", "/dev", "--tmpfs", "/tmp"]
        for source, target in plan.binds:
            argv += ["--bind", str(source), target]
        argv += ["--bind", str(plan.run_dir), GUEST_RUN, "--ro-bind", str(plan.run_dir / "bin"), GUEST_BIN]
        if plan.resolv_conf:
            # Written by the supervisor beside the agent scripts (staged, host root's, read-only).
            argv += ["--ro-bind", str(plan.run_dir / "bin" / RESOLV_CONF), "/etc/resolv.conf"]
        argv += ["--chdir", "/", "--clearenv"]
        for key, value in guest_env.items():
            argv += ["--setenv", key, value]
        return Command([*argv, "--", *entry], {"PATH": GUEST_PATH}, "/", entry_depth=2)
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


class SandboxUnavailable(RuntimeError):
    """The wanted isolation does not work on this machine."""


def rootless() -> bool:
    """Whether guests run rootless: the control plane is not root, so a guest's user
    namespace can map only the control plane's own uid and gid (to the guest's 0), and a
    guest that escapes the sandbox is that (unprivileged) user on the host."""
    return os.geteuid() != 0


def guest_id_map(ids: IdRange) -> tuple[int, int, int]:
    """(host uid base, count, host gid base) of a guest's user namespace: the node's id
    range as root; rootless, this user's own uid and gid alone."""
    if rootless():
        return os.getuid(), 1, os.getgid()
    return ids.base, ids.count, ids.base


def probe_bwrap(ids: IdRange, seccomp_filter: Path) -> str:
    """Run a tiny guest the way supervisors run them (own user namespace, no capabilities,
    the seccomp filter): "" if it works, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    from . import userns

    argv = ["bwrap", "--unshare-pid", "--unshare-net", "--die-with-parent", "--cap-drop", "ALL"]
    # The programs' trees only, not the host's whole /: a recursive bind of / remounts every
    # mount under it, and a guest network namespace's mount under /run/netns that goes
    # meanwhile (another runtime's released slot) failed the probe, so the server refused to
    # start (a CI run of the suite, two servers starting beside each other).
    for tree in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"):
        argv += ["--ro-bind-try", tree, tree]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    base, count, gid_base = guest_id_map(ids)
    try:
        with userns.GuestNamespace(base, count, gid_base) as namespace, open(seccomp_filter, "rb") as program:
            done = subprocess.run(
                [*argv, "--seccomp", str(program.fileno()), "true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
                pass_fds=(program.fileno(), namespace.fd),
                preexec_fn=namespace.enter,
            )
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot start a sandbox: {error}"
    if done.returncode != 0:
        why = f"bwrap failed: {done.stderr.decode(errors='replace').strip()[-300:]}"
        # E.g. Ubuntu's AppArmor lets the namespace be made but gives it no capabilities.
        switched_off = userns.userns_switched_off() if rootless() else ""
        return f"{why} ({switched_off})" if switched_off else why
    return ""


def detect(wanted: str, ids: IdRange, seccomp_filter: Path) -> str:
    """The isolation mode to use. `auto` is bwrap, or an error: it never falls back to none."""
    if wanted == "none":
        return "none"
    if wanted == "unshare":
        raise ValueError("sandbox 'unshare' was removed: it ran guests as host root in a chroot; use bwrap")
    if wanted not in ("auto", "bwrap"):
        raise ValueError(f"unknown sandbox {wanted!r}; choose auto, bwrap or none (no isolation)")
    why = probe_bwrap(ids, seccomp_filter)
    if why:
        raise SandboxUnavailable(
            f"the bwrap sandbox does not work here: {why}. Fix that, or pass --sandbox none to run "
            "workspaces without any isolation (not a security boundary)."
        )
    return "bwrap"


def rootless_warning() -> str:
    """What the start-up log says of a rootless sandbox."""
    return (
        f"rootless sandbox: the control plane is not root, so each guest's root is host uid {os.getuid()} "
        "(this server's own user) and no other host id; a guest that escapes the sandbox gets that user's "
        "files and processes (this data directory and its tokens included), not root's. Layers and volumes "
        "are plain directories without size limits, limits are rlimits. Run kibo-ctrl as root for "
        "guests mapped to their own unprivileged uid range."
    )


# The skeleton of a new writable layer (host /usr beneath): directories, symlinks, /etc files.
SKELETON_DIRS = ("proc", "dev", "tmp", "run/kibo", "root", "etc", "var/tmp", "home")
USR_LINKS = (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"))
ETC_DEFAULTS = {
    "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}


def seed_layer(root: Path, host_usr: bool, owner: tuple[int, int] | None = None) -> None:
    """Give a writable layer the skeleton a guest expects (idempotent). The layer is the
    guest's: every name is resolved beneath it and nothing the guest put there (a symlink
    to a host path, say) is followed out of it or replaced; new entries belong to `owner`
    (the guest's root; None: whoever runs this)."""
    root.mkdir(parents=True, exist_ok=True)  # the layer's root itself is the runtime's, not the guest's
    root_fd = safepath.open_root(str(root))
    try:
        for name in SKELETON_DIRS:
            safepath.make_dirs(root_fd, name, owner=owner)
        if not host_usr:
            return
        safepath.make_dirs(root_fd, "usr", owner=owner)
        for name, target in USR_LINKS:
            safepath.create_symlink(root_fd, name, target, owner=owner)
        for name, text in ETC_DEFAULTS.items():
            safepath.create_file(root_fd, f"etc/{name}", text.encode(), owner=owner)
    finally:
        os.close(root_fd)


def stage_dir(data_dir: Path) -> Path:
    """Where supervisors stage guests' trees: STAGE_DIR as root; rootless (no /run of ours),
    under the user's runtime directory, or else the data directory."""
    if not rootless():
        return Path(STAGE_DIR)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        info = os.lstat(runtime)
        if os.path.isdir(runtime) and not os.path.islink(runtime) and info.st_uid == os.geteuid():
            return Path(runtime) / "kibo-stage"
    return data_dir / "runtime" / "stage"


def make_stage_dir(path: Path) -> None:
    """The (empty, our own) host directory supervisors mount their stage tmpfs over."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    info = os.lstat(path)
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.geteuid():
        raise SandboxUnavailable(f"{path} must be a directory owned by uid {os.geteuid()}")
