"""kibo control plane: the lifecycle engine and API server for workspaces."""

import os

# The server (and the tests that drive it) start subprocesses while grpc's threads run; grpc
# core's fork handlers can then abort a child between fork and exec ("epoll_wait error: Bad
# file descriptor", grpc/grpc#43055). Nothing here uses grpc in a forked child: turn them off
# before grpc is imported (an explicit setting in the environment wins).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
