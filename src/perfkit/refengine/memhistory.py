"""Allocation history and snapshot files on request boundaries (CUDA only).

On CUDA the engine calls ``torch.cuda.memory._record_memory_history`` at startup (every
allocation and free with its Python stack, bounded by ``max_entries`` trace entries; torch's
"Understanding CUDA Memory Usage" page, pytorch.org/docs/stable/torch_cuda_memory.html) and
writes ``torch.cuda.memory._dump_snapshot`` after the measured requests it was asked for. The
snapshot covers torch's caching allocator only (not NCCL's own allocations). The request's
record names its file (``perfkit.memory_snapshot``); perfkit reads it with
:mod:`perfkit.readings.memsnapshot`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

#: what the record says on a device with no caching allocator to snapshot
NOT_ON_CPU = "not available on cpu"


@dataclass
class SnapshotRecorder:
    """Dumps a snapshot after the chosen measured requests.

    Args:
        device: the serving device; off CUDA nothing is recorded and :meth:`after` says
            :data:`NOT_ON_CPU` for the chosen requests.
        after: 0-based measured request indices to snapshot after (0: the cold request).
        out_dir: where ``request-<index>.pickle`` files go.
        max_entries: trace entries kept (torch's ring buffer), which bounds the file size.
    """

    device: torch.device
    after: list[int]
    out_dir: Path
    max_entries: int = 20000

    def start(self) -> None:
        """Start recording (CUDA only). Python stacks of allocations only (``context="alloc"``,
        ``stacks="python"``): C++ symbolisation would cost seconds per dump."""
        if self.device.type != "cuda" or not self.after:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self.max_entries
        )
        log.info(
            "recording allocation history (%d entries) for snapshots after %s", self.max_entries, self.after
        )

    def after_request(self, index: int) -> dict[str, Any] | None:
        """The record's ``memory_snapshot`` entry for measured request ``index``: None when it
        was not chosen; ``{request_index, error}`` off CUDA or when the dump failed;
        ``{request_index, path, bytes, max_entries, stacks}`` once the file is written."""
        if index not in self.after:
            return None
        if self.device.type != "cuda":
            return {"request_index": index, "error": NOT_ON_CPU}
        path = self.out_dir / f"request-{index:03d}.pickle"
        try:
            torch.cuda.synchronize(self.device)
            torch.cuda.memory._dump_snapshot(str(path))
        except Exception as exc:  # noqa: BLE001 - a snapshot must never fail the request
            log.exception("memory snapshot after request %d failed", index)
            return {"request_index": index, "error": f"{type(exc).__name__}: {exc}"}
        return {
            "request_index": index,
            "path": str(path.resolve()),
            "bytes": path.stat().st_size,
            "max_entries": self.max_entries,
            "stacks": "python",
        }
