"""A tiny binding to libnftables (nftables' own library, Debian package `nftables`).

Why ctypes and not the `nft` command: a guest's create, a policy change and each allowed DNS
answer run an nft transaction; in process that costs well under a millisecond more than the
kernel's work, an exec of `nft` ~5 ms. There is no PyPI binding (the Python module Debian
ships with nftables is this same ctypes wrapper). One context per `Nft`, guarded by a lock:
libnftables contexts are not thread-safe, and the resolver's thread uses it too.

A buffer of commands runs as ONE transaction: all of it applies, or none (then `NftError`
with nftables' message)."""

from __future__ import annotations

import ctypes
import threading

LIBRARY = "libnftables.so.1"
NFT_CTX_DEFAULT = 0
NFT_CTX_OUTPUT_JSON = 1 << 4


class NftError(RuntimeError):
    """A transaction nftables refused (nothing of it applied)."""


class NftUnavailable(RuntimeError):
    """libnftables is not installed (examples/setup.sh installs `nftables`)."""


class Nft:
    """One libnftables context; `run` is serialized."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(LIBRARY, use_errno=True)
        except OSError as error:
            raise NftUnavailable(f"{LIBRARY} is missing ({error}): install the nftables package") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        self._lib = lib
        self._lock = threading.Lock()
        self._ctx = lib.nft_ctx_new(NFT_CTX_DEFAULT)
        if not self._ctx:
            raise NftUnavailable("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)

    def run(self, commands: str) -> str:
        """Run `commands` (nft syntax, one per line) as one transaction; its output."""
        with self._lock:
            if not self._ctx:
                raise NftError("the nftables context is closed")
            code = self._lib.nft_run_cmd_from_buffer(self._ctx, commands.encode())
            output = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
            error = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
        if code != 0:
            raise NftError(error.strip() or f"nft failed ({code})")
        return output

    def close(self) -> None:
        with self._lock:
            if self._ctx:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None
