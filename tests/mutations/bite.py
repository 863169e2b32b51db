"""Issue 35 (items 1, 2, 5, 6): the node supervisor's hand-over checks, the data-plane
credential's binding, revocation of running calls and the exec flood's bound."""

from __future__ import annotations

from tests.mutations.base import Mutation

NODE_SUPERVISOR = "server/kibo_ctrl/runtime/process/node_supervisor.py"
PEERS = "tests/unit/test_node_supervisor_peers.py"
CREDENTIALS = "tests/system/test_data_plane_credentials.py"
DATA_PLANE_SECURITY = "tests/system/test_data_plane_security.py"

DATA_PLANE = "server/kibo_ctrl/api/data_plane.py"
SIGNED_CLAIM = (
    "A data-plane credential is HMAC-signed with the server's key: one signed with another key, or "
    "whose payload was rewritten (another workspace, generation or revision), is refused"
)
BOUND_CLAIM = (
    "A data-plane credential is bound to its workspace's execution generation and credential "
    "revision: one of another generation or revision is refused, even signed with the server's key"
)
DELETED_CLAIM = "A deleted or deleting workspace honours no data-plane credential, even one of its last revision"

REVOKE_CLAIM = (
    "Revoking data-plane access ends the calls it authorized at once: the command is killed in the "
    "guest and the stream ends UNAUTHENTICATED (bound: 2 s; measured ~5 ms)"
)
FLOOD_CLAIM = (
    "An exec flood to a client that stops reading holds the guest's writer back: the server grows "
    "by less than 64 MiB (measured ~1 MiB) however much the guest writes"
)

CLUSTER = "tests/system/test_cluster.py"
RELAUNCH_CLAIM = (
    "No instance is launched twice (counted by the nodes' runtimes): a node agent that reconnects "
    "or restarts does not drive again a step it has already done"
)

ROOTLESS = "tests/system/test_sandbox_rootless.py"
NESTED_USERNS_CLAIM = "No process in a guest can make a user namespace (clone, unshare with CLONE_NEWUSER: EPERM)"
NEVER_UNISOLATED_CLAIM = (
    "--sandbox auto never runs a guest unisolated: where bubblewrap does not work the server starts, "
    "says why, and fails every launch naming the fix"
)

HANDOVER_CLAIM = (
    "The node supervisor takes a hand-over only from a process of the server's uid that is a "
    "supervisor of its own data directory, and serves it only once that supervisor has exited"
)

