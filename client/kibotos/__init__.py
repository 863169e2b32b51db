"""kibotos: the Python SDK for kibo (sync and asyncio), a thin layer over the generated stubs.

    import kibotos

    with kibotos.Client() as client:                       # $KIBO_SERVER or 127.0.0.1:50051
        created = client.create_workspace()                 # settled: the create is terminal
        stopped = client.stop_workspace(created.workspace.workspace_id)

The Go SDK's (sdk/go) `kibotos.Settle` / `kibotos.NewCommandID` / `client.WaitWorkspace` are
`kibotos.settle` / `kibotos.new_command_id` / `client.wait_workspace` here.

A running workspace's processes and files: `client.workspace_access(workspace_id)` (its
`.processes` and `.files`; kibotos.aio_access says how).

The token: `token=`, else $KIBO_TOKEN, else a local server's admin token
(kibotos.token_discovery, the rule `kibo` follows too).
"""

from .access import Files, Processes, ProcessHandle, WorkspaceAccess
from .access_common import (
    FileChange,
    ProcessDropped,
    ProcessEvent,
    ProcessExit,
    ProcessOutput,
    ProcessReplayed,
    ProcessResult,
    TransferProgress,
    WatchEvent,
    WatchOverflow,
    WatchReady,
)
from .aio import AsyncClient
from .aio_access import AsyncFiles, AsyncProcesses, AsyncProcessHandle, AsyncWorkspaceAccess
from .client import Client
from .command_id import RESERVED_PREFIXES, check_command_id, new_command_id
from .connection import DEFAULT_ADDRESS, Connection, check_address, resolve_address
from .data_plane import ExecEvent, ExecExit, ExecOutput, ExecResult
from .errors import (
    AbortedError,
    CommandFailedError,
    CommandIdReusedError,
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    KiboError,
    KiboTimeoutError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    ReservedCommandIdError,
    ResourceExhaustedError,
    SettleTimeoutError,
    UnauthenticatedError,
    UnavailableError,
    WaitTimeoutError,
    WrongPortError,
    from_rpc_error,
)
from .settle import Backoff, CommandResponse, SettleOptions, settle, settle_async
from .states import STEADY_STATES, command_state_name, is_steady, is_terminal, state_name
from .wait import WaitOptions, WaitResult, wait, wait_async

__all__ = [
    "DEFAULT_ADDRESS",
    "RESERVED_PREFIXES",
    "STEADY_STATES",
    "AbortedError",
    "AsyncClient",
    "AsyncFiles",
    "AsyncProcessHandle",
    "AsyncProcesses",
    "AsyncWorkspaceAccess",
    "Backoff",
    "Client",
    "CommandFailedError",
    "CommandIdReusedError",
    "CommandResponse",
    "ConflictError",
    "Connection",
    "DeadlineExceededError",
    "ExecEvent",
    "ExecExit",
    "ExecOutput",
    "ExecResult",
    "FileChange",
    "Files",
    "InternalError",
    "InvalidArgumentError",
    "KiboError",
    "KiboTimeoutError",
    "NotFoundError",
    "PermissionDeniedError",
    "ProcessDropped",
    "ProcessEvent",
    "ProcessExit",
    "ProcessHandle",
    "ProcessOutput",
    "ProcessReplayed",
    "ProcessResult",
    "Processes",
    "QuotaExceededError",
    "RateLimitedError",
    "ReservedCommandIdError",
    "ResourceExhaustedError",
    "SettleOptions",
    "SettleTimeoutError",
    "TransferProgress",
    "UnauthenticatedError",
    "UnavailableError",
    "WaitOptions",
    "WaitResult",
    "WaitTimeoutError",
    "WatchEvent",
    "WatchOverflow",
    "WatchReady",
    "WorkspaceAccess",
    "WrongPortError",
    "check_address",
    "check_command_id",
    "command_state_name",
    "from_rpc_error",
    "is_steady",
    "is_terminal",
    "new_command_id",
    "resolve_address",
    "settle",
    "settle_async",
    "state_name",
    "wait",
    "wait_async",
]
