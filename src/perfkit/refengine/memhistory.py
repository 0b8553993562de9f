"""Device memory: snapshots in sglang's layout (allocated/reserved and their peaks, MiB; the max
across CFG-parallel ranks) and allocator snapshot files on request boundaries (CUDA only; see
docs/below-the-stage.md, "How allocator snapshots are taken and read").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def snapshot(device: torch.device) -> dict[str, float] | None:
    """checkpoint fields (MiB) of ``device``; None off CUDA (no device memory to report)."""
    if device.type != "cuda":
        return None
    return {
        "allocated_mb": round(torch.cuda.memory_allocated(device) / MIB, 2),
        "reserved_mb": round(torch.cuda.memory_reserved(device) / MIB, 2),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated(device) / MIB, 2),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved(device) / MIB, 2),
    }


def max_snapshots(per_rank: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Checkpoint -> field -> max across ranks (sglang reports the max of memory across ranks)."""
    out: dict[str, dict[str, float]] = {}
    for snaps in per_rank:
        for ck, vals in (snaps or {}).items():
            if not vals:
                continue
            cur = out.setdefault(ck, {})
            for k, v in vals.items():
                if v is not None and (k not in cur or v > cur[k]):
                    cur[k] = v
    return out


#: what the record says on a device with no caching allocator to snapshot
NOT_ON_CPU = "not available on cpu"


@dataclass
class SnapshotRecorder:
    """Dumps a snapshot after the chosen measured requests.

    Args:
        device: the serving device; off CUDA nothing is recorded and :meth:`after_request` says
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
