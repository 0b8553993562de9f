"""A fake engine for launch tests: prints perfkit-mark lines, serves GET /health (http.server).

Modes:
  ok      mark, write one warmup record to <perf-log-dir>/performance.log, serve /health
  exit    print a few lines, exit with --exit-code
  hang    run but never answer /health with 200 (no server at all)
  alloc   serve /health, then allocate --alloc-mib in --step-mib steps (--alloc-when start: before
          serving)
  serve   serve /health and sglang's video API (mode ok serves it too) (POST /v1/videos, GET /v1/videos/{id}): each
          request completes after --request-s and appends its performance.log record
Options: --child (a sleeping child in the same process group), --escape-child (a child in its own
session, outside the group), --ignore-term (ignore SIGTERM).

Faults of mode serve, at the request numbered --fault-at (0 = the first, the cold request):
  hang     the request never finishes; /health still answers 200
  sigstop  the engine stops itself (SIGSTOP) inside the request
  drain    the request never finishes, and SIGTERM only starts "draining in-flight jobs"
           (uvicorn's graceful shutdown waiting on a job that never ends): it never exits
  fork     at start, a child in the engine's group and one in a session of its own; then as hang
  sigkill  the engine SIGKILLs itself inside the request (as the OOM killer would)
Input faults (any serving mode): --nan-request N (request N's DenoisingStage time is NaN),
--bad-utf8-request N (request N's stage name is invalid UTF-8), --stderr-line-bytes B (one line of
B hex digits on stderr at startup).
Slowdown (bisect tests): --denoise-factor-from MODULE imports MODULE (from PYTHONPATH, e.g. a
checkout of an engine's source) and multiplies the request's time (all of it DenoisingStage) by
its ``DENOISE_FACTOR`` (1.0 when it has none); --denoise-factor F sets it directly.
--drop-polls N: the first N status polls (GET /v1/videos/{id}) get no answer: the connection is
closed (as uvicorn drops a keep-alive connection whose loop was busy past its timeout).
--sglang-server-args: log sglang 0.5.23's startup ``server_args: {JSON}`` line (compile on), as
sglang does; the records stay sglang's (no ``perfkit`` block: no compile counts).
--pid-file: every process of the engine (itself, its children) appends "pid create_time" there,
so a test can check by pid and start time, not by name, that none survives.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time


def command(*args: str) -> list[str]:
    """The argv template that starts this stand-in engine (``{port}`` and ``{perf_log_dir}``
    filled by perfkit's launcher), followed by ``args``: what a test gives
    ``EngineSpec(kind="command", command_template=...)``."""
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--port",
        "{port}",
        "--perf-log-dir",
        "{perf_log_dir}",
        *args,
    ]


def mark(name: str) -> None:
    print(f"perfkit-mark {name} t={time.time():.6f}", file=sys.stderr, flush=True)


class Jobs:
    """The video API's jobs: id -> status; request numbers count from 0."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.status: dict[str, str] = {}
        self.n = 0
        self.lock = threading.Lock()

    def submit(self) -> str:
        with self.lock:
            k = self.n
            self.n += 1
        rid = f"req-{k}"
        self.status[rid] = "running"
        threading.Thread(target=self.run, args=(rid, k), daemon=True).start()
        return rid

    def run(self, rid: str, k: int) -> None:
        a = self.a
        t0 = time.time()
        if k == a.fault_at and a.fault != "none":
            print(f"request {k} ({rid}): fault {a.fault} t={time.time():.3f}", flush=True)
            if a.fault == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif a.fault == "sigkill":
                time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # hang, drain, fork (and a continued sigstop): never finishes
                time.sleep(1)
        time.sleep(a.request_s * a.denoise_factor)
        if a.perf_log_dir:
            ms = (time.time() - t0) * 1000.0
            denoise = float("nan") if k == a.nan_request else ms
            line = json.dumps(
                {
                    "request_id": rid,
                    "tag": "pipeline_stage_metrics",
                    "stages": [
                        {"name": "TextEncodingStage", "execution_time_ms": 2.0},
                        {"name": "DenoisingStage", "execution_time_ms": denoise},
                        {"name": "DecodingStage", "execution_time_ms": 3.0},
                    ],
                    "steps": [ms / 2, ms / 2],
                    "total_duration_ms": ms + 5.0,
                    "memory_snapshots": {},
                }
            ).encode()
            if k == a.bad_utf8_request:  # an undecodable stage name
                line = line.replace(b"DenoisingStage", b"Denois\xff\xfeingStage")
            with open(os.path.join(a.perf_log_dir, "performance.log"), "ab") as fh:
                fh.write(line + b"\n")
        self.status[rid] = "completed"


JOBS: Jobs | None = None
#: status polls still to drop (--drop-polls)
DROP_POLLS = [0]


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(200, b"ok")
        elif JOBS is not None and self.path.startswith("/v1/videos/"):
            if DROP_POLLS[0] > 0:  # no answer: the connection is closed under the client
                DROP_POLLS[0] -= 1
                self.close_connection = True
                return
            rid = self.path.rsplit("/", 1)[1]
            st = JOBS.status.get(rid)
            if st is None:
                self._send(404, b'{"detail": "no such job"}')
            else:
                self._send(200, json.dumps({"id": rid, "status": st}).encode())
        else:
            self._send(404, b"not found")

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if JOBS is not None and self.path == "/v1/videos":
            rid = JOBS.submit()
            self._send(200, json.dumps({"id": rid, "status": "queued"}).encode())
        else:
            self._send(404, b"not found")

    def log_message(self, fmt: str, *args) -> None:  # quiet
        pass


def allocate(total_mib: int, step_mib: int, step_s: float, hold: list) -> None:
    done = 0
    while done < total_mib:
        hold.append(bytearray(os.urandom(1)) * (step_mib * 2**20))  # touched: real RSS
        done += step_mib
        print(f"allocated {done} MiB", flush=True)
        time.sleep(step_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--perf-log-dir", default=None)
    ap.add_argument("--mode", default="ok", choices=["ok", "exit", "hang", "alloc", "serve"])
    ap.add_argument(
        "--fault", default="none", choices=["none", "hang", "sigstop", "drain", "fork", "sigkill"]
    )
    ap.add_argument("--fault-at", type=int, default=1)
    ap.add_argument("--request-s", type=float, default=0.05)
    ap.add_argument("--pid-file", default=None)
    ap.add_argument("--exit-code", type=int, default=3)
    ap.add_argument("--exit-signal", type=int, default=0, help="exit mode: kill itself with this signal")
    ap.add_argument("--load-s", type=float, default=0.3)
    ap.add_argument("--warmup-s", type=float, default=0.2)
    ap.add_argument("--alloc-mib", type=int, default=600)
    ap.add_argument("--step-mib", type=int, default=50)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--alloc-when", default="ready", choices=["ready", "start"])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--escape-child", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--nan-request", type=int, default=-1)
    ap.add_argument("--bad-utf8-request", type=int, default=-1)
    ap.add_argument("--stderr-line-bytes", type=int, default=0)
    ap.add_argument("--denoise-factor", type=float, default=1.0)
    ap.add_argument("--denoise-factor-from", default=None, metavar="MODULE")
    ap.add_argument("--sglang-server-args", action="store_true")
    ap.add_argument("--drop-polls", type=int, default=0)
    a = ap.parse_args()
    DROP_POLLS[0] = a.drop_polls
    if a.denoise_factor_from:
        import importlib

        a.denoise_factor = float(
            getattr(importlib.import_module(a.denoise_factor_from), "DENOISE_FACTOR", 1.0)
        )

    mark("process_start")
    if a.stderr_line_bytes:  # one long line (a hex dump) in the engine log
        print(
            os.urandom(a.stderr_line_bytes // 2 + 1).hex()[: a.stderr_line_bytes], file=sys.stderr, flush=True
        )
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.fault == "drain":

        def drain(signum, frame) -> None:  # noqa: ARG001
            print("SIGTERM: draining in-flight jobs before exiting", flush=True)

        signal.signal(signal.SIGTERM, drain)
    print(f"fake engine pid {os.getpid()} mode {a.mode}", flush=True)
    if a.sglang_server_args:  # sglang's startup line: its effective config, compile on
        print(
            '[01-01 00:00:00] server_args: {"model_path": "fake/ltx", "backend": "auto", '
            '"attention_backend": "fa3", "dit_cpu_offload": false, "enable_torch_compile": true}',
            flush=True,
        )
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    kids = []
    if a.child or a.fault == "fork":
        kids.append(subprocess.Popen(sleeper))
    if a.escape_child or a.fault == "fork":
        kids.append(subprocess.Popen(sleeper, start_new_session=True))
    if a.pid_file:
        import psutil

        with open(a.pid_file, "a") as fh:
            for pid in [os.getpid(), *(k.pid for k in kids)]:
                fh.write(f"{pid} {psutil.Process(pid).create_time()!r}\n")
    if a.mode == "exit":
        print("loading model... failed: out of luck", file=sys.stderr, flush=True)
        if a.exit_signal:
            os.kill(os.getpid(), a.exit_signal)
        sys.exit(a.exit_code)
    hold: list = []
    if a.mode == "alloc" and a.alloc_when == "start":
        allocate(a.alloc_mib, a.step_mib, a.step_s, hold)
    time.sleep(a.load_s)
    mark("models_loaded")
    time.sleep(a.warmup_s)
    if a.perf_log_dir:
        os.makedirs(a.perf_log_dir, exist_ok=True)
        rec = {
            "request_id": "warmup-0",
            "tag": "warmup",
            "stages": [{"name": "DenoisingStage", "execution_time_ms": 12.5}],
            "steps": [6.0, 6.5],
            "total_duration_ms": 13.0,
            "memory_snapshots": {},
        }
        with open(os.path.join(a.perf_log_dir, "performance.log"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    mark("warmup_done")
    if a.mode == "hang":
        while True:
            time.sleep(1)
    global JOBS
    if a.mode in ("ok", "serve"):
        JOBS = Jobs(a)
    server = http.server.ThreadingHTTPServer((a.host, a.port), Handler)
    if a.mode == "alloc" and a.alloc_when == "ready":
        threading.Thread(target=allocate, args=(a.alloc_mib, a.step_mib, a.step_s, hold), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
