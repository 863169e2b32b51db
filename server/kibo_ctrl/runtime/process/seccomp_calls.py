"""The guest's seccomp filter as data: what a workspace may call, what it may not, and why.

seccomp.py builds the filter from these tables and nothing else;
tests/system/test_sandbox_seccomp.py makes every row's calls in a real guest.

The filter is an allow list. `ALLOWED` is what Docker's default profile allows a container
that holds no added capability (moby's `profiles/seccomp/default.json`, with the calls
added to it since: `fchmodat2`, `cachestat`, `futex_wake`/`wait`/`requeue`,
`map_shadow_stack`), for the 64-bit ABIs kibo runs on (x86-64, aarch64: a name this
machine lacks is skipped; calls of the i386 and x32 ABIs kill the caller), less the groups
below. That list has run container workloads for years; what it lacks, they rarely need.
python3, pip, sh and coreutils, git, gcc, make, perl, node, java, go and rustc were run
under this filter (the suite runs the first five): each ran as under the deny list it
replaces, save java's NUMA probe (`get_mempolicy`), which it takes as "no NUMA".

A call in no table gets ENOSYS, what a kernel without it answers, so that libc and language
runtimes fall back as on an older kernel: a call newer than this list (`statmount`,
`listmount`, `mseal`, the `lsm_*` calls...) is refused, and does no harm when refused,
where Docker's EPERM for unknown calls broke glibc 2.33's `faccessat2`. A call in
`REFUSED` gets EPERM: privileged operations that programs do try, whose refusal should
read "not permitted".

Left out of Docker's list:

- `REFUSED` (EPERM), each group with its reason: besides what Docker refuses too, kibo
  refuses `ptrace`, `process_vm_readv`/`writev`, `name_to_handle_at`, `adjtimex`,
  `clock_adjtime` and `io_uring_*` (Docker allows the first five, and io_uring before 25).
- `UNIMPLEMENTED` (ENOSYS): `clone3`, so that libc falls back to `clone`, whose flags the
  filter can read (clone3's are behind a pointer); `modify_ldt` (16-bit segments: Wine and
  DOS emulators, and a history of kernel bugs); the NUMA placement calls (a shared host
  places workspaces; they do not place their memory: libnuma reads ENOSYS as "no NUMA");
  `fanotify_init` (filesystem-wide watches: inotify covers a workspace's own files); the
  obsolete `sysfs` and `ustat`. (`epoll_ctl_old` and `epoll_wait_old` too: no kernel has
  them.)
- With conditions on their arguments: `socket` and `socketpair` by family
  (`SOCKET_FAMILIES`, `NETLINK_PROTOCOLS`), `clone` and `unshare` without namespace flags
  (`NAMESPACE_FLAGS`), `personality` with Docker's values only (`PERSONALITIES`).
"""

from __future__ import annotations

from typing import NamedTuple


class Group(NamedTuple):
    """Calls refused together, for one reason."""

    reason: str
    names: tuple[str, ...]


ALLOWED: tuple[str, ...] = (
    # Processes, threads and signals. (clone and unshare: by their flags, below.)
    "fork",
    "vfork",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "pidfd_open",
    "pidfd_send_signal",
    "process_mrelease",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "restart_syscall",
    "pause",
    "arch_prctl",
    "set_thread_area",
    "get_thread_area",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "rseq",
    "futex",
    "futex_waitv",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    "membarrier",
    "prctl",
    "seccomp",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "capget",
    "capset",
    # Ids, sessions, limits and scheduling (changing them still takes the capabilities
    # no guest process holds).
    "getpid",
    "getppid",
    "gettid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setfsuid",
    "setfsgid",
    "setgroups",
    "getpgid",
    "setpgid",
    "getpgrp",
    "getsid",
    "setsid",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "getpriority",
    "setpriority",
    "ioprio_get",
    "ioprio_set",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getattr",
    "sched_setattr",
    "sched_getparam",
    "sched_setparam",
    "sched_getscheduler",
    "sched_setscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "getcpu",
    "sysinfo",
    "uname",
    "umask",
    "times",
    "getrandom",
    # Memory.
    "brk",
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "msync",
    "madvise",
    "mincore",
    "mlock",
    "mlock2",
    "mlockall",
    "munlock",
    "munlockall",
    "memfd_create",
    "memfd_secret",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "remap_file_pages",
    "map_shadow_stack",
    # Files and directories.
    "open",
    "openat",
    "openat2",
    "creat",
    "close",
    "close_range",
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "lseek",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "fcntl",
    "flock",
    "ioctl",
    "fsync",
    "fdatasync",
    "sync",
    "syncfs",
    "sync_file_range",
    "truncate",
    "ftruncate",
    "fallocate",
    "fadvise64",
    "readahead",
    "cachestat",
    "copy_file_range",
    "sendfile",
    "splice",
    "tee",
    "vmsplice",
    "getdents",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",
    "mknod",
    "mknodat",
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "access",
    "faccessat",
    "faccessat2",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    "fanotify_mark",
    # Waiting and events.
    "select",
    "pselect6",
    "poll",
    "ppoll",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "eventfd",
    "eventfd2",
    # Time (reading it, sleeping and timers; setting the clock is refused below).
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "gettimeofday",
    "time",
    "nanosleep",
    "alarm",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    # Asynchronous I/O (the old AIO; io_uring is refused below).
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    # System V and POSIX IPC (the guest's own IPC namespace).
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    # Sockets (socket and socketpair: by their family, below).
    "bind",
    "connect",
    "listen",
    "accept",
    "accept4",
    "getsockname",
    "getpeername",
    "getsockopt",
    "setsockopt",
    "shutdown",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
)

