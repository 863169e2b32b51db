"""Mutations of the exposure listener's protections (transport/exposure_proxy.py, issue 28):
the token kept from the guest, the revocation cut, the query token checked before its cookie is
set, the head bound, the header timeout and the connection caps."""

from tests.mutations.base import Mutation

_CODE = "server/kibo_ctrl/transport/exposure_proxy.py"
_TESTS = "tests/unit/test_exposure_proxy.py"

MUTATIONS = [
    Mutation(
        claim="An exposure's token header never reaches the guest: it is stripped from the request head",
        code=_CODE,
        find="        if lower == TOKEN_HEADER:\n            continue\n",
        replace="        if lower == TOKEN_HEADER:\n            pass\n",
        tests=(f"{_TESTS}::test_the_token_header_and_cookie_are_not_forwarded_upstream",),
    ),
    Mutation(
        claim="An exposure's token cookie never reaches the guest; the other cookies do, as sent",
        code=_CODE,
        find='b"; ".join(others)',
        replace='b"; ".join(cookies)',
        tests=(f"{_TESTS}::test_the_token_header_and_cookie_are_not_forwarded_upstream",),
    ),
    Mutation(
        claim="Later requests on a keep-alive exposure connection are rewritten like the first (no token upstream)",
        code=_CODE,
        find="            out += rewrite_head(request)\n",
        replace="            out += head\n",
        tests=(f"{_TESTS}::test_the_token_header_and_cookie_are_not_forwarded_upstream",),
    ),
    Mutation(
        claim="When an exposure ends, its open connections (a WebSocket, a download) are cut at once",
        code=_CODE,
        find="cut = asyncio.create_task(self._revoked.wait())",
        replace="cut = asyncio.create_task(asyncio.Event().wait())",
        tests=(f"{_TESTS}::test_revocation_cuts_an_open_websocket_and_a_download",),
    ),
    Mutation(
        claim="A token in the URL is checked before the proxy sets it as a cookie (a bad one is 401, no cookie)",
        code=_CODE,
        find="            await self._route(host, token)\n",
        replace="",
        tests=(f"{_TESTS}::test_a_token_by_cookie_and_by_query_with_a_redirect_that_sets_the_cookie",),
    ),
    Mutation(
        claim="An exposure request head over 16 KiB is answered 431 and the connection closed",
        code=_CODE,
        find="            if len(buffer) > max_head:\n",
        replace="            if len(buffer) > 64 * max_head:\n",
        tests=(f"{_TESTS}::test_a_head_over_16_kib_is_431_and_closed",),
    ),
    Mutation(
        claim="A client that does not finish its first request head within the header timeout is cut (408)",
        code=_CODE,
        find="async with asyncio.timeout(self._limits.header_timeout_s):\n                    head =",
        replace="async with asyncio.timeout(None):\n                    head =",
        tests=(f"{_TESTS}::test_a_client_that_never_sends_its_head_is_cut_after_the_timeout",),
    ),
    Mutation(
        claim="The exposure listener holds at most its cap of connections: 1,000 idle ones do not grow memory",
        code=_CODE,
        find="listen(host, port, self._limits.caps())",
        replace="listen(host, port, ConnectionCaps(1 << 30, 1 << 30))",
        tests=(f"{_TESTS}::test_a_thousand_idle_connections_are_held_within_the_cap",),
    ),
]
