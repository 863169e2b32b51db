"""Mutations of the resource model's protections (issue 26, items 1, 2 and 5): the disk's
reserve of real free space, the allocation ratios, the up-front refusal, a node's refusal
placed again, and memory as a guest sees it."""

from tests.mutations.base import Mutation

_SYSTEM = "tests/system/test_resource_model.py"
_UNIT = "tests/unit/test_resource_model.py"
_API = "tests/integration/test_resource_model.py"

MUTATIONS = [
    Mutation(
        claim="Under its reserve of real free space a node makes no new layer or volume (DiskPressure): a create "
        "waits UNSCHEDULABLE with the node named, and nothing is FAILED after it was accepted",
        code="server/kibo_ctrl/runtime/process/storage.py",
        find="return free, reserve, promised_bytes(data_dir), free < reserve",
        replace="return free, reserve, promised_bytes(data_dir), False",
        tests=(
            f"{_SYSTEM}::test_real_free_space_under_the_reserve_refuses_new_storage_naming_the_node",
            f"{_UNIT}::test_under_the_reserve_no_new_storage_whatever_its_size",
        ),
    ),
    Mutation(
        claim="The scheduler places nothing that needs new storage on a node that reported its disk under its reserve",
        code="server/kibo_ctrl/engine/placement.py",
        find="disk = storage_room(node, need_gib)",
        replace='disk = ""',
        tests=(
            f"{_SYSTEM}::test_real_free_space_under_the_reserve_refuses_new_storage_naming_the_node",
            f"{_UNIT}::test_a_node_under_its_disk_reserve_is_passed_over_with_the_reason",
        ),
    ),
    Mutation(
        claim="A launch a node had no room for is placed again (UNSCHEDULABLE until there is room), not FAILED",
        code="server/kibo_ctrl/engine/controller.py",
        find="if report.no_room and not report.holds and not report.volumes_created and placing:",
        replace="if False:",
        tests=(
            f"{_SYSTEM}::test_real_free_space_under_the_reserve_refuses_new_storage_naming_the_node",
            f"{_UNIT}::test_a_launch_the_node_had_no_room_for_is_placed_again_not_failed",
        ),
    ),
    Mutation(
        claim="A node offers its host's cores times --cpu-allocation-ratio (16 by default), local or remote",
        code="server/kibo_ctrl/domain/nodes.py",
        find="offered_vcpus = vcpus or max(1, allocatable(host_vcpus, ratios.cpu))",
        replace="offered_vcpus = vcpus or max(1, host_vcpus)",
        tests=(
            f"{_SYSTEM}::test_a_node_on_this_host_holds_as_many_default_workspaces_as_its_ratios_allow",
            f"{_UNIT}::test_a_node_offers_its_host_times_the_ratios_unless_told",
        ),
    ),
    Mutation(
        claim="A create, start or resize that no node could ever hold is refused up front with RESOURCE_EXHAUSTED",
        code="server/kibo_ctrl/engine/service.py",
        find="    if why:\n        raise NoCapacity(",
        replace="    if False:\n        raise NoCapacity(",
        tests=(
            f"{_API}::test_what_no_node_could_ever_hold_is_refused_up_front",
            f"{_UNIT}::test_a_create_bigger_than_every_node_is_refused_and_nothing_is_stored",
        ),
    ),
    Mutation(
        claim="One process over a workspace's memory is killed in the guest (exit 137), which runs on: "
        "not the whole guest, as memory.oom.group=1 would",
        code="server/kibo_ctrl/runtime/process/supervisor.py",
        find="own = all(kill.own_limit for kill in logged) if logged else hits > self.limit_base",
        replace="own = False",
        tests=(f"{_SYSTEM}::test_a_process_over_the_workspace_memory_is_killed_in_the_guest_which_runs_on",),
    ),
    Mutation(
        claim="The host (or the node's share of it) running out of memory still takes the spec's "
        "host-memory-exhaustion path (FAILED, then STOPPED with HOST_MEMORY_EXHAUSTED)",
        code="server/kibo_ctrl/runtime/process/supervisor.py",
        find="own = all(kill.own_limit for kill in logged) if logged else hits > self.limit_base",
        replace="own = True",
        tests=(f"{_SYSTEM}::test_the_host_running_out_of_memory_still_takes_the_host_memory_path",),
    ),
    Mutation(
        claim="The guest's init (kibo's agent) is the OOM killer's last choice in its guest: every other "
        "process of the guest ranks above it (oom_score_adj 500, 0 for the init)",
        code="server/kibo_ctrl/runtime/process/supervisor_guest.py",
        find='spare_from_oom(chain if self.spec.get("oom_protect_entry") else chain[:-1])',
        replace="spare_from_oom([])",
        tests=(f"{_SYSTEM}::test_a_process_over_the_workspace_memory_is_killed_in_the_guest_which_runs_on",),
    ),
]
