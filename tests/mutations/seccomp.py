"""Mutations of the guest's seccomp filter, its user namespace limit and its network namespace
(issue 27, items 2 and 4; issue 35, item 4).

Two kinds: a row taken out of seccomp_calls.py's tables (caught by the policy rows of
tests/system/test_sandbox_seccomp.py, which write the policy out rather than read the
tables), and a rule the build in seccomp.py stops making (caught by the table-driven rows,
which make each row's calls in a real guest). A refusal taken out of `REFUSED` still meets
the filter's default (ENOSYS): its rows fail on the errno, and the default has mutations of
its own (allow everything; the other ABIs let through)."""

from tests.mutations.base import Mutation

_CALLS = "server/kibo_ctrl/runtime/process/seccomp_calls.py"
_BUILD = "server/kibo_ctrl/runtime/process/seccomp.py"
_TEST = "tests/system/test_sandbox_seccomp.py"
_POLICY = f"{_TEST}::test_each_refusal_of_the_policy_holds"
_TABLE = f"{_TEST}::test_each_rule_of_the_filter_holds_in_a_guest"
_NESTED = f"{_TEST}::test_no_nested_user_namespace_in_the_root_sandbox"


def _policy(*ids: str) -> tuple[str, ...]:
    return tuple(f"{_POLICY}[{row}]" for row in ids)


def _table(*ids: str) -> tuple[str, ...]:
    return tuple(f"{_TABLE}[{row}]" for row in ids)


def _refused(claim: str, find: str, names: tuple[str, ...], empty: str = "()") -> Mutation:
    """A group of REFUSED emptied (`find` is its names' tuple, or its first lines)."""
    return Mutation(claim=claim, code=_CALLS, find=find, replace=empty, tests=_policy(*names))


