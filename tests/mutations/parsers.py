"""Mutations of the request parsers (issue 27, items 3 and 7, and hostile bodies, page tokens
and command IDs): each protection removed must fail the test that proves it."""

from tests.mutations.base import Mutation

_VALIDATION = "server/kibo_ctrl/domain/validation.py"
_PARSE = "server/kibo_ctrl/api/parse.py"
_CONTROL_PLANE = "server/kibo_ctrl/api/control_plane.py"
_CONNECT = "server/kibo_ctrl/transport/connect.py"
_COST = "tests/unit/test_parser_cost.py"
_UNIT = "tests/unit/test_validation_unit.py"
_PARSERS = "tests/integration/test_parsers.py"
_BODIES = f"{_PARSERS}::test_deep_and_large_json_and_grpc_web_bodies_are_refused_cleanly"
_LABELS = f"{_PARSERS}::test_labels_with_control_characters_are_refused_and_nothing_is_stored"
_TOKENS = f"{_PARSERS}::test_tampered_page_tokens_are_invalid_argument_and_never_show_another_tenants_rows"
_COMMAND_IDS = f"{_PARSERS}::test_the_same_command_id_in_two_tenants_is_two_commands"

_LINEAR = "Every parser of request fields costs, on its worst input, about what a valid input of that size costs"
_QUOTE = "An error message quotes at most 64 characters of a request's value"
_LABEL_SYNTAX = "Labels follow Kubernetes' syntax: no control character, space or quote can be stored in one"
_SHOWN_ESCAPED = "kibo text output and the server's text log show control characters escaped"
_PAGE_TOKENS = "Page tokens are bound to the tenant and the query that made them"
_JSON = "A Connect JSON body of over 100,000 values is refused before it is parsed"
_NOTHING_LEFT = "A refused request leaves nothing behind in the server's memory"

