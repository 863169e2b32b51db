"""Mutations of the clients' side of exposures and the richer network policy (issue 28, part E):
the CLI's usage errors for what the server refuses (so a user learns before a round trip), and
the SDKs' keeping of an exposure's token, which only one answer carries."""

from tests.mutations.base import Mutation

_CONFIG = "client/kibo_cli/workspace_config.py"
_EXPOSURES = "client/kibo_cli/exposures.py"
_CLI = "tests/system/test_cli_exposures.py"
_USAGE = f"{_CLI}::test_usage_errors_exit_2_before_any_round_trip"
_TOKEN = "tests/unit/test_sdk_exposure_token.py"

MUTATIONS = [
    Mutation(
        claim="kibo workspace network-policy refuses denied CIDRs or domains with deny-all as a usage error "
        "(exit 2), before any call",
        code=_CONFIG,
        find="if denying and chosen is Egress.deny_all:",
        replace="if False:",
        tests=(f"{_USAGE}[deny-cidr-with-deny-all]", f"{_USAGE}[deny-domain-with-deny-all]"),
    ),
    Mutation(
        claim="kibo workspace network-policy refuses allowed domains or ports without allow-listed as a usage "
        "error (exit 2), before any call",
        code=_CONFIG,
        find="if allowing and chosen is not Egress.allow_listed:",
        replace="if False:",
        tests=(
            f"{_USAGE}[allow-domain-with-allow-all]",
            f"{_USAGE}[port-with-allow-all]",
            f"{_USAGE}[port-with-deny-all]",
        ),
    ),
    Mutation(
        claim="kibo workspace expose --expire-in outside 1 s to 366 days is a usage error (exit 2), before any call",
        code=_EXPOSURES,
        find="if not 1 <= math.ceil(seconds) <= MAX_EXPIRE_SECONDS:",
        replace="if False:",
        tests=(f"{_USAGE}[expire-in-0s]", f"{_USAGE}[expire-in-367d]"),
    ),
    Mutation(
        claim="kibotos.AsyncClient.create_workspace_exposure keeps the token of the answer that carried it "
        "while settling (a resend's answer has none)",
        code="client/kibotos/aio.py",
        find="                tokens[exposure.exposure_id] = exposure.token",
        replace="                pass",
        tests=(f"{_TOKEN}::test_the_async_client_keeps_the_token_of_an_earlier_answer",),
    ),
    Mutation(
        claim="kibotos.Client.create_workspace_exposure keeps the token of the answer that carried it "
        "while settling (a resend's answer has none)",
        code="client/kibotos/client.py",
        find="                tokens[exposure.exposure_id] = exposure.token",
        replace="                pass",
        tests=(f"{_TOKEN}::test_the_blocking_client_keeps_the_token_of_an_earlier_answer",),
    ),
]
