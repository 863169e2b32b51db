"""Mutations of the protections of workspace moves (issue 26): what a node's NodeStorageService
takes, and the checks a moved copy passes before it counts."""

from tests.mutations.base import Mutation

_UNIT = "tests/unit/test_image_transfer.py"
_MOVE = "tests/system/test_workspace_move.py"

MUTATIONS = [
    Mutation(
        claim=(
            "A node's disks (NodeStorageService) answer only the control plane: "
            "a call without its join's secret is UNAUTHENTICATED"
        ),
        code="server/kibo_ctrl/node_host.py",
        find="service_handler(disks, gate)",
        replace="service_handler(disks, type(gate)(None))",
        tests=(f"{_MOVE}::test_a_stopped_workspace_moves_its_disks_to_another_node_through_a_kill9_of_the_target",),
    ),
    Mutation(
        claim="A moved file's name reaches only the workspace's own layer or volume image on the node",
        code="server/kibo_ctrl/runtime/process/image_transfer.py",
        find='return data_dir / "volumes" / safe(volume_id) / storage.VOLUME_IMAGE',
        replace='return data_dir / "volumes" / volume_id / storage.VOLUME_IMAGE',
        tests=(
            f"{_UNIT}::test_names_reach_only_the_workspaces_own_images[ws-1-volume/../../x]",
            f"{_UNIT}::test_names_reach_only_the_workspaces_own_images[ws-1-volume/]",
        ),
    ),
    Mutation(
        claim="A moved copy is put in place only if it matches the source's SHA-256; one that differs is dropped",
        code="server/kibo_ctrl/runtime/process/image_transfer.py",
        find="if (count, digest) != (file.data_bytes, file.digest) or source.stat().st_size != file.size:",
        replace="if False:",
        tests=(f"{_UNIT}::test_a_copy_that_differs_is_not_put_in_place",),
    ),
    Mutation(
        claim="A move never overwrites an image already in place on the target",
        code="server/kibo_ctrl/runtime/process/image_transfer.py",
        find="        if self.path.exists():\n            raise MoveRefused",
        replace="        if False:\n            raise MoveRefused",
        tests=(f"{_UNIT}::test_a_file_in_place_is_never_overwritten",),
    ),
    Mutation(
        claim="A receive takes blocks only inside the file and after what it synced",
        code="server/kibo_ctrl/runtime/process/image_transfer.py",
        find="if offset < self.synced - self.synced % BLOCK or offset + len(data) > size or offset % BLOCK:",
        replace="if False:",
        tests=(f"{_UNIT}::test_blocks_outside_the_file_are_refused",),
    ),
    Mutation(
        claim="A start waits while a move copies the workspace's disks (CONFLICT)",
        code="server/kibo_ctrl/domain/rules.py",
        find="        Op.START: Guard.IDLE,\n        Op.DELETE: Guard.ALWAYS,\n        Op.RESIZE",
        replace="        Op.START: Guard.ALWAYS,\n        Op.DELETE: Guard.ALWAYS,\n        Op.RESIZE",
        tests=(
            "tests/unit/test_rules_unit.py::test_state_operation_table[STOPPED_moving-START]",
            f"{_MOVE}::test_a_stopped_workspace_moves_its_disks_to_another_node_through_a_kill9_of_the_target",
        ),
    ),
]
