"""Per-request torch.profiler traces with sglang's diffusion profiling API (``profile``,
``num_profiled_timesteps``, ``profile_all_stages``; sglang's ``runtime/utils/profiler.py``
``SGLDiffusionProfiler``, read for the semantics, no code copied): modes, file names, directory
and ranges as sglang 0.5.23 writes them. See docs/below-the-stage.md, "How traces are taken and
read".
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager

import torch

log = logging.getLogger(__name__)

#: sglang's default number of profiled denoising steps (after one warm-up step)
DEFAULT_PROFILED_STEPS = 5
#: the most ``num_profiled_timesteps`` a request may ask for (diffusers' LTX defaults to 50 steps;
#: sglang takes any int)
MAX_PROFILED_STEPS = 1000
#: the warm-up steps sglang's schedule runs under the profiler and discards; sglang adds as
#: many to the active (recorded) steps (``runtime/utils/profiler.py``)
WARMUP_STEPS = 1
#: stage -> the name sglang 0.5.23 registers it under (Wan's ``pipelines/wan_pipeline.py``, the
#: standard helpers of ``composed_pipeline_base.py``); other stages: the class name. Ranges are
#: ``STAGE <registered name>``
REGISTERED_NAMES = {"DenoisingStage": "denoising_stage", "DecodingStage": "decoding_stage"}
#: directory variables, in the order sglang reads them; then ``./logs``
DIR_VARIABLES = ("SGLANG_DIFFUSION_TORCH_PROFILER_DIR", "SGLANG_TORCH_PROFILER_DIR")
DEFAULT_DIR = "./logs"
#: the range the test-only injected slowdown runs in (``--debug-stage-delay``)
INJECTED_RANGE = "perfkit::debug_stage_delay"


def trace_dir(environ: dict[str, str] | None = None) -> Path:
    """Where traces go: ``SGLANG_DIFFUSION_TORCH_PROFILER_DIR``, else ``SGLANG_TORCH_PROFILER_DIR``,
    else ``./logs`` (sglang's order; an empty variable counts as unset)."""
    env = os.environ if environ is None else environ
    return Path(next((env[name] for name in DIR_VARIABLES if env.get(name)), DEFAULT_DIR))


def profile_mode(all_stages: bool, num_profiled_timesteps: int | None, num_inference_steps: int) -> str:
    """sglang's mode id, spaces as underscores: ``full_stages`` or ``{N}_steps`` (N: the asked
    steps, default 5, ``-1`` -> ``num_inference_steps``).

    Raises:
        ValueError: ``num_profiled_timesteps`` is 0 or below -1.
    """
    if all_stages:
        return "full_stages"
    return f"{profiled_steps(num_profiled_timesteps, num_inference_steps)}_steps"


def profiled_steps(num_profiled_timesteps: int | None, num_inference_steps: int) -> int:
    """Steps to record: the request's ``num_profiled_timesteps`` (None: 5; -1: every step).

    Raises:
        ValueError: 0, below -1 or above :data:`MAX_PROFILED_STEPS` (names the field).
    """
    n = DEFAULT_PROFILED_STEPS if num_profiled_timesteps is None else num_profiled_timesteps
    if n == -1:
        return num_inference_steps
    if n < 1 or n > MAX_PROFILED_STEPS:
        raise ValueError(
            f"num_profiled_timesteps: must be -1 (all steps) or between 1 and {MAX_PROFILED_STEPS}, got {n}"
        )
    return n


@dataclass
class TraceInfo:
    """What one profiled request left: ``mode``, absolute ``path``, ``size_bytes``,
    ``steps_recorded`` (``N_steps``: the ``ProfilerStep`` ranges, N+1 or fewer; ``full_stages``:
    the denoising steps), ``error`` (why no trace was written, else None)."""

    mode: str
    path: str | None
    size_bytes: int | None
    steps_recorded: int
    error: str | None = None


class RequestProfiler:
    """torch.profiler around one request, with sglang's modes and file name (:attr:`file_name`).
    ``all_stages`` and ``num_profiled_timesteps`` (None: 5, -1: all): sglang's request fields;
    ``directory``: default :func:`trace_dir`; ``cuda``: add CUDA activities (default: whether
    torch sees a GPU)."""

    def __init__(
        self,
        request_id: str,
        all_stages: bool,
        num_profiled_timesteps: int | None,
        num_inference_steps: int,
        directory: Path | None = None,
        rank: int = 0,
        cuda: bool | None = None,
    ):
        self.request_id = request_id
        self.all_stages = bool(all_stages)
        self.mode = profile_mode(self.all_stages, num_profiled_timesteps, num_inference_steps)
        self.directory = Path(directory) if directory is not None else trace_dir()
        self.rank = rank
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() if cuda is None else cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        kw: dict[str, Any] = {"activities": acts, "record_shapes": True, "with_stack": True}
        self._active = 0
        if not self.all_stages:
            self._active = profiled_steps(num_profiled_timesteps, num_inference_steps) + WARMUP_STEPS
            kw["schedule"] = torch.profiler.schedule(
                wait=0, warmup=WARMUP_STEPS, active=self._active, repeat=1, skip_first=0
            )
        self._active_left = self._active
        self._prof = torch.profiler.profile(**kw)
        self.steps_recorded = 0
        self._stopped = False
        self._prof.start()
        log.info("profiling request %s (%s) into %s", request_id, self.mode, self.directory)

    @property
    def file_name(self) -> str:
        """``{request_id}-{mode}-global-rank{rank}.trace.json.gz`` (sglang's name)."""
        return f"{self.request_id}-{self.mode}-global-rank{self.rank}.trace.json.gz"

    def denoising_step_done(self) -> None:
        """After one denoising step (sglang's ``step_denoising_step``): ``N_steps`` advances the
        schedule while ``N+1`` active steps are left, then stops the profiler; ``full_stages``
        only counts."""
        if self.all_stages:
            self.steps_recorded += 1
            return
        if self._stopped:
            return
        if self._active_left >= 0:
            self._prof.step()
            self._active_left -= 1
            self.steps_recorded = min(self._active - self._active_left, self._active)
        else:
            self._stopped = True
            self._prof.stop()

    def finish(self) -> TraceInfo:
        """Stop and write the gzipped Chrome trace. Never raises: a failure to write is the
        returned :attr:`TraceInfo.error` (the request itself stands)."""
        try:
            if not self._stopped:
                self._stopped = True
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self._prof.stop()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = (self.directory / self.file_name).resolve()
            self._prof.export_chrome_trace(str(path))  # .gz: torch writes it gzipped
            size = path.stat().st_size
            log.info("saved profiler trace of %s to %s (%d bytes)", self.request_id, path, size)
            return TraceInfo(self.mode, str(path), size, self.steps_recorded)
        except Exception as exc:  # noqa: BLE001 - a trace that cannot be written must not fail the request
            log.exception("could not write the profiler trace of %s", self.request_id)
            return TraceInfo(self.mode, None, None, self.steps_recorded, f"{type(exc).__name__}: {exc}")


def maybe_range(profiler: RequestProfiler | None, name: str) -> ContextManager[Any]:
    """``record_function(name)`` while a request is profiled, else nothing (no cost)."""
    return torch.profiler.record_function(name) if profiler is not None else nullcontext()