MUTATIONS = [
    Mutation(
        claim=_LINEAR,
        code=_VALIDATION,
        # The split the filter parser had: \s+ tried from every position of a run of spaces.
        find="    tokens = _Tokens(text)\n",
        replace='    re.split(r"\\s+AND\\s+", text.strip())\n    tokens = _Tokens(text)\n',
        tests=(f"{_COST}::test_the_filter_parser_is_linear",),
    ),
    Mutation(
        claim=_LINEAR,
        code=_VALIDATION,
        find="        if len(values) > bound:\n",
        replace="        if False:\n",
        tests=(f"{_COST}::test_create_and_set_labels_are_linear",),
    ),
    Mutation(
        claim=_LINEAR,
        code=_PARSE,
        # Copying a 300,000-entry map before its size is checked.
        find='labels=validation.label_map(request.labels, "labels"),',
        replace='labels=validation.label_map(dict(request.labels), "labels"),',
        tests=(f"{_COST}::test_create_and_set_labels_are_linear",),
    ),
    Mutation(
        claim=_QUOTE,
        code=_VALIDATION,
        find='    return repr(value[:limit]) + ("…" if len(value) > limit else "")',
        replace="    return repr(value)",
        tests=(
            f"{_PARSERS}::test_a_4kib_bad_filter_is_invalid_argument_quoting_a_short_prefix[grpc-long-term]",
            f"{_UNIT}::test_filter_errors_quote_a_short_prefix",
        ),
    ),
    Mutation(
        claim=_QUOTE,
        code="server/kibo_ctrl/transport/errors.py",
        find="message=_bounded(error.message)",
        replace="message=error.message",
        tests=(f"{_UNIT}::test_a_status_message_is_bounded_whatever_quotes_it",),
    ),
    Mutation(
        claim=_QUOTE,
        code="server/kibo_ctrl/api/data_plane.py",
        find='workspace_id = validation.resource_id(request.workspace_id, "workspace_id", "ws-")',
        replace="workspace_id = request.workspace_id",
        tests=(f"{_PARSERS}::test_a_huge_workspace_id_for_a_credential_is_invalid_argument",),
    ),
    Mutation(
        claim=_LABEL_SYNTAX,
        code=_VALIDATION,
        # The rule before issue 27: any value of at most 256 characters.
        find='    return value == "" or (len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(value) is not None)',
        replace="    return len(value) <= 256",
        tests=(_LABELS, f"{_UNIT}::test_invalid_label_values"),
    ),
    Mutation(
        claim=_LABEL_SYNTAX,
        code=_VALIDATION,
        find='    if slash and not all(_DNS_LABEL.fullmatch(part) for part in prefix.split(".")):',
        replace="    if False:",
        tests=(_LABELS,),
    ),
    Mutation(
        claim=_SHOWN_ESCAPED,
        code="client/kibo_cli/output.py",
        find='    if text.isprintable():\n        return text\n    return "".join(repr(c)[1:-1] if c in _BIDI',
        replace='    if True:\n        return text\n    return "".join(repr(c)[1:-1] if c in _BIDI',
        tests=(
            "tests/system/test_cli_escaping.py::test_annotations_are_shown_escaped[get]",
            "tests/system/test_cli_escaping.py::test_annotations_are_shown_escaped[labels]",
        ),
    ),
    Mutation(
        claim=_SHOWN_ESCAPED,
        code="server/kibo_ctrl/telemetry/logs.py",
        find="    if text.isprintable():\n        return text\n",
        replace="    if True:\n        return text\n",
        tests=(
            "tests/unit/test_log_escaping.py::test_a_text_line_is_one_line_with_its_control_characters_escaped",
            "tests/unit/test_log_escaping.py::test_a_traceback_keeps_its_lines_and_escapes_the_rest",
        ),
    ),
    Mutation(
        claim=_PAGE_TOKENS,
        code=_CONTROL_PLANE,
        find='scope = _digest(f"{caller.tenant}|{request.include_deleted}|{request.filter}")',
        replace='scope = _digest(f"{request.include_deleted}|{request.filter}")',
        tests=(_TOKENS,),
    ),
    Mutation(
        claim=_PAGE_TOKENS,
        code=_CONTROL_PLANE,
        find="    if type(after) is not int or not 0 <= after <= MAX_SEQ:",
        replace="    if False:",
        tests=(_TOKENS,),
    ),
    Mutation(
        claim="Command IDs are per tenant: the same ID in two tenants is two commands",
        code="server/kibo_ctrl/domain/model.py",
        find='    return f"{tenant}\\x00{command_id}"',
        replace="    return command_id",
        tests=(_COMMAND_IDS,),
    ),
    Mutation(
        claim="Command IDs are per tenant: the same ID in two tenants is two commands",
        code="server/kibo_ctrl/store/sqlite.py",
        find='"SELECT data FROM commands WHERE tenant = ? AND id = ?"',
        replace='"SELECT data FROM commands WHERE (tenant = ? OR 1) AND id = ?"',
        tests=(_COMMAND_IDS,),
    ),
    Mutation(
        claim=_JSON,
        code=_CONNECT,
        find='        if body.count(b",") + body.count(b"[") + body.count(b"{") > MAX_JSON_VALUES:',
        replace="        if False:",
        tests=(f"{_COST}::test_connect_json_bodies_are_linear",),
    ),
    Mutation(
        claim=_NOTHING_LEFT,
        code=_CONNECT,
        find="            interceptors=(ForgetTracebacks(),),",
        replace="            interceptors=(),",
        tests=(_BODIES,),
    ),
    Mutation(
        claim=_NOTHING_LEFT,
        code="server/kibo_ctrl/transport/grpc.py",
        find="            del raw\n            forget_traceback(error)\n",
        replace="",
        tests=(_BODIES,),
    ),
    Mutation(
        claim="A gRPC-Web body over the message limit gets its RESOURCE_EXHAUSTED, not a connection reset",
        code="server/kibo_ctrl/transport/http_guard.py",
        find="            await self._drain()\n",
        replace="            pass\n",
        tests=(_BODIES,),
    ),
]
