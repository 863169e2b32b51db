"""Mutations of the guest processes' node hop (issue 29: NodeGuestService.CallGuestProcesses
and FollowGuestProcess, served by a node agent, called by the control plane's RemoteGuests):
only the control plane's secret opens them; what a caller sends is bounded and typed before
the node's runtime sees it; a foreground start's follower is held across the hop; leaving a
follower closes the node's."""

from tests.mutations.base import Mutation

_UNIT = "tests/unit/test_node_guest_hop.py"
_SYSTEM = "tests/system/test_guest_processes_node.py"
_NO_SECRET = f"{_UNIT}::test_a_caller_without_the_secret_is_refused_before_the_runtime_is_asked"
_NODE_GUARD = f"{_SYSTEM}::test_the_nodes_hop_refuses_a_caller_without_the_secret_and_hostile_arguments"


def _hostile(*names: str) -> tuple[str, ...]:
    return tuple(f"{_UNIT}::test_hostile_arguments_are_invalid_and_never_reach_the_runtime[{name}]" for name in names)


def _hostile_selector(*names: str) -> tuple[str, ...]:
    return tuple(f"{_UNIT}::test_a_hostile_selector_is_invalid_and_never_reaches_the_runtime[{name}]" for name in names)


MUTATIONS = [
    Mutation(
        claim="A node's CallGuestProcesses takes only the control plane's secret",
        code="server/kibo_ctrl/routes.py",
        find="                guests.call_guest_processes,\n",
        replace="                guests.call_guest_processes,\n                credential=True,\n",
        tests=(_NO_SECRET, _NODE_GUARD),
    ),
    Mutation(
        claim="A node's FollowGuestProcess takes only the control plane's secret",
        code="server/kibo_ctrl/routes.py",
        find="                guests.follow_guest_process,\n",
        replace="                guests.follow_guest_process,\n                credential=True,\n",
        tests=(_NO_SECRET, _NODE_GUARD),
    ),
    Mutation(
        claim=(
            "A guest-process operation's bytes on a node's hop are bounded (2 MiB, an upload's part; none for "
            "an operation that takes none) before the node's runtime is asked"
        ),
        code="server/kibo_ctrl/api/node_guest_api.py",
        find="        if len(request.data) > (MAX_DATA_BYTES if takes_data else 0):",
        replace="        if False:",
        tests=(*_hostile("input-too-big", "data-for-signal"), _NODE_GUARD),
    ),
    Mutation(
        claim="A guest-process operation's arguments on a node's hop are bounded (2 MiB of JSON)",
        code="server/kibo_ctrl/api/node_guest_api.py",
        find="        if len(request.arguments) > MAX_ARGUMENTS_BYTES:",
        replace="        if False:",
        tests=(*_hostile("arguments-too-big"), _NODE_GUARD),
    ),
    Mutation(
        claim="An instance ID on a node's guest-process hop is 1 to 256 characters, checked before any lookup",
        code="server/kibo_ctrl/api/node_guest_api.py",
        find=(
            "def _instance_id(instance_id: str) -> str:\n    if not instance_id or len(instance_id) > MAX_INSTANCE_ID:"
        ),
        replace="def _instance_id(instance_id: str) -> str:\n    if False:",
        tests=(*_hostile("no-instance", "long-instance"), *_hostile_selector("long-instance")),
    ),
    Mutation(
        claim="JSON nested deeper than the decoder follows is INVALID_ARGUMENT on a node's hop, not an internal error",
        code="server/kibo_ctrl/api/node_guest_api.py",
        find=(
            "    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as error:\n"
            '        raise InvalidArgument(f"{field}'
        ),
        replace=(
            "    except (msgspec.ValidationError, msgspec.DecodeError) as error:\n"
            '        raise InvalidArgument(f"{field}'
        ),
        tests=(*_hostile("deep-job"), _NODE_GUARD),
    ),
    Mutation(
        claim="A process on a node's hop is named by its pid or its tag, exactly one",
        code="server/kibo_ctrl/api/node_guest_api.py",
        find="        if (self.pid is None) == (self.tag is None):",
        replace="        if False:",
        tests=(*_hostile("pid-and-tag", "neither"), *_hostile_selector("pid-and-tag", "neither")),
    ),
    Mutation(
        claim="A process start on a node's hop carries no NUL in its argv, env, cwd, user or tag",
        code="server/kibo_ctrl/api/node_guest_api.py",
        find='        if any("\\0" in text for text in texts):',
        replace="        if False:",
        tests=_hostile("nul-in-argv", "nul-in-env"),
    ),
    Mutation(
        claim=(
            "A foreground start on a remote node is held end to end: a client that stops reading stops the "
            "guest's writer, and nothing is dropped"
        ),
        code="server/kibo_ctrl/transport/node_guest_client.py",
        find="FollowSelection(*_selection(selector), hold=hold)",
        replace="FollowSelection(*_selection(selector), hold=False)",
        tests=(
            f"{_UNIT}::test_a_follower_gets_output_dropped_and_exit_with_replay_and_hold_passed",
            f"{_SYSTEM}::test_a_foreground_client_that_stops_reading_stops_the_guest_and_loses_nothing",
        ),
    ),
    Mutation(
        claim="Leaving a remote process's follower closes the node's follower at once (the process runs on)",
        code="server/kibo_ctrl/transport/node_guest_client.py",
        find="            call.cancel()  # at once, not at garbage collection: the node's follower is closed\n",
        replace="            pass\n",
        tests=(f"{_UNIT}::test_a_held_follower_stops_the_output_while_its_consumer_does_not_read",),
    ),
]
