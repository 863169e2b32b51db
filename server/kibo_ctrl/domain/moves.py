"""What moving a workspace's disks between nodes is made of, as both sides see it: the
files (engine/moves.py asks, the nodes answer: runtime/process/image_transfer.py), and the
two ways a step can fail."""

from __future__ import annotations

from dataclasses import dataclass

# Files move in blocks of this size, aligned to it; a block of zeros is not sent (it reads
# back as zeros from a hole on the target), so sparse images move only their data.
BLOCK = 1 << 20
# The capability a node declares (NodeRecord.capabilities, from its runtime's) when the
# control plane can move its disks: a process node with disk images (over its
# NodeStorageService, or in process for the embedded one), a simulated node in the
# control plane's own process. A move needs it on both nodes.
MOVE_CAPABILITY = "storage.move"


@dataclass(frozen=True)
class StoredFile:
    # "layer", or "volume/<volume ID>".
    name: str
    # The image's apparent size (its capacity).
    size: int
    # Bytes in the blocks that are not all zeros: what a move copies.
    data_bytes: int
    # SHA-256 over (offset, block) of those blocks, in offset order: the same for a copy
    # whatever its holes' layout on the other disk.
    digest: bytes


class NodeUnreachable(Exception):
    """A node could not be asked now (down, restarting, cut off): the move waits and retries."""


class MoveRefused(Exception):
    """A node refused a step for a reason waiting will not fix (no room, a file in use, a
    layer from before images): the move fails with it."""
