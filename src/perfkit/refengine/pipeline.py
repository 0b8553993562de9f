"""The staged LTX-Video pipeline: sglang's stage names, each stage's and step's time (ms) and peak
memory (MiB), and the test-only injected slowdown (docs/refengine.md, "Pipeline and timing")."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from perfkit.common.frames import align_frames, latent_frames
from perfkit.refengine.jobs import GenRequest, RunResult, StageResult
from perfkit.refengine.models import Components, ltx_pipeline
from perfkit.refengine.profiling import (
    INJECTED_RANGE,
    MIB,
    REGISTERED_NAMES,
    CompileWatch,
    RequestProfiler,
    maybe_range,
)


class StagedPipeline:
    """Runs LTX-Video requests stage by stage on one device, over placed components.
    ``cfg_parallel``: this rank's :class:`~perfkit.refengine.dist.CfgParallel` (None: one process
    computes both guidance branches as a batch)."""

    def __init__(
        self,
        comps: Components,
        device: torch.device,
        dtype: torch.dtype,
        two_stage: bool = False,
        refine_steps: int = 2,
        compile_watch: CompileWatch | None = None,
        cfg_parallel: Any = None,
    ):
        self.c = comps
        self.device = device
        self.dtype = dtype
        self.two_stage = two_stage
        self.refine_steps = refine_steps
        self.watch = compile_watch
        self.pipe = ltx_pipeline(comps)
        self.pipe.set_progress_bar_config(disable=True)
        self.temporal = self.pipe.vae_temporal_compression_ratio
        self.spatial = self.pipe.vae_spatial_compression_ratio
        self.is_cuda = device.type == "cuda"
        self._one_step_sched = None
        self.cfg_parallel = cfg_parallel
        #: test-only ``--debug-stage-delay``: stage -> fraction of its own work added (``slow=True`` runs)
        self.stage_delay: dict[str, float] = {}
        self._inj_est: dict[str, float] = {}  # CUDA injection: ms estimate per stage
        self._sleep_cpms: float | None = None
        self.profiler: RequestProfiler | None = None

    def _sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def _clock(self) -> float:
        """The clock sizing the injected slowdown (s): wall time on CUDA, else this thread's CPU time."""
        return time.perf_counter() if self.is_cuda else time.thread_time()

    def _busy(self, seconds: float) -> None:
        """CPU device: busy compute (small matmuls) for ``seconds`` of :meth:`_clock`."""
        if seconds <= 0:
            return
        a = torch.randn(64, 64, device=self.device)
        end = self._clock() + seconds
        while self._clock() < end:  # ~20 µs a turn on a CPU core: overshoot stays small
            a = torch.tanh(a @ a)

    def _mark(self) -> Any:
        """Start of a piece the slowdown is sized by: a CUDA event, else :meth:`_clock`."""
        return self._event() if self.is_cuda else self._clock()

    def _cycles_per_ms(self) -> float:
        """GPU cycles per ms of ``torch.cuda._sleep``, measured once per process with events."""
        if self._sleep_cpms is None:
            for _ in range(2):  # the first run pays the kernel's first launch
                self._sync()
                a = self._event()
                torch.cuda._sleep(10_000_000)
                b = self._event()
                b.synchronize()
                self._sleep_cpms = 10_000_000 / max(a.elapsed_time(b), 1e-3)
        return self._sleep_cpms

    def _inject(self, frac: float, mark: Any, stage: str) -> None:
        """Stretch the work since ``mark`` (:meth:`_mark`) by ``frac`` (docs/refengine.md)."""
        if frac <= 0:
            return
        if not self.is_cuda:
            c1 = self._clock()
            w1 = time.perf_counter()
            with maybe_range(self.profiler, INJECTED_RANGE):
                self._busy(frac * (c1 - mark))
            acc = self._run.injected.setdefault(stage, [0.0, 0.0])
            acc[0] += (c1 - mark) * 1000.0
            acc[1] += (self._clock() - c1) * 1000.0
            wall = self._run.injected_wall
            wall[stage] = wall.get(stage, 0.0) + (time.perf_counter() - w1) * 1000.0
            return
        e1 = self._event()
        done = (a.elapsed_time(b) for st, a, b, *_ in reversed(self._inj_pieces) if st == stage and b.query())
        est = next(done, self._inj_est.get(stage))
        if est is None:
            e1.synchronize()
            est = mark.elapsed_time(e1)
        self._inj_est[stage] = est
        cycles = int(frac * est * self._cycles_per_ms())
        b0 = self._event()
        if cycles > 0:
            with maybe_range(self.profiler, INJECTED_RANGE):
                torch.cuda._sleep(cycles)
        self._inj_pieces.append((stage, mark, e1, b0, self._event()))

    def _event(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @contextmanager
    def _stage(self, name: str, out: RunResult, timing: bool | str) -> Iterator[None]:
        """Time one stage (``timing``: "events", "sync" or falsy) and its peak memory."""
        if self.watch is not None:
            self.watch.stage = name
        events = timing == "events" and self.is_cuda
        if timing:
            if not events:
                self._sync()
            if self.is_cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        mark = self._mark() if self._slow.get(name, 0.0) > 0 else None
        w0 = time.time()
        e0 = self._event() if events else None
        try:
            with maybe_range(self.profiler, f"STAGE {REGISTERED_NAMES.get(name, name)}"):
                yield
                # a stage with denoising steps has its slowdown injected per step
                if name not in ("DenoisingStage", "RefinementStage"):
                    self._inject(self._slow.get(name, 0.0), mark, name)
            if timing and not events:
                self._sync()
        finally:
            if self.watch is not None:
                self.watch.stage = None
        ms = (time.perf_counter() - t0) * 1000.0
        res = StageResult(name, ms, w0, time.time())
        if timing and self.is_cuda:
            res.peak_allocated_mb = torch.cuda.max_memory_allocated(self.device) / MIB
            res.peak_reserved_mb = torch.cuda.max_memory_reserved(self.device) / MIB
        if events:
            self._pending.append((res, e0, self._event()))
        out.stages.append(res)

    def _resolve(self, out: RunResult) -> None:
        """After the request: the CUDA-injected pieces' and event-timed stages' and steps' ms."""
        for st, a, b, b0, b1 in self._inj_pieces:
            acc = out.injected.setdefault(st, [0.0, 0.0])
            acc[0] += a.elapsed_time(b)
            acc[1] += b0.elapsed_time(b1)
        if self._pending or self._pending_steps:
            self._sync()
        origin = self._request_event
        for res, e0, e1 in self._pending:  # wall times on the device's timeline, from the request start
            res.ms = e0.elapsed_time(e1)
            res.t_start = out.t_start + origin.elapsed_time(e0) / 1000.0
            res.t_end = out.t_start + origin.elapsed_time(e1) / 1000.0
        for target, events in self._pending_steps:
            target.extend(a.elapsed_time(b) for a, b in zip(events, events[1:]))

    def _denoise(
        self, latents, embeds, mask, timesteps, shape, req, timing, step_times, stage="DenoisingStage"
    ):
        """``timesteps`` of ``stage`` on latents of ``shape``; each step's ms into ``step_times``."""
        guidance, slow = req.guidance_scale, self._slow.get(stage, 0.0)
        cfg = guidance > 1.0
        n_lat, h_lat, w_lat = shape
        rope = (self.temporal / req.fps, self.spatial, self.spatial)
        dims = {"num_frames": n_lat, "height": h_lat, "width": w_lat, "rope_interpolation_scale": rope}
        sched = self._active_sched
        events = [self._event()] if timing and self.is_cuda else []
        par = self.cfg_parallel
        profiler = self.profiler if stage == "DenoisingStage" else None
        for t in timesteps:
            t0 = time.perf_counter()
            mark = self._mark() if slow else None
            if par is None:
                model_in = torch.cat([latents] * 2) if cfg else latents
                model_in = model_in.to(embeds.dtype)
                noise = self._predict(model_in, embeds, mask, t, dims)
                if cfg:
                    uncond, text = noise.chunk(2)
                    noise = uncond + guidance * (text - uncond)
            else:
                noise = par.noise(
                    lambda x, e, m, t=t: self._predict(x.to(e.dtype), e, m, t, dims),
                    latents,
                    embeds,
                    mask,
                    cfg,
                    guidance,
                )
            latents = sched.step(noise, t, latents, return_dict=False)[0]
            self._inject(slow, mark, stage)
            if events:
                events.append(self._event())
            elif timing:
                step_times.append((time.perf_counter() - t0) * 1000.0)
            if profiler is not None:
                profiler.denoising_step_done()
        if events:  # resolved with the stages after the request
            self._pending_steps.append((step_times, events))
        return latents

    def _predict(self, model_in, embeds, mask, t, dims):
        return self.c.transformer(
            hidden_states=model_in,
            encoder_hidden_states=embeds,
            timestep=t.expand(model_in.shape[0]),
            encoder_attention_mask=mask,
            return_dict=False,
            **dims,
        )[0].float()

    def _timesteps(self, steps: int, seq_len: int, start_sigma: float = 1.0):
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps

        sched = self.c.scheduler
        if steps == 1 and sched.config.get("shift_terminal"):
            # shift_terminal divides by zero for a single sigma (NaN timesteps): a copy without it
            if self._one_step_sched is None:
                self._one_step_sched = type(sched).from_config(sched.config, shift_terminal=None)
            sched = self._one_step_sched
        self._active_sched = sched
        sigmas = np.linspace(start_sigma, 1.0 / steps if start_sigma == 1.0 else start_sigma / steps, steps)
        mu = calculate_shift(
            seq_len,
            sched.config.get("base_image_seq_len", 256),
            sched.config.get("max_image_seq_len", 4096),
            sched.config.get("base_shift", 0.5),
            sched.config.get("max_shift", 1.15),
        )
        ts, _ = retrieve_timesteps(sched, steps, self.device, sigmas=sigmas, mu=mu)
        return ts

    @torch.no_grad()
    def run(self, req: GenRequest, keep_output: bool = False, slow: bool = False) -> RunResult:
        """Run one request: timings, compile window and (``keep_output``) the frames; ``slow``: apply
        the test-only :attr:`stage_delay`. Raises torch.OutOfMemoryError (the caller reports it)."""
        out = RunResult()
        self._run = out
        self._slow = dict(self.stage_delay) if slow else {}
        timing = {"off": False, "events": "events", "sync": "sync"}[req.timing_mode]
        # CUDA-injected (stage, start, end, busy start, busy end) pieces, event-timed stages and
        # steps: resolved after the request
        self._inj_pieces, self._pending, self._pending_steps = [], [], []
        self._request_event = self._event() if timing == "events" and self.is_cuda else None
        pipe = self.pipe
        frames = align_frames(req.num_frames, self.temporal)
        out.effective_frames = frames
        n_lat = latent_frames(frames, self.temporal)
        h1, w1 = req.height, req.width
        if self.two_stage:  # the first pass at half resolution, a multiple of the VAE's spatial factor
            h1, w1 = (max(self.spatial, (x // 2) // self.spatial * self.spatial) for x in (h1, w1))
        gen = torch.Generator(device="cpu").manual_seed(req.seed)
        if self.watch is not None:
            self.watch.begin()
        if self.cfg_parallel is not None:
            self.cfg_parallel.begin_request()
        out.t_start = time.time()
        t_all = time.perf_counter()
        try:
            embeds, mask = self._encode(req, out, timing)
            with self._stage("LatentPreparationStage", out, timing):
                ch = self.c.transformer.config.in_channels
                latents = pipe.prepare_latents(1, ch, h1, w1, frames, torch.float32, self.device, gen, None)
                h_lat, w_lat = h1 // self.spatial, w1 // self.spatial
                timesteps = self._timesteps(req.num_inference_steps, n_lat * h_lat * w_lat)
            with self._stage("DenoisingStage", out, timing):
                latents = self._denoise(
                    latents, embeds, mask, timesteps, (n_lat, h_lat, w_lat), req, timing, out.steps
                )
            if self.two_stage:
                latents, h_lat, w_lat = self._upsample_and_refine(
                    latents, embeds, mask, (n_lat, h_lat, w_lat), req, out, timing, gen
                )
            out.latent_shape = [int(self.c.transformer.config.in_channels), n_lat, int(h_lat), int(w_lat)]
            if self.cfg_parallel is None or self.cfg_parallel.rank == 0:  # only rank 0 decodes
                with self._stage("DecodingStage", out, timing):
                    lat5 = self._unpacked(latents, n_lat, h_lat, w_lat)
                    video = self.c.vae.decode(lat5.to(self.dtype), None, return_dict=False)[0]
                    if keep_output:
                        out.video = ((video.float().clamp(-1, 1) + 1) * 127.5).to(torch.uint8).cpu().numpy()
            self._sync()
        finally:
            out.total_ms = (time.perf_counter() - t_all) * 1000.0
            out.t_end = time.time()
            if self.watch is not None:
                out.compile = self.watch.end()
            if self.cfg_parallel is not None:
                out.cfg_compute_ms, out.cfg_gather_ms = self.cfg_parallel.step_split()
        self._resolve(out)
        return out

    def _unpacked(self, latents: Any, n_lat: int, h_lat: int, w_lat: int) -> Any:
        """Packed latents -> the denormalised 5-D latents the VAE and the upsampler take."""
        pipe, vae = self.pipe, self.c.vae
        p_s, p_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        lat5 = pipe._unpack_latents(latents, n_lat, h_lat, w_lat, p_s, p_t)
        return pipe._denormalize_latents(lat5, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)

    def _encode(self, req: GenRequest, out: RunResult, timing: bool | str) -> tuple[Any, Any]:
        """TextEncodingStage: (embeddings, mask), the negative prompt's first with CFG."""
        cfg = req.guidance_scale > 1.0
        with self._stage("TextEncodingStage", out, timing):
            embeds, mask, neg, neg_mask = self.pipe.encode_prompt(
                prompt=req.prompt,
                negative_prompt=req.negative_prompt or "",
                do_classifier_free_guidance=cfg,
                num_videos_per_prompt=1,
                max_sequence_length=self.c.preset.max_sequence_length,
                device=self.device,
            )
            if cfg:
                embeds = torch.cat([neg, embeds], dim=0)
                mask = torch.cat([neg_mask, mask], dim=0)
            embeds = embeds.to(self.dtype)
        return embeds, mask

    def _upsample_and_refine(
        self, latents, embeds, mask, shape, req, out, timing, gen
    ) -> tuple[Any, int, int]:
        """UpsampleStage and RefinementStage: (latents, latent height, latent width)."""
        pipe, vae = self.pipe, self.c.vae
        n_lat, h_lat, w_lat = shape
        p_s, p_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        with self._stage("UpsampleStage", out, timing):
            up = self.c.upsampler(self._unpacked(latents, n_lat, h_lat, w_lat).to(self.dtype)).float()
            up = pipe._normalize_latents(up, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
            h_lat, w_lat = up.shape[-2], up.shape[-1]
            latents = pipe._pack_latents(up, p_s, p_t)
        with self._stage("RefinementStage", out, timing):
            steps = max(1, self.refine_steps)
            ts = self._timesteps(steps, n_lat * h_lat * w_lat, start_sigma=0.4)
            noise = torch.randn(latents.shape, generator=gen).to(latents.device)
            latents = 0.4 * noise + 0.6 * latents
            shape = (n_lat, h_lat, w_lat)
            latents = self._denoise(
                latents, embeds, mask, ts, shape, req, timing, out.refinement_steps, "RefinementStage"
            )
        return latents, h_lat, w_lat
