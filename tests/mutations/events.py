"""Mutations of fleet-wide events (issue 26 item 7; api/events.py): tenant scoping, another
tenant's workspace answering as a missing one, the watch cap, the bounds on a request, and a
watch's resumption (no event twice, none lost when it falls behind)."""

from tests.mutations.base import Mutation

_EVENTS = "server/kibo_ctrl/api/events.py"
_FLEET = "tests/integration/test_fleet_events.py"
_REPLICAS = "tests/integration/test_fleet_events_replicas.py"
_UNIT = "tests/unit/test_fleet_events_unit.py"
_CROSS = "tests/integration/test_cross_tenant.py"
_TENANTS = f"{_FLEET}::test_a_tenant_sees_only_its_own_events_and_an_operator_sees_every_tenants"
_BAD = f"{_FLEET}::test_bad_filters_are_invalid_argument_naming_the_field"

MUTATIONS = [
    Mutation(
        claim="ListEvents and WatchEvents show a tenant's token its own tenant's events only (an operator "
        "token's, every tenant's), on every replica",
        code=_EVENTS,
        find="tenant=None if caller.role is Role.OPERATOR else caller.tenant,",
        replace="tenant=None,",
        tests=(
            _TENANTS,
            f"{_REPLICAS}::test_a_watch_across_three_replicas_sees_every_event_in_order_and_resumes_on_another",
        ),
    ),
    Mutation(
        claim="An events filter naming another tenant's workspace is NOT_FOUND exactly as a missing one, "
        "before anything of it is read",
        code=_EVENTS,
        find="if workspace is None or (query.tenant is not None and workspace.tenant != query.tenant):",
        replace="if workspace is None:",
        tests=(
            _TENANTS,
            f"{_UNIT}::test_another_tenants_workspace_is_not_found_as_a_missing_one_and_nothing_of_it_is_read",
            f"{_CROSS}::test_another_tenants_ids_answer_exactly_like_missing_ones[grpc]",
            f"{_CROSS}::test_another_tenants_ids_answer_exactly_like_missing_ones[connect]",
        ),
    ),
    Mutation(
        claim="WatchEvents counts against its tenant's cap on open watches, with WatchWorkspace",
        code=_EVENTS,
        find="with self._watch_streams.hold(caller.tenant), self._hub.watch_events(query.tenant) as feed:",
        replace="with self._hub.watch_events(query.tenant) as feed:",
        tests=(f"{_FLEET}::test_watches_count_against_the_tenants_cap_and_in_the_gauge",),
    ),
    Mutation(
        claim="A ListEvents page holds at most 1,000 events",
        code=_EVENTS,
        find="size = validation.page_size(request.page_size, 100)",
        replace="size = request.page_size or 100",
        tests=(_BAD,),
    ),
    Mutation(
        claim="An events filter names at most 16 types",
        code=_EVENTS,
        find="if len(request.types) > MAX_TYPES:",
        replace="if False:",
        tests=(_BAD,),
    ),
    Mutation(
        claim="A ListEvents call reads a bounded number of stored events whatever its filter (a sparse "
        "filter's page ends short, with a token)",
        code=_EVENTS,
        find="if scanned >= LIST_ROWS:",
        replace="if False:",
        tests=(f"{_UNIT}::test_a_sparse_filter_reads_a_bounded_number_of_rows_a_call",),
    ),
    Mutation(
        claim="A watch sends each event once, though a commit reaches it both from the store and the hub",
        code=_EVENTS,
        find="if event.seq <= covered:",
        replace="if False:",
        tests=(f"{_UNIT}::test_a_commit_both_read_and_fed_to_a_watch_is_sent_once",),
    ),
    Mutation(
        claim="A watch that falls behind the hub reads on from the store: it loses no event",
        code=_EVENTS,
        find="if batch is Signal.RESYNC:\n                        break",
        replace="if batch is Signal.RESYNC:\n                        continue",
        tests=(f"{_UNIT}::test_a_watch_that_falls_behind_the_feed_reads_on_from_the_store",),
    ),
    Mutation(
        claim="A watch that starts during the shutdown ends at once (UNAVAILABLE), so it cannot hold the stop",
        code="server/kibo_ctrl/engine/hub.py",
        find="        if self._closed:  # started during the shutdown: ends at once, as in watch()\n",
        replace="        if False:\n",
        tests=(f"{_UNIT}::test_a_watch_open_at_the_shutdown_or_started_after_it_ends_at_once",),
    ),
    Mutation(
        claim="The SDK's watch_events goes on after its stream breaks (a server restart), after the last event "
        "it gave: none missed, none twice",
        code="client/kibotos/client.py",
        find="if not reconnect or self._closed or error.code() not in _BROKEN or breaks > 10:",
        replace="if True:",
        tests=("tests/system/test_cli_events.py::test_the_sdks_watch_goes_on_across_a_restart_of_its_server",),
    ),
]
