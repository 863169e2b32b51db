"""The guest's seccomp filter rule by rule, and its network, probed in a real guest (issues 27.2, 27.4, 35.4).

Every row of seccomp_calls.py's tables, the data the filter is built from, is one
parametrized test: its calls are made in a real guest of `kibo-ctrl serve --runtime
process` (through the data plane's exec, as the tenant's code would make them: python3's
ctypes `syscall()`, with this machine's call numbers resolved by libseccomp on the host)
and each errno is checked. The arguments are chosen so that the kernel itself, without the
rule, answers otherwise (a success, EBADF, EFAULT, EINVAL, ENOENT, ESRCH...), where it can:
a call that needs a capability the guest never holds gets EPERM from the kernel too, and
there the test tells the rule from the kernel by the default's ENOSYS. One guest runs every
probe (one python3, a JSON table back); the tests then read their rows of it.

Also here: calls of other ABIs (i386 through `int 0x80`, x32) kill the whole process; no
nested user namespace, for the right reason; the guest's network is loopback only (no
interface but lo, no route to any other address, the host's own included); and real
programs (sh and coreutils, python3, pip, git and gcc where installed) run under the filter.
Needs root and bubblewrap, like tests/system/test_process_runtime.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kibo_ctrl.runtime.process import seccomp, seccomp_calls
from kibo_ctrl.runtime.process.sandbox import GUEST_PATH
from kibo_ctrl.runtime.process.seccomp_calls import (
    AF_NETLINK,
    NAMESPACE_FLAGS,
    NETLINK_PROTOCOLS,
    PERSONALITIES,
    SOCKET_FAMILIES,
    SOCKETPAIR_FAMILIES,
    UNIMPLEMENTED,
    refused_names,
)

from tests.client import Client
from tests.server import ServerProcess
from tests.system.test_process_runtime import (
    DataPlane,
    _require_sandbox,
    agent_pid,
    create,
    delete,
    sandbox_server,
    text,
)

pytestmark = pytest.mark.xdist_group("sandbox_seccomp")

# A probe's arguments: an int, "pid" (the probing process's), a string (a pointer to it,
# NUL-terminated), or ["buf", n] (a pointer to n zero bytes).
Arg = int | str | list[Any]

# The arguments each refused or unimplemented call is probed with, and what the kernel
# answers to them without the filter, in a sandbox like a guest's (no capability, its own
# namespaces): the proof that the rule, not the kernel, refused. Where the kernel checks a
# capability first (EPERM) or lacks the call (ENOSYS: kexec, modules, iopl are build
# options), the rule shows by its own errno still: without it, the filter's default answers.
# A call not named here is probed with zeros.
EPERM_OR_ENOSYS = ("EPERM", "ENOSYS")
CALL_PROBES: dict[str, tuple[list[Arg], tuple[str, ...]]] = {
    "open_by_handle_at": ([-1, ["buf", 16], 0], ("EINVAL", "EBADF")),
    "name_to_handle_at": ([-100, "/", 0, 0, 0], ("EFAULT",)),
    "kexec_load": ([0, 0, 0, 0], EPERM_OR_ENOSYS),
    "kexec_file_load": ([-1, -1, 0, 0, 0], EPERM_OR_ENOSYS),
    "reboot": ([0, 0, 0, 0], ("EPERM",)),
    "init_module": ([0, 0, 0], EPERM_OR_ENOSYS),
    "finit_module": ([-1, 0, 0], EPERM_OR_ENOSYS),
    "delete_module": ([0, 0], EPERM_OR_ENOSYS),
    "create_module": ([0, 0], ("ENOSYS",)),
    "query_module": ([0, 0, 0, 0, 0], ("ENOSYS",)),
    "get_kernel_syms": ([0], ("ENOSYS",)),
    "bpf": ([0, 0, 0], ("EINVAL", "EPERM")),
    "perf_event_open": ([0, 0, -1, -1, 0], ("EFAULT",)),
    "userfaultfd": ([1], ("ok",)),  # UFFD_USER_MODE_ONLY: allowed to anyone
    "io_uring_setup": ([1, ["buf", 120]], ("ok", "EPERM")),  # EPERM: kernel.io_uring_disabled
    "io_uring_enter": ([-1, 0, 0, 0, 0, 0], ("EBADF",)),
    "io_uring_register": ([-1, 0, 0, 0], ("EINVAL", "EBADF")),
    "ptrace": ([3, "pid", 0, 0], ("ESRCH",)),  # PTRACE_PEEKUSER of itself: it is not its tracer
    "process_vm_readv": (["pid", 0, 0, 0, 0, 0], ("ok",)),
    "process_vm_writev": (["pid", 0, 0, 0, 0, 0], ("ok",)),
    "kcmp": (["pid", "pid", 0, 0, 0], ("ok",)),  # KCMP_FILE, its own fd 0 with itself
    "pidfd_getfd": ([-1, 0, 0], ("EBADF",)),
    "process_madvise": ([-1, 0, 0, 0, 0], ("EBADF",)),
    "mount": ([0, "/nonexistent-kibo-probe", 0, 0, 0], ("ENOENT",)),
    "umount2": (["/", 0x80000000], ("EINVAL",)),
    "pivot_root": (["/nonexistent-kibo-probe", "/nonexistent-kibo-probe"], ("EPERM",)),
    "fsopen": ([0, 0], ("EPERM",)),
    "fsconfig": ([-1, 0, 0, 0, 0], ("EINVAL",)),
    "fsmount": ([-1, 0, 0], ("EPERM",)),
    "fspick": ([-1, 0, 0], ("EPERM",)),
    "move_mount": ([-1, 0, -1, 0, 0], ("EPERM",)),
    "open_tree": ([-100, "/", 0], ("ok",)),  # an O_PATH descriptor of /: no clone, no privilege
    "mount_setattr": ([-1, 0, 0, 0, 0], ("EINVAL",)),
    "setns": ([-1, 0], ("EBADF",)),
    "swapon": ([0, 0], ("EPERM",)),
    "swapoff": ([0], ("EPERM",)),
    "acct": ([0], ("EPERM",)),
    "quotactl": ([0, 0, 0, 0], ("ENODEV", "EFAULT")),
    "quotactl_fd": ([-1, 0, 0, 0], ("EBADF",)),
    "nfsservctl": ([0, 0, 0], ("ENOSYS",)),
    "syslog": ([10, 0, 0], ("EPERM",)),
    "lookup_dcookie": ([0, 0, 0], EPERM_OR_ENOSYS),
    "vhangup": ([], ("EPERM",)),
    "uselib": ([0], ("ENOSYS", "EFAULT")),
    "_sysctl": ([0], ("ENOSYS",)),
    "iopl": ([0], ("ok", "ENOSYS")),  # level 0: no privilege needed
    "ioperm": ([0, 0, 0], ("ok", "ENOSYS")),
    "chroot": (["/nonexistent-kibo-probe"], ("ENOENT",)),
    "sethostname": ([0, 0], ("EPERM",)),
    "setdomainname": ([0, 0], ("EPERM",)),
    "settimeofday": ([1, 0], ("EFAULT",)),  # read before the capability is checked
    "clock_settime": ([0, 0], ("EFAULT",)),
    "clock_adjtime": ([0, 0], ("EFAULT",)),
    "adjtimex": ([0], ("EFAULT",)),
    "add_key": ([0, 0, 0, 0, 0], ("EFAULT",)),
    "request_key": ([0, 0, 0, 0], ("EFAULT",)),
    "keyctl": ([0, -3, 1], ("ok",)),  # KEYCTL_GET_KEYRING_ID of the session keyring
    # UNIMPLEMENTED (the filter's default, ENOSYS):
    "clone3": ([0, 0], ("EINVAL",)),
    "modify_ldt": ([0, ["buf", 16], 0], ("ok",)),  # read 0 bytes of the LDT
    "get_mempolicy": ([0, 0, 0, 0, 0], ("ok",)),
    "set_mempolicy": ([0, 0, 0], ("ok",)),  # MPOL_DEFAULT
    "mbind": ([0, 0, 0, 0, 0, 0], ("ok",)),
    "set_mempolicy_home_node": ([0, 0, 0, 0], ("ok",)),
    "migrate_pages": ([0, 0, 0, 0], ("EINVAL",)),
    "move_pages": ([0, 0, 0, 0, 0, 0], ("ok",)),
    "fanotify_init": ([0x200, 0], ("ok",)),  # FAN_REPORT_FID: allowed without privilege
    "sysfs": ([3], ("ok",)),  # the number of filesystem types
    "ustat": ([0, 0], ("EINVAL",)),
}
# Descriptors a successful probe returns, closed at once.
RETURNS_FD = {"socket", "userfaultfd", "io_uring_setup", "open_tree", "fanotify_init", "pidfd_getfd"}
# Calls newer than seccomp_calls.py and this libseccomp: the default refuses them (ENOSYS).
# Calls since 424 (pidfd_send_signal) have one number on every architecture.
NEWER_CALLS: dict[str, tuple[int, list[Arg], tuple[str, ...]]] = {
    "statmount": (457, [0, 0, 0, 0], ("EFAULT",)),
    "listmount": (458, [0, 0, 0, 0], ("EFAULT",)),
    "mseal": (462, [0, 0, 0], ("ok",)),
}

SOCK_STREAM, SOCK_RAW = 1, 3
SIGCHLD = 17
# unshare(2) flags that are no namespace: allowed.
CLONE_FILES = 0x400
# personality(2) values outside PERSONALITIES: ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, READ_IMPLIES_EXEC.
OTHER_PERSONALITIES = (0x0040000, 0x0100000, 0x0400000)
# A socket domain with the upper half of the register set (the kernel reads an int: AF_INET).
WIDE_AF_INET = (1 << 32) | 2


@dataclass
class Probe:
    """One call in the guest: what the filter must answer ("ok", or an errno's name), and
    what the kernel answers without it."""

    name: str
    args: list[Arg]
    expected: str
    unfiltered: tuple[str, ...] = ()
    fork: bool = False  # a clone that succeeds: the child exits at once, the parent reaps it

    def row(self, number: int) -> dict[str, Any]:
        return {"nr": number, "args": self.args, "fork": self.fork, "close": self.name in RETURNS_FD}


@dataclass(eq=False)  # hashed as itself: a table's rule and a policy row may share an id
class Rule:
    """A row of seccomp_calls.py's tables and the probes that show it holds."""

    id: str
    probes: list[Probe] = field(default_factory=list)


def _call(name: str, expected: str) -> Probe:
    args, unfiltered = CALL_PROBES.get(name, ([0] * 6, ()))
    return Probe(name, args, expected, unfiltered)


def rules() -> list[Rule]:
    """Every rule of the filter's tables, each with its probes."""
    found = [Rule(f"refused-{name}", [_call(name, "EPERM")]) for name in refused_names()]
    found += [Rule(f"unimplemented-{name}", [_call(name, "ENOSYS")]) for name in UNIMPLEMENTED]
    found += [
        Rule(f"newer-{name}", [Probe(name, args, "ENOSYS", unfiltered)])
        for name, (_, args, unfiltered) in NEWER_CALLS.items()
    ]
    families = Rule("socket-families")
    for family in [*range(64), WIDE_AF_INET, 1 << 63]:
        if family == AF_NETLINK:
            continue  # its protocols are the next rule's
        allowed = family in SOCKET_FAMILIES
        families.probes.append(Probe("socket", [family, SOCK_STREAM, 0], "ok" if allowed else "EAFNOSUPPORT"))
    netlink = Rule("socket-netlink-protocols")
    for protocol in [*range(32), 1 << 32]:
        allowed = protocol in NETLINK_PROTOCOLS
        netlink.probes.append(Probe("socket", [AF_NETLINK, SOCK_RAW, protocol], "ok" if allowed else "EPROTONOSUPPORT"))
    pairs = Rule("socketpair-families")
    for family in [*range(64), 1 << 63]:
        expected = "ok" if family in SOCKETPAIR_FAMILIES else "EAFNOSUPPORT"
        pairs.probes.append(Probe("socketpair", [family, SOCK_STREAM, 0, ["buf", 8]], expected))
    found += [families, netlink, pairs]
    for name, mask in NAMESPACE_FLAGS:
        rule = Rule(f"namespace-flags-{name}")
        bits = [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
        if name == "clone":
            rule.probes += [Probe("clone", [bit | SIGCHLD, 0, 0, 0, 0], "EPERM", fork=True) for bit in bits]
            rule.probes.append(Probe("clone", [SIGCHLD, 0, 0, 0, 0], "ok", fork=True))  # a fork
        else:
            rule.probes += [Probe(name, [bit], "EPERM") for bit in bits]
            rule.probes.append(Probe(name, [CLONE_FILES], "ok"))
        found.append(rule)
    personality = Rule("personality")
    personality.probes += [Probe("personality", [value], "ok") for value in PERSONALITIES]
    personality.probes += [Probe("personality", [value], "ENOSYS") for value in OTHER_PERSONALITIES]
    personality.probes.append(Probe("personality", [0], "ok"))  # back to PER_LINUX
    found.append(personality)
    return found


# The policy, written out here rather than read from seccomp_calls.py (what SECURITY.md
# promises, issues 27 and 35 among it), so that a row dropped from the tables fails here:
# the table-driven test above follows the tables, and proves that each row the build reads
# works, not that the row is there.
POLICY_EPERM = (
    *("open_by_handle_at", "name_to_handle_at"),
    *("kexec_load", "kexec_file_load", "reboot"),
    *("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"),
    *("bpf", "perf_event_open", "userfaultfd"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    *("mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree"),
    "mount_setattr",
    "setns",
    *("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "nfsservctl", "syslog", "lookup_dcookie"),
    *("vhangup", "uselib", "_sysctl", "iopl", "ioperm"),
    *("chroot", "sethostname", "setdomainname"),
    *("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
    *("add_key", "request_key", "keyctl"),
)
POLICY_ENOSYS = (
    *("clone3", "modify_ldt", "get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node"),
    *("migrate_pages", "move_pages", "fanotify_init", "sysfs", "ustat"),
)
# The families a workspace may open sockets of: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
POLICY_FAMILIES = {1, 2, 10, 16}
AF_VSOCK = 40
# NETLINK_ROUTE and NETLINK_SOCK_DIAG; NETLINK_NETFILTER (12), NETLINK_GENERIC (16) and the
# rest are refused.
POLICY_NETLINK = {0, 4}
CLONE_NEWUSER = 0x10000000


def pinned() -> list[Rule]:
    """The policy's refusals, each its own row."""
    found = [Rule(name, [_call(name, "EPERM")]) for name in POLICY_EPERM]
    found += [Rule(name, [_call(name, "ENOSYS")]) for name in POLICY_ENOSYS]
    found.append(Rule("AF_VSOCK", [Probe("socket", [AF_VSOCK, SOCK_STREAM, 0], "EAFNOSUPPORT")]))
    others = Rule("socket-families")
    for family in range(64):
        if family != AF_VSOCK:
            kind = SOCK_RAW if family == 16 else SOCK_STREAM  # netlink: NETLINK_ROUTE
            expected = "ok" if family in POLICY_FAMILIES else "EAFNOSUPPORT"
            others.probes.append(Probe("socket", [family, kind, 0], expected))
    netlink = Rule("netlink-protocols")
    for protocol in range(32):
        expected = "ok" if protocol in POLICY_NETLINK else "EPROTONOSUPPORT"
        netlink.probes.append(Probe("socket", [16, SOCK_RAW, protocol], expected))
    found += [others, netlink]
    found.append(Rule("unshare-CLONE_NEWUSER", [Probe("unshare", [CLONE_NEWUSER], "EPERM")]))
    clone = Probe("clone", [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0], "EPERM", fork=True)
    found.append(Rule("clone-CLONE_NEWUSER", [clone]))
    found.append(Rule("personality", [Probe("personality", [value], "ENOSYS") for value in OTHER_PERSONALITIES]))
    return found


RULES = rules()
PINNED = pinned()


# Runs in the guest: each probe in order (JSON on stdin), then the other ABIs' calls in
# children of their own, then what the network looks like; one JSON object out.
PROBE = r"""
import ctypes, errno, json, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
request = json.load(sys.stdin)

def arg(value, keep):
    if value == "pid":
        return ctypes.c_long(os.getpid())
    if isinstance(value, (str, list)):
        buffer = ctypes.create_string_buffer(value.encode() if isinstance(value, str) else value[1])
        keep.append(buffer)
        return ctypes.c_void_p(ctypes.addressof(buffer))
    return ctypes.c_long(value)

calls = []
for probe in request["calls"]:
    keep = []
    args = [arg(a, keep) for a in probe["args"]]
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(probe["nr"]), *args)
    code = ctypes.get_errno()
    if probe["fork"] and result == 0:
        os._exit(0)
    if probe["fork"] and result > 0:
        os.waitpid(result, 0)
    if probe["close"] and result >= 0:
        os.close(result)
    calls.append("ok" if result >= 0 else errno.errorcode.get(code, str(code)))

# A call of another ABI, made by a thread while the main thread waits: the process must die
# (SIGSYS), not only the thread.
OTHER_ABI = '''
import ctypes, mmap, os, resource, sys, threading
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSYS dumps core: not here
libc = ctypes.CDLL(None, use_errno=True)
def call():
    if sys.argv[1] == "i386":
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (getpid); int 0x80; ret
        pid = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
        print("i386 getpid", pid, flush=True)
    else:
        print("x32 getpid", libc.syscall(ctypes.c_long(39 | 0x40000000)), flush=True)  # __X32_SYSCALL_BIT
thread = threading.Thread(target=call, daemon=True)
thread.start()
thread.join(3)
print("the process lives on", flush=True)
os._exit(0)  # not waiting for a killed thread at exit
'''
abi = {}
for kind in request["abis"]:
    done = subprocess.run([sys.executable, "-c", OTHER_ABI, kind], capture_output=True, text=True, timeout=20)
    abi[kind] = [done.returncode, done.stdout]

net = {"interfaces": [name for _, name in socket.if_nameindex()]}
net["proc_net_dev"] = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
net["routes"] = open("/proc/net/route").read().splitlines()[1:]
net["connect"] = {}
# Tried only where lo is all there is (no packet can leave then), else the interfaces fail the test.
for family, address in request["addresses"] if net["interfaces"] == ["lo"] else []:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((address, 9))
        net["connect"][address] = "connected"
    except OSError as error:
        net["connect"][address] = errno.errorcode.get(error.errno, str(error))
    finally:
        s.close()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
client = socket.create_connection(server.getsockname(), timeout=3)
net["loopback"] = "connected"
client.close()
server.close()
print(json.dumps({"calls": calls, "abi": abi, "net": net}))
"""

# Addresses the guest must not reach: documentation networks (never routed) and the host's own.
TEST_NETS = [(socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1")]


def host_addresses() -> list[tuple[int, str]]:
    """This host's non-loopback addresses (IPv4 by SIOCGIFADDR, IPv6 from /proc/net/if_inet6)."""
    found: list[tuple[int, str]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                answer = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address
            found.append((socket.AF_INET, socket.inet_ntoa(answer[20:24])))
    inet6 = Path("/proc/net/if_inet6")
    for line in inet6.read_text().splitlines() if inet6.exists() else []:
        hexa, *_, device = line.split()
        if device != "lo" and not hexa.startswith("fe80"):  # a link-local address needs a scope
            found.append((socket.AF_INET6, socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexa))))
    return found


def probe_request(
    chosen: list[Rule], abis: list[str], addresses: list[tuple[int, str]]
) -> tuple[list[tuple[Rule, Probe]], bytes]:
    """The probes of `chosen` this machine has a call for, and PROBE's input for them."""
    numbers = {name: number for name, (number, _, _) in NEWER_CALLS.items()}
    calls = []
    for rule in chosen:
        for probe in rule.probes:
            number = numbers.get(probe.name, seccomp.resolve(probe.name))
            if number >= 0:  # aarch64 has no iopl, modify_ldt...
                calls.append((rule, probe, number))
    request = {"calls": [probe.row(number) for _, probe, number in calls], "abis": abis, "addresses": addresses}
    return [(rule, probe) for rule, probe, _ in calls], json.dumps(request).encode()


def answers(calls: list[tuple[Rule, Probe]], results: list[str]) -> dict[Rule, list[tuple[Probe, str]]]:
    """Each rule's probes with what they answered."""
    found: dict[Rule, list[tuple[Probe, str]]] = {rule: [] for rule in RULES + PINNED}
    for (rule, probe), result in zip(calls, results, strict=True):
        found[rule].append((probe, result))
    return found


OTHER_ABIS = ["i386", "x32"] if platform.machine() == "x86_64" else []


@dataclass
class Probed:
    """What the guest answered."""

    rules: dict[Rule, list[tuple[Probe, str]]]
    abi: dict[str, list[Any]]
    net: dict[str, Any]
    addresses: list[tuple[int, str]]
    userns: tuple[int, str, str]
    programs: dict[str, tuple[int, str]]


# Real programs under the filter: (name, what must be installed on the host, shell command).
# The guest's /usr is the host's.
PROGRAMS = [
    (
        "coreutils",
        "sh",
        "cd /tmp && cp /etc/passwd x && sort x | uniq | wc -l >/dev/null && tar czf t.tgz x && mkdir -p u"
        " && tar xzf t.tgz -C u && ln -s x y && readlink y && mkfifo f && rm f && touch -d 2020-01-01 x"
        " && chmod 600 x && chown 0:0 x && ps >/dev/null && timeout 1 true && sleep 0.01 && df / >/dev/null"
        " && rm -rf u x y t.tgz",
    ),
    (
        "python3",
        "python3",
        "python3 -c 'import asyncio, multiprocessing, ssl, socket, subprocess, threading;"
        ' ssl.create_default_context(); socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG);'
        " p = multiprocessing.Pool(2); assert p.map(abs, [-1, -2]) == [1, 2]; p.close(); p.join();"
        ' subprocess.run(["true"], check=True); print("ok")\'',
    ),
    ("pip", "pip3", "python3 -m pip --version"),
    (
        "git",
        "git",
        "cd /tmp && rm -rf repo && git init -q repo && cd repo && echo a > a && git add a"
        " && git -c user.email=a@b -c user.name=a commit -qm a && git log --oneline && cd /tmp && rm -rf repo",
    ),
    (
        "gcc",
        "gcc",
        "cd /tmp && printf '#include <pthread.h>\\n#include <stdio.h>\\nstatic void *f(void *a) { return a; }\\n"
        'int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); pthread_join(t, 0); puts("hi"); }\\n\' > h.c'
        " && gcc -pthread -o h h.c && ./h && rm h h.c",
    ),
]


@pytest.fixture(scope="module")
def seccomp_server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    # The default supervisor (the node supervisor holds the ready guests): what users run.
    # Without guest networking (--guest-network off, runtime/process/network/: its own tests are
    # test_guest_network.py): the sandbox's own namespace, loopback only.
    with sandbox_server(
        server_factory, "--backend", "firecracker", "--supervisor", "auto", "--guest-network", "off"
    ) as server:
        yield server


@pytest.fixture(scope="module")
async def probed(seccomp_server: ServerProcess) -> AsyncIterator[Probed]:
    """One guest: every probe, the nested user namespace, the programs."""
    addresses = TEST_NETS + host_addresses()
    calls, request = probe_request(RULES + PINNED, OTHER_ABIS, addresses)
    async with Client.connect(seccomp_server.address) as client:
        workspace = await create(client)
        data = DataPlane(client)
        credential = await data.credential(workspace.workspace_id)
        code, out, err = await data.exec(credential, "python3", "-c", PROBE, stdin=request)
        assert code == 0, err.decode()
        answer = json.loads(out)
        # A nested user namespace, as a workload would ask for one.
        code, out, err = await data.exec(
            credential, "sh", "-c", "cat /proc/sys/user/max_user_namespaces; unshare -U true"
        )
        userns = (code, out.decode(), err.decode())
        programs = {}
        for name, needs, command in PROGRAMS:
            if shutil.which(needs):
                code, out, err = await data.exec(credential, "sh", "-c", command)
                programs[name] = (code, (out + err).decode(errors="replace"))
        await delete(client, workspace, seccomp_server)
    yield Probed(answers(calls, answer["calls"]), answer["abi"], answer["net"], addresses, userns, programs)


def _check(rule: Rule, probed: Probed) -> None:
    got = probed.rules[rule]
    if not got:
        pytest.skip(f"{rule.id}: not a call of {platform.machine()}")
    mismatches = [
        f"{probe.name}{tuple(probe.args)}: {result}, wanted {probe.expected}"
        + (f" (the kernel alone: {'|'.join(probe.unfiltered)})" if probe.unfiltered else "")
        for probe, result in got
        if result != probe.expected
    ]
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize("rule", RULES, ids=[rule.id for rule in RULES])
def test_each_rule_of_the_filter_holds_in_a_guest(rule: Rule, probed: Probed) -> None:
    _check(rule, probed)


@pytest.mark.parametrize("rule", PINNED, ids=[rule.id for rule in PINNED])
def test_each_refusal_of_the_policy_holds(rule: Rule, probed: Probed) -> None:
    _check(rule, probed)


def test_calls_of_other_abis_kill_the_whole_process(probed: Probed) -> None:
    if not OTHER_ABIS:
        pytest.skip("i386 and x32 are x86-64's other ABIs")
    for kind in OTHER_ABIS:
        code, out = probed.abi[kind]
        # Killed by SIGSYS before the call ran, and with it the thread that waited.
        assert (code, out) == (-31, ""), (kind, code, out)


def test_no_nested_user_namespace_in_the_root_sandbox(probed: Probed) -> None:
    code, out, err = probed.userns
    limit, _, _ = out.partition("\n")
    assert limit == "0"  # the namespace's own limit: the second wall
    # Refused by the filter (EPERM), not by that limit (ENOSPC), nor for want of the command.
    assert code == 1 and "unshare failed: Operation not permitted" in err, (code, out, err)


def test_the_guest_network_is_loopback_only(probed: Probed) -> None:
    net = probed.net
    assert net["interfaces"] == ["lo"] and net["proc_net_dev"] == ["lo"], net
    assert net["routes"] == [], net["routes"]
    # No route to the documentation networks nor to any address of the host: refused at
    # once, nothing sent.
    assert {address for _, address in probed.addresses} >= {"198.51.100.1", "2001:db8::1"}
    assert len(probed.addresses) > 2, "the host has no address besides loopback to try"
    assert net["connect"] == {address: "ENETUNREACH" for _, address in probed.addresses}, net["connect"]
    assert net["loopback"] == "connected"


async def test_the_guest_network_namespace_has_no_interface_but_lo(seccomp_server: ServerProcess) -> None:
    """Seen from the host, without the data plane (whose jobs join that namespace)."""
    async with Client.connect(seccomp_server.address) as client:
        workspace = await create(client)
        guest = agent_pid(seccomp_server, workspace)
        assert os.readlink(f"/proc/{guest}/ns/net") != os.readlink("/proc/self/ns/net")
        devices = text(f"/proc/{guest}/net/dev").splitlines()[2:]
        assert [line.split(":")[0].strip() for line in devices] == ["lo"], devices
        await delete(client, workspace, seccomp_server)


@pytest.mark.parametrize("program", [name for name, _, _ in PROGRAMS])
def test_real_programs_run_under_the_filter(program: str, probed: Probed) -> None:
    needs = next(needs for name, needs, _ in PROGRAMS if name == program)
    if program not in probed.programs:
        assert not shutil.which(needs)
        pytest.skip(f"{needs} is not installed on this machine")
    code, output = probed.programs[program]
    assert code == 0, output


def test_the_tables_name_real_calls_once() -> None:
    """Every name in seccomp_calls.py is a call of x86-64 or aarch64 (a typo would be skipped
    silently by the build: allowed nowhere), and none is in two tables."""
    names = [*seccomp_calls.ALLOWED, *refused_names(), *UNIMPLEMENTED]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    unknown = [name for name in names if not seccomp.known(name)]
    assert not unknown, unknown
    assert set(CALL_PROBES) == set(refused_names()) | set(UNIMPLEMENTED)


def test_without_the_filter_the_probes_answer_otherwise() -> None:
    """The probes' arguments are ones the kernel alone answers as CALL_PROBES says (a
    sandbox like a guest's: bwrap's namespaces, no capability, no filter), so that a rule
    that is gone shows in its row; and another ABI's call runs there (the process lives)."""
    _require_sandbox()
    chosen = [rule for rule in RULES if rule.probes and all(probe.unfiltered for probe in rule.probes)]
    calls, request = probe_request(chosen, OTHER_ABIS, [])
    python = shutil.which("python3", path=GUEST_PATH)
    assert python, "python3 is missing"
    sandbox = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    sandbox += ["--tmpfs", "/tmp", "--cap-drop", "ALL", "--die-with-parent"]
    # As nobody: the probes run unfiltered, and host root, even without capabilities, owns
    # what root owns (/proc/sys among them).
    done = subprocess.run(
        [*sandbox, python, "-c", PROBE],
        input=request,
        capture_output=True,
        timeout=60,
        user=65534,
        group=65534,
        extra_groups=[],
    )
    assert done.returncode == 0, done.stderr.decode()
    answer = json.loads(done.stdout)
    got = answers(calls, answer["calls"])
    mismatches = [
        f"{probe.name}{tuple(probe.args)}: {result}, CALL_PROBES says {'|'.join(probe.unfiltered)}"
        for rule in chosen
        for probe, result in got[rule]
        if result not in probe.unfiltered
    ]
    assert not mismatches, "\n".join(mismatches)
    for kind in OTHER_ABIS:
        code, out = answer["abi"][kind]
        assert code == 0 and out.endswith("the process lives on\n"), (kind, code, out)
