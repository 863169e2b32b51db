"""Mutations of what the simulation checks of disk moves (issue 26, simulate/moves.py), and
of the fixes it led to: each removed, the seeds or the unit tests that must catch it."""

from tests.mutations.base import Mutation

_SIM = "tests/system/test_simulation_moves.py::test_moves_hold_every_invariant_through_silences_and_crashes"
_UNIT = "tests/unit/test_move_resume.py"

MUTATIONS = [
    Mutation(
        claim="A move that succeeds puts the workspace on its target, in the commit that ends it",
        code="server/kibo_ctrl/engine/moves.py",
        find="        workspace.storage_node = target\n        steps.leave_stale_copy(workspace, source)",
        replace="        steps.leave_stale_copy(workspace, source)",
        tests=(_SIM,),
    ),
    Mutation(
        claim="A store that fails at a move's step (a full disk) delays the move, never leaves it RUNNING for good",
        code="server/kibo_ctrl/engine/moves.py",
        find="            except StoreError as error:",
        replace="            except ZeroDivisionError as error:",
        tests=(_SIM,),
    ),
    Mutation(
        claim="A moved workspace's old copy is deleted from its source, however long that node is away",
        code="server/kibo_ctrl/engine/moves.py",
        find="        steps.leave_stale_copy(workspace, source)\n",
        replace="",
        tests=(_SIM,),
    ),
    Mutation(
        claim="A move resumed after its target put the files in place goes on to the switch",
        code="server/kibo_ctrl/runtime/process/image_transfer.py",
        find="(file.data_bytes, file.digest):\n        return file.size",
        replace="(file.data_bytes, file.digest):\n        return 0",
        tests=(f"{_UNIT}::test_a_node_says_a_file_it_put_in_place_is_received_whole",),
    ),
    Mutation(
        claim="A simulated node resumes a move after its finish as a process node does",
        code="server/kibo_ctrl/runtime/sim/disks.py",
        find="            return file.size  # finished here",
        replace="            return 0  # finished here",
        tests=(f"{_UNIT}::test_a_simulated_copy_resumes_from_what_was_synced_and_is_checked",),
    ),
    Mutation(
        claim="A simulated node puts a received copy in place only when its digest is the source's",
        code="server/kibo_ctrl/runtime/sim/disks.py",
        find="if (count, digest, candidate.size) != (file.data_bytes, file.digest, file.size):",
        replace="if False:",
        tests=(f"{_UNIT}::test_a_simulated_copy_that_differs_is_not_put_in_place",),
    ),
]
