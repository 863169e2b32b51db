"""Mutations of the stream protections of issue 27 ("not yet tried"): HTTP/2 streams per
connection on the gRPC port, hypercorn's reset budget, the per-tenant cap on open watches,
and a shutdown with streams still coming in."""

from tests.mutations.base import Mutation

_STREAMS = "tests/system/test_listener_streams.py"
_UNIT = "tests/unit/test_stream_caps.py"

MUTATIONS = [
    Mutation(
        claim="The gRPC port holds at most 1,024 HTTP/2 streams per connection: a rapid reset and streams that "
        "never send their request leave the server's memory bounded",
        code="server/kibo_ctrl/app.py",
        find="            STREAMS_PER_CONNECTION,\n",
        replace="",
        tests=(
            f"{_STREAMS}::test_rapid_reset_on_the_grpc_port_is_refused_past_the_stream_limit",
            f"{_STREAMS}::test_streams_that_never_end_hold_at_most_the_limit_on_the_grpc_port",
        ),
    ),
    Mutation(
        claim="On hypercorn's h2c a client that resets streams past its connection's budget gets "
        "GOAWAY(ENHANCE_YOUR_CALM)",
        code="server/kibo_ctrl/transport/http.py",
        find="event.remote_reset and not self._budget.take():",
        replace="event.remote_reset and False:",
        tests=(f"{_STREAMS}::test_rapid_reset_on_hypercorn_gets_goaway_enhance_your_calm",),
    ),
    Mutation(
        claim="A reset budget allows a burst, then a rate",
        code="server/kibo_ctrl/transport/http.py",
        find="        if self._tokens < 1:\n            return False\n",
        replace="",
        tests=(f"{_UNIT}::test_a_reset_budget_allows_a_burst_then_a_rate",),
    ),
    Mutation(
        claim="A tenant holds at most --max-watches-per-tenant WatchWorkspace streams; the next is "
        "RESOURCE_EXHAUSTED naming the cap, other tenants unaffected",
        code="server/kibo_ctrl/api/fairness.py",
        find="        if self.per_tenant and used >= self.per_tenant:",
        replace="        if False:",
        tests=(
            f"{_STREAMS}::test_a_tenant_past_its_watch_cap_is_refused_in_words",
            f"{_STREAMS}::test_many_watches_on_one_channel_are_answered_at_once",
            f"{_UNIT}::test_a_tenant_past_its_cap_is_refused_and_others_are_not",
        ),
    ),
    Mutation(
        claim="WatchWorkspace counts against its tenant's cap",
        code="server/kibo_ctrl/api/control_plane.py",
        find="with self.watch_streams.hold(caller.tenant), self._hub.watch(workspace_id) as changes:",
        replace="with self._hub.watch(workspace_id) as changes:",
        tests=(f"{_STREAMS}::test_a_tenant_past_its_watch_cap_is_refused_in_words",),
    ),
    Mutation(
        claim="A watch gives its place under the cap back however it ends (cancel, disconnect, error)",
        code="server/kibo_ctrl/api/fairness.py",
        find="            left = self._open[tenant] - 1\n",
        replace="            left = self._open[tenant]\n",
        tests=(
            f"{_STREAMS}::test_watches_that_fail_or_disconnect_give_their_place_back",
            f"{_UNIT}::test_a_stream_that_fails_gives_its_place_back",
        ),
    ),
    Mutation(
        claim="A watch that starts during the shutdown ends at once (UNAVAILABLE), so it cannot hold the stop",
        code="server/kibo_ctrl/engine/hub.py",
        find="        if self._closed:\n",
        replace="        if False:\n",
        tests=(
            f"{_STREAMS}::test_a_server_stops_while_a_channel_queues_streams_past_hypercorns_limit",
            f"{_UNIT}::test_a_watch_that_starts_after_the_hub_closed_ends_at_once",
        ),
    ),
    Mutation(
        claim="The HTTP listener's stop is bounded: hypercorn's task is cancelled again past its graceful timeout",
        code="server/kibo_ctrl/transport/http.py",
        find="                self._task.cancel()\n            with",
        replace="                await self._task\n            with",
        tests=(f"{_STREAMS}::test_a_server_stops_while_a_channel_queues_streams_past_hypercorns_limit",),
    ),
]
