"""Mutations of the node's brake on guests' writes under its disk reserve (issue 26 item 1:
"thin-provisioned disk that is safe"; runtime/process/disk_guard.py): the clamp, what guests
have in flight counted against the reserve, and the clamp lifted again (also by a restarted
node, from its record or from the clamp's mark)."""

from tests.mutations.base import Mutation

_CODE = "server/kibo_ctrl/runtime/process/disk_guard.py"
_TESTS = "tests/system/test_disk_guard.py"
_SERVER = f"{_TESTS}::test_under_the_disk_reserve_a_writing_guest_gets_enospc_and_the_node_never_fills"
_RESTART = f"{_TESTS}::test_a_restarted_guard_restores_what_it_clamped_from_its_record_or_its_mark"
_LIFT = f"{_TESTS}::test_a_guard_lifts_only_past_the_reserve_and_its_margin"

MUTATIONS = [
    Mutation(
        claim="Under its disk reserve a node lets no guest take another block (ENOSPC in the guest, its files "
        "still read and overwritten), so guests that keep writing never fill the disk that holds the store",
        code=_CODE,
        find="_write_int(sysfs, value)",
        replace="_write_int(sysfs, current)",
        tests=(_SERVER, _RESTART, _LIFT),
    ),
    Mutation(
        claim="What guests have written into their page caches, not yet on the host's disk, counts against the "
        "reserve: a guest writing without syncing is held before the disk fills",
        code=_CODE,
        find="available = free - in_flight",
        replace="available = free",
        tests=(_SERVER,),
    ),
    Mutation(
        claim="Layers and volumes mounted while the disk is under its reserve are held too",
        code=_CODE,
        find="elif self.engaged or available < reserve:",
        replace="elif not self.engaged and available < reserve:",
        tests=(_SERVER,),
    ),
    Mutation(
        claim="Once free space is back over the reserve and its margin, every held image may take blocks again, "
        "also after a restart of the node (from its record, or from the clamp's mark when the record is lost)",
        code=_CODE,
        find="_write_int(sysfs, original)",
        replace="_write_int(sysfs, known.value)",
        tests=(_SERVER, _RESTART, _LIFT),
    ),
    Mutation(
        claim="A restarted node lifts the clamps it made before, from its record of them",
        code=_CODE,
        find="self._clamps: dict[str, Clamp] = self._load()",
        replace="self._clamps: dict[str, Clamp] = {}",
        tests=(_RESTART,),
    ),
    Mutation(
        claim="A restarted node that lost its record of the clamps lifts them from the clamp's mark",
        code=_CODE,
        find='if _read_int(SYS_EXT4 / loop / "reserved_clusters") == clusters - 1:',
        replace="if False:",
        tests=(_RESTART,),
    ),
    Mutation(
        claim="A node hovering at its disk reserve does not lift and clamp its guests' images over and over: the "
        "clamp is lifted only past the reserve plus a quarter of it",
        code=_CODE,
        find="lift = reserve * (1 + LIFT_FRACTION)",
        replace="lift = reserve",
        tests=(_LIFT,),
    ),
]
