"""Where a client's token comes from: the one rule of the SDK and the `kibo` command line.

In order, the first that gives a token wins:

1. the token given (`kibo --token`, `kibotos.Client(token=...)`);
2. `$KIBO_TOKEN`;
3. for a loopback server only (so an admin token never travels to another machine):
   a. the pointer a local `kibo-ctrl serve` writes on every start with authentication on,
      `$XDG_STATE_HOME/kibo/servers/HOST_PORT` (default `~/.local/state/...`), keyed by the
      address it listens on; it holds the path of that server's `DATA_DIR/admin.token`, so
      the token is found whatever `--data-dir` the server was given. Beside it, `HOST_PORT.pid`
      names the server's process (PID and start time): a pointer whose server is gone (killed,
      its port perhaps another server's now) is passed over, and a server removes its own
      when it stops, and those of servers that are gone when it starts;
   b. the default data dir's `$XDG_DATA_HOME/kibo/admin.token` (`~/.local/share/...`).

`Discovery.describe()` says where the token came from, or everywhere it looked: the
UNAUTHENTICATED errors of both clients carry it, so "no token" always says where to look.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ADMIN_TOKEN_FILE",
    "ENV_TOKEN",
    "Discovery",
    "default_token_path",
    "discover",
    "is_loopback",
    "pointer_path",
    "prune_pointers",
    "remove_pointer",
    "write_pointer",
]

ENV_TOKEN = "KIBO_TOKEN"
ADMIN_TOKEN_FILE = "admin.token"
# Hosts a server listening on all interfaces is reached at: its pointer is keyed by these.
_WILDCARDS = ("0.0.0.0", "::")


def _split(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def is_loopback(address: str) -> bool:
    host, _ = _split(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _home_dir(variable: str, *default: str) -> Path:
    return Path(os.environ.get(variable) or Path.home().joinpath(*default))


def default_token_path() -> Path:
    """`admin.token` in the server's default data dir (`kibo-ctrl serve` without --data-dir)."""
    return _home_dir("XDG_DATA_HOME", ".local", "share") / "kibo" / ADMIN_TOKEN_FILE


def pointer_path(address: str) -> Path:
    """The pointer file of a server listening on `address` (HOST:PORT)."""
    host, port = _split(address)
    host = {"localhost": "127.0.0.1", "": "0.0.0.0"}.get(host, host)
    return _home_dir("XDG_STATE_HOME", ".local", "state") / "kibo" / "servers" / f"{host}_{port}"


def _owner_path(pointer: Path) -> Path:
    """Where the pointer's server process is named: `HOST_PORT.pid` (the pointer itself keeps
    holding the token file's path alone, as clients of every version read it)."""
    return pointer.with_name(pointer.name + ".pid")


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22); None when
    no such process runs (or it is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _owner() -> str:
    pid = os.getpid()
    return f"{pid} {_start_time(pid) or 0}"


def _gone(pointer: Path) -> int | None:
    """The PID of the pointer's server when that server no longer runs (the PID is free, or
    another process's now); None when it runs, or when no owner was recorded (a pointer of
    an older server: taken as before)."""
    try:
        pid_text, _, started = _owner_path(pointer).read_text().partition(" ")
        pid, start = int(pid_text), int(started.strip() or 0)
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    if not Path("/proc/self/stat").exists():  # no /proc: only whether the PID is taken
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        return None
    running = _start_time(pid)
    return pid if running is None or (start and running != start) else None


def write_pointer(listen: str, token_file: Path) -> Path:
    """Record, for clients of this user, where the server on `listen` (this process) keeps its
    admin token."""
    path = pointer_path(listen)
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((_owner_path(path), _owner()), (path, str(token_file.resolve()))):
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(f"{text}\n")
        os.replace(temporary, target)
    return path


def remove_pointer(pointer: Path) -> bool:
    """Remove the pointer if this process wrote it (a server stopping); False if it is another's."""
    owner = _owner_path(pointer)
    try:
        if owner.read_text().strip() != _owner():
            return False
    except OSError:
        return False
    for path in (pointer, owner):
        path.unlink(missing_ok=True)
    return True


def prune_pointers() -> list[Path]:
    """Remove the pointers whose servers are gone (killed, so they could not remove their own),
    and those of older servers (no owner recorded) whose token file is gone with its data dir;
    returns them. Those of running servers stay, and an older one whose token file is there."""
    directory = pointer_path("127.0.0.1:0").parent
    removed = []
    try:
        names = sorted(p.name for p in directory.iterdir() if not p.name.endswith((".pid", ".tmp")))
    except OSError:
        return []
    for name in names:
        pointer, owner = directory / name, directory / f"{name}.pid"
        target = _read(pointer)
        if _gone(pointer) is not None or (not owner.exists() and target is not None and not Path(target).exists()):
            for path in (pointer, owner):
                path.unlink(missing_ok=True)
            removed.append(pointer)
    return removed


def _candidates(address: str) -> list[Path]:
    """Pointers that may describe the server a client reaches at `address`."""
    _, port = _split(address)
    exact = pointer_path(address)
    return [exact, *(p for p in (pointer_path(f"[{w}]:{port}") for w in _WILDCARDS) if p != exact)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Discovery:
    """The token found (None: none) and how: `source` names where it came from, `looked`
    every place tried in order, `token_file` the admin.token file the token was read from."""

    token: str | None
    source: str
    looked: tuple[str, ...]
    token_file: Path | None = None

    def describe(self) -> str:
        if self.token is None:
            return f"no token found; looked at: {'; '.join(self.looked)}"
        return f"the token came from {self.source}"


def discover(address: str, token: str | None = None, *, given_as: str = "token=") -> Discovery:
    """Apply the rule above for a client of the server at `address`."""
    if token:
        return Discovery(token, given_as, (given_as,))
    looked = [f"{given_as} (not given)"]
    from_env = os.environ.get(ENV_TOKEN)
    if from_env:
        return Discovery(from_env, f"${ENV_TOKEN}", (*looked, f"${ENV_TOKEN}"))
    looked.append(f"${ENV_TOKEN} (not set)")
    if not is_loopback(address):
        looked.append(f"local token files (not read: {address} is not a loopback address)")
        return Discovery(None, "", tuple(looked))
    for pointer in _candidates(address):
        target = _read(pointer)
        if target is None:
            looked.append(f"{pointer} (no pointer)")
            continue
        gone = _gone(pointer)
        if gone is not None:
            looked.append(f"{pointer} (passed over: its server, PID {gone}, is gone)")
            continue
        token_file = Path(target)
        found = _read(token_file)
        if found is not None:
            source = f"{token_file} (via {pointer})"
            return Discovery(found, source, (*looked, source), token_file)
        looked.append(f"{token_file} (named by {pointer}: missing or empty)")
    default = default_token_path()
    found = _read(default)
    if found is not None:
        return Discovery(found, str(default), (*looked, str(default)), default)
    looked.append(f"{default} (missing)")
    return Discovery(None, "", tuple(looked))
