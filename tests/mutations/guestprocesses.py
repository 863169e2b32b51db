"""Mutations of guest processes (issue 29): the caps, the output ring's bound, hold's
back-pressure, ends by revoke and by the instance's end, the keeper's kill when this server is
gone or when the keeper itself dies, the reserved tags, an idle upload's cancel."""

from tests.mutations.base import Mutation

_TABLE = "tests/unit/test_guest_process_table.py"
_SYSTEM = "tests/system/test_guest_processes.py"
_ARGS = "tests/unit/test_process_arguments.py"
_PROCESSES = "server/kibo_ctrl/runtime/process/guest_access/processes.py"

MUTATIONS = [
    Mutation(
        claim=(
            "At most 32 processes run in a workspace (uploads included): a start flood past the cap is "
            "RESOURCE_EXHAUSTED and starts nothing"
        ),
        code=_PROCESSES,
        find="        if len(running) + len(table.pending) >= MAX_GUEST_PROCESSES:",
        replace="        if False:",
        tests=(f"{_TABLE}::test_caps_and_tags", f"{_SYSTEM}::test_a_start_flood_stops_at_the_cap"),
    ),
    Mutation(
        claim="At most 4 uploads run in a workspace at once",
        code=_PROCESSES,
        find="        if upload and uploads >= MAX_UPLOADS:",
        replace="        if False:",
        tests=(f"{_TABLE}::test_an_idle_upload_is_cancelled",),
    ),
    Mutation(
        claim=(
            "A process's output is kept in a ring of 128 KiB: whatever the guest writes and however slowly a "
            "follower reads, the server's memory stays bounded and the follower is told what it missed"
        ),
        code=_PROCESSES,
        find="            self.ring.evict(min((c.offset for c in self.holds), default=self.ring.end))\n",
        replace="            pass\n",
        tests=(
            f"{_TABLE}::test_output_beyond_the_ring_is_dropped_not_kept",
            f"{_SYSTEM}::test_a_follower_that_never_reads_costs_bounded_memory_and_holds_nothing",
        ),
    ),
    Mutation(
        claim=(
            "A foreground start's client that stops reading holds its process's writer in the guest "
            "(back-pressure, as an exec's): the server's memory stays bounded"
        ),
        code=_PROCESSES,
        find="self.ring.end - min(c.offset for c in self.holds) < PROCESS_REPLAY_BYTES",
        replace="True",
        tests=(
            f"{_TABLE}::test_a_hold_follower_holds_the_writer_and_memory_stays_bounded",
            f"{_SYSTEM}::test_a_foreground_client_that_stops_reading_holds_its_process",
        ),
    ),
    Mutation(
        claim=(
            "A revoke kills the processes started under the revoked credential (gone from the guest) and ends "
            "their Connect streams with UNAUTHENTICATED"
        ),
        code="server/kibo_ctrl/api/data_plane.py",
        find="            self._end_processes(workspace)\n",
        replace="            pass\n",
        tests=(f"{_SYSTEM}::test_an_end_kills_background_processes_and_ends_connect_streams[revoke]",),
    ),
    Mutation(
        claim="An instance's end (stop, force stop, destroy) kills its processes and ends their followers",
        code=_PROCESSES,
        find="        for process in [*table.running.values(), *table.ended]:\n            process.abandon()\n",
        replace="        for process in [*table.running.values(), *table.ended]:\n            pass\n",
        tests=(f"{_TABLE}::test_forget_kills_and_ends_followers",),
    ),
    Mutation(
        claim=(
            "A process ends by owner: an end keeps only the processes of the workspace's current credential revision"
        ),
        code=_PROCESSES,
        find="            if keep_owner is not None and process.spec.owner == keep_owner:\n                continue\n",
        replace="            if keep_owner is not None:\n                continue\n",
        tests=(
            f"{_TABLE}::test_end_by_owner_keeps_the_current_ones",
            f"{_SYSTEM}::test_an_end_kills_background_processes_and_ends_connect_streams[revoke]",
        ),
    ),
    Mutation(
        claim=(
            "Nothing a process started runs on unsupervised: when the server is gone (its control pipe ends) "
            "the keeper in the guest kills the process's group"
        ),
        code="server/kibo_ctrl/runtime/process/guest_access/guest_process.py",
        find="            _signal_group(pid, signal.SIGKILL)  # the server is gone: nothing runs unsupervised\n",
        replace="            pass\n",
        tests=(f"{_TABLE}::test_the_servers_departure_kills_the_group",),
    ),
    Mutation(
        claim=(
            "A keeper killed under its process (the guest's memory limit) takes the process's group with it: "
            "killed from the host, its leader's start time checked"
        ),
        code=_PROCESSES,
        find="                os.killpg(self.host_pid, signal.SIGKILL)\n",
        replace="                pass\n",
        tests=(f"{_TABLE}::test_a_keeper_killed_under_its_command_takes_the_command",),
    ),
    Mutation(
        claim="Tags starting \"kibo-\" are the data plane's own (uploads): a client's are INVALID_ARGUMENT",
        code="server/kibo_ctrl/api/data_plane_processes.py",
        find="    if tag.startswith(RESERVED_TAG_PREFIX):",
        replace="    if False:",
        tests=(
            f"{_ARGS}::test_a_start_names_the_field_it_refuses[reserved-tag]",
            f"{_ARGS}::test_every_call_checks_its_selector[tag-reserved]",
            f"{_SYSTEM}::test_a_start_flood_stops_at_the_cap",
        ),
    ),
    Mutation(
        claim="An upload not written for 60 s is cancelled (SIGTERM: nothing of it is left in the guest)",
        code=_PROCESSES,
        find=(
            'cancelled", process.spec.tag, idle)\n        with contextlib.suppress(GuestRefused):\n'
            "            self._control(process, signal.SIGTERM)\n"
        ),
        replace=(
            'cancelled", process.spec.tag, idle)\n        with contextlib.suppress(GuestRefused):\n            pass\n'
        ),
        tests=(f"{_TABLE}::test_an_idle_upload_is_cancelled",),
    ),
    Mutation(
        claim="A revoked upload is told first (SIGTERM): an archive's staging directory is removed, nothing is left",
        code=_PROCESSES,
        find="            if process.spec.job is not None and process.control >= 0:",
        replace="            if False:",
        tests=("tests/system/test_guest_files.py::test_a_revoke_ends_a_running_upload_and_leaves_nothing[archive]",),
    ),
]