# Refused with ENOSYS, the filter's default: the calls left out of Docker's list on
# purpose (see the module docstring). Listed so that they are tested, not to build them.
UNIMPLEMENTED: tuple[str, ...] = (
    "clone3",
    "modify_ldt",
    "get_mempolicy",
    "set_mempolicy",
    "mbind",
    "set_mempolicy_home_node",
    "migrate_pages",
    "move_pages",
    "fanotify_init",
    "sysfs",
    "ustat",
)

# Refused with EPERM. The guest runs as root of its own user namespace with no capability,
# so most of these fail anyway: the filter is the second wall, and it keeps a hostile
# guest away from the kernel code behind them.
REFUSED: tuple[Group, ...] = (
    Group(
        "file handles bypass the mount namespace: a handle of an inode opens it wherever it is"
        " on that filesystem (the 'shocker' escape)",
        ("open_by_handle_at", "name_to_handle_at"),
    ),
    Group("replace or stop the host's kernel", ("kexec_load", "kexec_file_load", "reboot")),
    Group(
        "load or unload kernel code",
        ("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"),
    ),
    Group(
        "kernel programs, host-wide profiling, and a primitive most kernel exploits use to win races",
        ("bpf", "perf_event_open", "userfaultfd"),
    ),
    Group(
        "a large kernel surface (Docker since 25, ChromeOS and Android refuse it), and its"
        " operations (opening sockets, files) are calls this filter never sees",
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    ),
    Group(
        "inspect or change other processes (data-plane jobs enter the guest from outside:"
        " these would be the way to reach them)",
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    ),
    Group(
        "mount or move filesystems: each filesystem's mount code is kernel surface, and the"
        " guest's mounts are made for it",
        (
            "mount",
            "umount2",
            "pivot_root",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
        ),
    ),
    Group("enter other namespaces: the data plane's job, done from outside", ("setns",)),
    Group(
        "host administration, the kernel log, raw I/O ports",
        (
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "nfsservctl",
            "syslog",
            "lookup_dcookie",
            "vhangup",
            "uselib",
            "_sysctl",
            "iopl",
            "ioperm",
        ),
    ),
    Group(
        "need a capability no guest process holds: EPERM is the kernel's answer too, given first",
        ("chroot", "sethostname", "setdomainname"),
    ),
    Group("the host's clock", ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex")),
    Group("the kernel keyring is not namespaced", ("add_key", "request_key", "keyctl")),
)


# socket(2)'s first argument: the families a workspace uses. Any other is refused with
# EAFNOSUPPORT, what a kernel built without it answers: AF_VSOCK (the hypervisor and the
# host's agents: no network namespace isolates it), AF_PACKET (raw frames), AF_BLUETOOTH,
# AF_ALG (the kernel's crypto), AF_KEY and AF_XDP, AF_RDS, AF_TIPC, AF_CAN, AF_SMC and the
# rest, each a protocol stack of its own that no workspace needs.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES: tuple[int, ...] = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
# socketpair(2) only makes AF_UNIX pairs that workspaces use.
SOCKETPAIR_FAMILIES: tuple[int, ...] = (AF_UNIX,)
# An AF_NETLINK socket's protocol (socket's third argument): NETLINK_ROUTE (interfaces,
# addresses, routes: getifaddrs, glibc's getaddrinfo with AI_ADDRCONFIG, `ip`) and
# NETLINK_SOCK_DIAG (`ss`). Any other (netfilter, xfrm, audit, uevents, generic netlink's
# families...) is refused with EPROTONOSUPPORT, what the kernel answers for one it lacks.
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
NETLINK_PROTOCOLS: tuple[int, ...] = (NETLINK_ROUTE, NETLINK_SOCK_DIAG)

# clone(2) and unshare(2) with any of these flags in their first argument are refused with
# EPERM (without them, allowed): a new user namespace gives back a full capability set over
# new namespaces (the root of many kernel privilege escalations; the guest's
# user.max_user_namespaces is 0 as well), and the others need a capability no guest holds.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080  # unshare only: in clone's flags this bit is the exit signal's
_CLONE_NAMESPACES = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
NAMESPACE_FLAGS: tuple[tuple[str, int], ...] = (
    ("clone", _CLONE_NAMESPACES),
    ("unshare", _CLONE_NAMESPACES | CLONE_NEWTIME),
)

# personality(2) with one of these (Docker's): PER_LINUX, PER_LINUX32, UNAME26, both, and
# 0xffffffff, which asks for the current one. Another (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC,
# MMAP_PAGE_ZERO...) gets the default ENOSYS: one comparison per argument is all a rule
# has, so the complement of five values cannot be refused with its own errno.
PERSONALITIES: tuple[int, ...] = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def refused_names() -> tuple[str, ...]:
    """Every call of `REFUSED`, in order."""
    return tuple(name for group in REFUSED for name in group.names)
