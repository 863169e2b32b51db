"""kibo control plane: the lifecycle engine and API server for workspaces."""

__version__ = "0.1.0"