_MOUNTS = ("mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree")
_ADMIN = ("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "nfsservctl", "syslog", "lookup_dcookie")
_ADMIN += ("vhangup", "uselib", "_sysctl", "iopl", "ioperm")
_UNIMPLEMENTED = ("clone3", "modify_ldt", "get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node")
_UNIMPLEMENTED += ("migrate_pages", "move_pages", "fanotify_init", "sysfs", "ustat")

MUTATIONS = [
    # -- the policy: rows of seccomp_calls.py ----------------------------------------------
    _refused(
        "A guest cannot use file handles (open_by_handle_at, name_to_handle_at: EPERM)",
        '("open_by_handle_at", "name_to_handle_at")',
        ("open_by_handle_at", "name_to_handle_at"),
    ),
    _refused(
        "A guest cannot replace or stop the host's kernel (kexec_load, kexec_file_load, reboot: EPERM)",
        '("kexec_load", "kexec_file_load", "reboot")',
        ("kexec_load", "kexec_file_load", "reboot"),
    ),
    _refused(
        "A guest cannot load or unload kernel modules (init_module, finit_module, delete_module, the old calls: EPERM)",
        '("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms")',
        ("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"),
    ),
    _refused(
        "A guest cannot use bpf, perf_event_open or userfaultfd (EPERM)",
        '("bpf", "perf_event_open", "userfaultfd")',
        ("bpf", "perf_event_open", "userfaultfd"),
    ),
    _refused(
        "A guest cannot use io_uring (io_uring_setup, io_uring_enter, io_uring_register: EPERM)",
        '("io_uring_setup", "io_uring_enter", "io_uring_register")',
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    ),
    _refused(
        "A guest cannot inspect or change other processes (ptrace, process_vm_readv/writev, kcmp, pidfd_getfd,"
        " process_madvise: EPERM)",
        '("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise")',
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    ),
    _refused(
        "A guest cannot mount or move filesystems (mount, umount2, pivot_root, the new mount API: EPERM)",
        '        (\n            "mount",\n            "umount2",',
        (*_MOUNTS, "mount_setattr"),
        empty='        () and (\n            "mount",\n            "umount2",',
    ),
    _refused(
        "A guest cannot enter other namespaces (setns: EPERM)",
        '("setns",)',
        ("setns",),
    ),
    _refused(
        "A guest cannot administer the host (swap, accounting, quotas, the kernel log, raw I/O ports: EPERM)",
        '        (\n            "swapon",\n            "swapoff",',
        _ADMIN,
        empty='        () and (\n            "swapon",\n            "swapoff",',
    ),
    _refused(
        "A guest cannot chroot or set the host name (EPERM)",
        '("chroot", "sethostname", "setdomainname")',
        ("chroot", "sethostname", "setdomainname"),
    ),
    _refused(
        "A guest cannot set or adjust the host's clock (settimeofday, clock_settime, clock_adjtime, adjtimex: EPERM)",
        '("settimeofday", "clock_settime", "clock_adjtime", "adjtimex")',
        ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
    ),
    _refused(
        "A guest cannot use the kernel keyring (add_key, request_key, keyctl: EPERM)",
        '("add_key", "request_key", "keyctl")',
        ("add_key", "request_key", "keyctl"),
    ),
    Mutation(
        claim="clone3 gets ENOSYS in a guest, so that libc falls back to clone, whose flags the filter reads",
        code=_CALLS,
        # clone3 moved from the first row of UNIMPLEMENTED to the last of ALLOWED.
        find='    "recvmmsg",\n)\n\n'
        "# Refused with ENOSYS, the filter's default: the calls left out of Docker's list on\n"
        "# purpose (see the module docstring). Listed so that they are tested, not to build them.\n"
        'UNIMPLEMENTED: tuple[str, ...] = (\n    "clone3",\n',
        replace='    "recvmmsg",\n    "clone3",\n)\n\n'
        "# Refused with ENOSYS, the filter's default: the calls left out of Docker's list on\n"
        "# purpose (see the module docstring). Listed so that they are tested, not to build them.\n"
        "UNIMPLEMENTED: tuple[str, ...] = (\n",
        tests=_policy("clone3"),
    ),
    Mutation(
        claim="A guest cannot open AF_VSOCK sockets (EAFNOSUPPORT)",
        code=_CALLS,
        find="SOCKET_FAMILIES: tuple[int, ...] = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)",
        replace="SOCKET_FAMILIES: tuple[int, ...] = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, 40)",
        tests=_policy("AF_VSOCK"),
    ),
    Mutation(
        claim="A guest opens netlink sockets of NETLINK_ROUTE and NETLINK_SOCK_DIAG only (else EPROTONOSUPPORT)",
        code=_CALLS,
        find="NETLINK_PROTOCOLS: tuple[int, ...] = (NETLINK_ROUTE, NETLINK_SOCK_DIAG)",
        replace="NETLINK_PROTOCOLS: tuple[int, ...] = (NETLINK_ROUTE, NETLINK_SOCK_DIAG, 16)",
        tests=_policy("netlink-protocols"),
    ),
    Mutation(
        claim="No process in a guest can make a user namespace (clone, unshare with CLONE_NEWUSER: EPERM)",
        code=_CALLS,
        find="CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID",
        replace="CLONE_NEWIPC | CLONE_NEWPID",
        tests=(*_policy("unshare-CLONE_NEWUSER", "clone-CLONE_NEWUSER"), _NESTED),
    ),
    Mutation(
        claim="A guest sets personality(2) to Docker's values only (no ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO,"
        " READ_IMPLIES_EXEC)",
        code=_CALLS,
        find="PERSONALITIES: tuple[int, ...] = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)",
        replace="PERSONALITIES: tuple[int, ...] = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF, 0x0040000)",
        tests=_policy("personality"),
    ),
    # -- the build: seccomp.py --------------------------------------------------------------
    Mutation(
        claim="The guest's seccomp filter is an allow list: a call it does not list gets ENOSYS",
        code=_BUILD,
        find="DEFAULT_ACTION = SCMP_ACT_ERRNO_BASE | errno.ENOSYS",
        replace="DEFAULT_ACTION = SCMP_ACT_ALLOW",
        tests=(
            *_policy(*_UNIMPLEMENTED),
            *_table("unimplemented-clone3", "newer-statmount", "newer-listmount", "newer-mseal"),
        ),
    ),
    Mutation(
        claim="A call of another ABI (i386 int 0x80, x32) kills the whole guest process",
        code=_BUILD,
        find="BAD_ARCH_ACTION = SCMP_ACT_KILL_PROCESS",
        replace="BAD_ARCH_ACTION = SCMP_ACT_ALLOW",
        tests=(f"{_TEST}::test_calls_of_other_abis_kill_the_whole_process",),
    ),
    Mutation(
        claim="A call of another ABI (i386 int 0x80, x32) kills the whole guest process",
        code=_BUILD,
        find="BAD_ARCH_ACTION = SCMP_ACT_KILL_PROCESS",
        replace="BAD_ARCH_ACTION = 0  # SCMP_ACT_KILL_THREAD: the thread only",
        tests=(f"{_TEST}::test_calls_of_other_abis_kill_the_whole_process",),
    ),
    Mutation(
        claim="Each call of the filter's REFUSED table gets EPERM in a guest",
        code=_BUILD,
        find="        add(name, _errno(errno.EPERM))\n",
        replace="        add(name, SCMP_ACT_ALLOW)\n",
        tests=_table(
            "refused-io_uring_setup",
            "refused-ptrace",
            "refused-process_vm_readv",
            "refused-kcmp",
            "refused-mount",
            "refused-open_tree",
            "refused-userfaultfd",
            "refused-setns",
        ),
    ),
    Mutation(
        claim="A guest cannot open AF_VSOCK sockets (EAFNOSUPPORT)",
        code=_BUILD,
        find='    _only(add, "socket", 0, SOCKET_FAMILIES, errno.EAFNOSUPPORT)',
        replace='    add("socket", SCMP_ACT_ALLOW)',
        tests=(*_table("socket-families", "socket-netlink-protocols"), *_policy("AF_VSOCK")),
    ),
    Mutation(
        claim="A socket family a guest may not use is refused with EAFNOSUPPORT, what a kernel without it answers",
        code=_BUILD,
        find="    add(name, _errno(refusal), *given, _ArgCmp(arg, SCMP_CMP_GT, max(allowed), 0))",
        replace="    pass",
        tests=(*_table("socket-families", "socketpair-families"), *_policy("AF_VSOCK")),
    ),
    Mutation(
        claim="A guest opens netlink sockets of NETLINK_ROUTE and NETLINK_SOCK_DIAG only (else EPROTONOSUPPORT)",
        code=_BUILD,
        find='        _only(add, "socket", 2, NETLINK_PROTOCOLS, errno.EPROTONOSUPPORT, _eq(0, AF_NETLINK))',
        replace='        add("socket", SCMP_ACT_ALLOW, _eq(0, AF_NETLINK))',
        tests=(*_table("socket-netlink-protocols"), *_policy("netlink-protocols")),
    ),
    Mutation(
        claim="A guest makes socket pairs of AF_UNIX only (else EAFNOSUPPORT)",
        code=_BUILD,
        find='    _only(add, "socketpair", 0, SOCKETPAIR_FAMILIES, errno.EAFNOSUPPORT)',
        replace='    add("socketpair", SCMP_ACT_ALLOW)',
        tests=_table("socketpair-families"),
    ),
    Mutation(
        claim="No process in a guest can make a user namespace (clone, unshare with CLONE_NEWUSER: EPERM)",
        code=_BUILD,
        find="        add(name, SCMP_ACT_ALLOW, _ArgCmp(0, SCMP_CMP_MASKED_EQ, mask, 0))",
        replace="        add(name, SCMP_ACT_ALLOW)",
        tests=(
            *_table("namespace-flags-clone", "namespace-flags-unshare"),
            *_policy("unshare-CLONE_NEWUSER", "clone-CLONE_NEWUSER"),
            _NESTED,
        ),
    ),
    Mutation(
        claim="A guest sets personality(2) to Docker's values only (no ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO,"
        " READ_IMPLIES_EXEC)",
        code=_BUILD,
        find='        add("personality", SCMP_ACT_ALLOW, _eq(0, persona))',
        replace='        add("personality", SCMP_ACT_ALLOW)',
        tests=(*_table("personality"), *_policy("personality")),
    ),
    # -- the rest of the guest's walls that the same probes test -----------------------------
    Mutation(
        claim="No process in a guest can make a user namespace (clone, unshare with CLONE_NEWUSER: EPERM)",
        code="server/kibo_ctrl/runtime/process/userns.py",
        find='        with open("/proc/sys/user/max_user_namespaces", "w") as f:\n            f.write("0")',
        replace="        pass",
        tests=(_NESTED,),
    ),
    Mutation(
        claim="A guest's network is loopback only: no interface but lo, no route to any other address",
        code="server/kibo_ctrl/runtime/process/sandbox.py",
        find='            *(() if plan.netns else ("--unshare-net",)),\n',
        replace="",
        # (The data plane's jobs then fail: they join the guest's network namespace, the
        # host's. The test reads the guest's from the host.)
        tests=(f"{_TEST}::test_the_guest_network_namespace_has_no_interface_but_lo",),
    ),
]