MUTATIONS: list[Mutation] = [
    Mutation(
        claim=HANDOVER_CLAIM,
        code=NODE_SUPERVISOR,
        find="        if uid != os.getuid():\n            peer.close()",
        replace="        if False:\n            peer.close()",
        tests=(f"{PEERS}::test_a_handover_from_another_uid_is_refused",),
    ),
    Mutation(
        claim=HANDOVER_CLAIM,
        code=NODE_SUPERVISOR,
        # The sender's program is not checked: its first argument is taken for its instance.
        find='next(i for i, w in enumerate(words) if w.endswith(b"supervisor.py"))',
        replace="1",
        tests=(f"{PEERS}::test_a_handover_from_a_process_that_is_no_supervisor_is_refused",),
    ),
    Mutation(
        claim=HANDOVER_CLAIM,
        code=NODE_SUPERVISOR,
        find="if directory.parent != self.instances_dir:",
        replace="if False:",
        tests=(f"{PEERS}::test_a_handover_from_a_supervisor_of_another_data_directory_is_refused",),
    ),
    Mutation(
        claim=HANDOVER_CLAIM,
        code=NODE_SUPERVISOR,
        # Served at "go", without waiting for the supervisor's exit.
        find='EVENT_READ, ("gone", pending))\n',
        replace='EVENT_READ, ("gone", pending))\n                self.activate(pending)\n',
        tests=(f"{PEERS}::test_a_handover_is_served_only_once_its_supervisor_has_exited",),
    ),
    Mutation(
        claim=SIGNED_CLAIM,
        code=DATA_PLANE,
        find="not hmac.compare_digest(signature, self._sign(payload))",
        replace="not True",
        tests=(
            f"{CREDENTIALS}::test_a_credential_signed_with_another_key_is_refused",
            f"{CREDENTIALS}::test_a_credential_re_signed_for_another_workspace_is_refused",
            f"{CREDENTIALS}::test_a_revoked_credential_re_signed_for_the_current_revision_is_refused",
            f"{CREDENTIALS}::test_an_old_generations_credential_re_signed_for_the_current_one_is_refused",
        ),
    ),
    Mutation(
        claim=BOUND_CLAIM,
        code=DATA_PLANE,
        find="if workspace.generation != generation or workspace.data_plane_revision",
        replace="if workspace.data_plane_revision",
        tests=(
            f"{CREDENTIALS}::test_a_credential_for_another_generation_or_revision_is_refused_whoever_signed_it"
            "[next-generation]",
            f"{CREDENTIALS}::test_a_credential_for_another_generation_or_revision_is_refused_whoever_signed_it"
            "[previous-generation]",
        ),
    ),
    Mutation(
        claim=BOUND_CLAIM,
        code=DATA_PLANE,
        find=" or workspace.data_plane_revision != revision:",
        replace=":",
        tests=(
            f"{CREDENTIALS}::test_a_credential_for_another_generation_or_revision_is_refused_whoever_signed_it"
            "[next-revision]",
            f"{CREDENTIALS}::test_a_credential_for_another_generation_or_revision_is_refused_whoever_signed_it"
            "[previous-revision]",
            f"{CREDENTIALS}::test_a_revoked_credential_re_signed_for_the_current_revision_is_refused",
        ),
    ),
    Mutation(
        claim=DELETED_CLAIM,
        code=DATA_PLANE,
        find="if workspace is None or workspace.deleted or workspace.deletion_started:",
        replace="if workspace is None:",
        tests=(f"{CREDENTIALS}::test_a_deleted_workspace_honours_no_credential_whoever_signed_it",),
    ),
    Mutation(
        claim=REVOKE_CLAIM,
        code="server/kibo_ctrl/api/data_plane_sessions.py",
        find="session.end(why)",
        replace="pass",
        tests=(
            f"{DATA_PLANE_SECURITY}::test_revoke_ends_running_commands",
            f"{DATA_PLANE_SECURITY}::test_a_flood_to_a_client_that_stops_reading_ends_at_revoke",
            f"{DATA_PLANE_SECURITY}::test_a_command_that_closes_its_streams_is_still_ended",
        ),
    ),
    Mutation(
        claim=FLOOD_CLAIM,
        code="server/kibo_ctrl/runtime/process/guest_access/jobs.py",
        find="asyncio.Queue(QUEUE_CHUNKS)",
        replace="asyncio.Queue()",
        tests=(
            f"{DATA_PLANE_SECURITY}::test_grpc_flood_to_a_client_that_stops_reading",
            f"{DATA_PLANE_SECURITY}::test_grpc_client_killed_mid_flood",
            f"{DATA_PLANE_SECURITY}::test_connect_flood_to_a_client_that_stops_reading",
        ),
    ),
    Mutation(
        claim=RELAUNCH_CLAIM,
        code="server/kibo_ctrl/engine/node_agent.py",
        find="if instance.step == instance.done_step or instance.step <= self._started",
        replace="if instance.step <= self._started",
        tests=(f"{CLUSTER}::test_three_replicas_and_three_nodes_lose_no_acknowledged_command_through_kill_9s",),
    ),
    # The rootless sandbox keeps the same walls (same claim as seccomp.py's, its own test).
    Mutation(
        claim=NESTED_USERNS_CLAIM,
        code="server/kibo_ctrl/runtime/process/seccomp_calls.py",
        find="CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID",
        replace="CLONE_NEWIPC | CLONE_NEWPID",
        tests=(f"{ROOTLESS}::test_a_rootless_server_runs_hardened_guests",),
    ),
    Mutation(
        claim=NESTED_USERNS_CLAIM,
        code="server/kibo_ctrl/runtime/process/userns.py",
        find='        with open("/proc/sys/user/max_user_namespaces", "w") as f:\n            f.write("0")',
        replace="        pass",
        tests=(f"{ROOTLESS}::test_a_rootless_server_runs_hardened_guests",),
    ),
    Mutation(
        claim=NEVER_UNISOLATED_CLAIM,
        code="server/kibo_ctrl/runtime/process/sandbox.py",
        find="    if why:\n        raise SandboxUnavailable(",
        replace='    if why:\n        return "none"\n        raise SandboxUnavailable(',
        tests=(f"{ROOTLESS}::test_without_bwrap_it_starts_and_each_launch_names_the_fix",),
    ),
]
