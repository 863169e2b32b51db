"""Command IDs: the idempotency key every mutating request carries in `metadata.command_id`."""

from __future__ import annotations

import re
import uuid

import grpc
from kibo.ctrl.v1 import error_pb2

from .errors import InvalidArgumentError, ReservedCommandIdError

__all__ = ["COMMAND_ID_PATTERN", "RESERVED_PREFIXES", "check_command_id", "new_command_id"]

# 1 to 128 characters from A-Z a-z 0-9 . _ ~ : / -
COMMAND_ID_PATTERN = re.compile(r"[A-Za-z0-9._~:/-]{1,128}")
# The server's own stops use these; a caller's command ID may not.
RESERVED_PREFIXES = ("guest-shutdown/", "host-memory/")


def check_command_id(command_id: str) -> str:
    """Return `command_id` if the server would accept it, else raise InvalidArgumentError
    (ReservedCommandIdError for a reserved prefix), as the server would."""
    if not COMMAND_ID_PATTERN.fullmatch(command_id):
        raise InvalidArgumentError(
            f"{command_id!r} is not a command ID: 1 to 128 characters from A-Z a-z 0-9 . _ ~ : / -",
            code=grpc.StatusCode.INVALID_ARGUMENT,
            detail=error_pb2.ErrorDetail(reason=error_pb2.ERROR_REASON_INVALID_ARGUMENT, field="command_id"),
        )
    if command_id.startswith(RESERVED_PREFIXES):
        raise ReservedCommandIdError(
            f"command IDs beginning with {' or '.join(RESERVED_PREFIXES)} are reserved for the server",
            code=grpc.StatusCode.INVALID_ARGUMENT,
            detail=error_pb2.ErrorDetail(reason=error_pb2.ERROR_REASON_RESERVED_COMMAND_ID, field="command_id"),
        )
    return command_id


def new_command_id(prefix: str = "kibotos") -> str:
    """`prefix/<random UUID>`, e.g. `example/6f1c...`. Reserved prefixes are refused."""
    prefix = prefix.rstrip("/")
    return check_command_id(f"{prefix}/{uuid.uuid4()}" if prefix else str(uuid.uuid4()))
