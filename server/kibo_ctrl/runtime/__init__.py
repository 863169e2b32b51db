"""Runtimes: the only code that touches a sandbox. The engine sees the Runtime protocol."""

from .base import DestroyError, LaunchError, LaunchSpec, RestartError, Runtime, SyncError

__all__ = ["DestroyError", "LaunchError", "LaunchSpec", "RestartError", "Runtime", "SyncError"]
