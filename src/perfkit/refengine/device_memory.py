"""Device memory snapshots in sglang's layout (allocated/reserved and their peaks, MiB), and
the max across CFG-parallel ranks. Shared by the server and the ranks (:mod:`.dist`)."""

from __future__ import annotations

import torch

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
