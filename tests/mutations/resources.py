"""Mutations of a guest's resource limits and of what its /proc shows of the host (issue 27,
items 1 and 5; issue 35, item 4). The cgroup v1 lines are the ones mutated: the machine the
suite runs on has cgroup v1 (the v2 writes beside them are not exercised there)."""

from tests.mutations.base import Mutation

_LIMITS = "tests/system/test_sandbox_limits.py"
_SETUP = "tests/unit/test_cgroups_setup.py"
_CGROUPS = "server/kibo_ctrl/runtime/process/cgroups.py"
_BOMB = f"{_LIMITS}::test_a_fork_bomb_stops_at_the_guests_own_limit_and_harms_nobody_else"
_BUDGET = f"{_LIMITS}::test_the_node_budget_bounds_every_guest_together"
_PROC = f"{_LIMITS}::test_the_guest_sees_neither_the_hosts_disks_nor_its_cgroup_paths"

MUTATIONS = [
    Mutation(
        claim="All guests of a node together hold at most the node's PID budget, below the kernel's task limit",
        code=_CGROUPS,
        find='if controller == "pids":\n                    _write(parent / "pids.max", str(self.pids_budget))',
        replace='if controller == "pids":\n                    pass',
        tests=(_BUDGET, _BOMB, f"{_SETUP}::test_v1_the_parent_holds_the_node_budget_and_each_guest_its_share"),
    ),
    Mutation(
        claim="A guest's fork bomb stops at the guest's own PID limit; other guests, the host and the server fork on",
        code=_CGROUPS,
        find='elif controller == "pids":\n                    _write(directory / "pids.max", str(pids_max))',
        replace='elif controller == "pids":\n                    _write(directory / "pids.max", str(self.pids_budget))',
        tests=(_BOMB, f"{_SETUP}::test_v1_the_parent_holds_the_node_budget_and_each_guest_its_share"),
    ),
    Mutation(
        claim="Forks refused by a PIDs limit are counted per node, and stay counted when the guest goes",
        code=_CGROUPS,
        find="            _RETIRED[str(path.parent)] = _RETIRED.get(str(path.parent), 0) + refused",
        replace="            pass",
        tests=(_BOMB, f"{_SETUP}::test_refused_forks_are_counted_and_stay_counted_when_the_guest_goes"),
    ),
    Mutation(
        claim="A guest gets its CPU quota (one CPU per vCPU) and no more",
        code=_CGROUPS,
        find='_write(directory / "cpu.cfs_quota_us", str(quota))',
        replace="pass",
        tests=(
            f"{_LIMITS}::test_a_cpu_hog_gets_its_quota_and_no_more",
            f"{_SETUP}::test_v1_the_parent_holds_the_node_budget_and_each_guest_its_share",
        ),
    ),
    Mutation(
        claim="A guest's command sees its own cgroups as / (the guest's cgroup namespace)",
        code="server/kibo_ctrl/runtime/process/guest_access/guest_exec.py",
        find='"pid", "cgroup", "mnt"',
        replace='"pid", "mnt"',
        tests=(_PROC,),
    ),
    Mutation(
        claim="A guest's command sees its own cgroups as / (the guest's cgroup namespace)",
        code="server/kibo_ctrl/runtime/process/sandbox.py",
        find='            "--unshare-cgroup",\n',
        replace="",
        tests=(_PROC,),
    ),
    Mutation(
        claim="A guest's /proc shows none of the host's disks, boot command line, kernel configuration, interrupts",
        code="server/kibo_ctrl/runtime/process/sandbox.py",
        find="    for path in MASKED_PATHS:\n",
        replace='    for path in MASKED_PATHS[: MASKED_PATHS.index("/proc/partitions")]:\n',
        tests=(_PROC,),
    ),
]
