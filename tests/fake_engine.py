"""A fake engine for launch tests: prints perfkit-mark lines, serves GET /health (http.server).

Modes:
  ok      mark, write one warmup record to <perf-log-dir>/performance.log, serve /health, and
          POST /v1/videos (completed at once; one sglang-layout record per request; GET
          /v1/videos/<id> answers completed). --nan-request I writes request I's (0-based)
          DenoisingStage time as NaN, --bad-utf8-request I writes its stage name with stray
          bytes (invalid UTF-8); --stderr-line-bytes N prints one N-byte hex line to stderr at start
  exit    print a few lines, exit with --exit-code
  hang    run but never answer /health with 200 (no server at all)
  alloc   serve /health, then allocate --alloc-mib in --step-mib steps (--alloc-when start: before
          serving)
Options: --child (a sleeping child in the same process group), --escape-child (a child in its own
session, outside the group), --ignore-term (ignore SIGTERM).
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


def mark(name: str) -> None:
    print(f"perfkit-mark {name} t={time.time():.6f}", file=sys.stderr, flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    perf_log: str | None = None
    nan_request = -1
    bad_utf8_request = -1
    served = 0
    lock = threading.Lock()

    def _json(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/videos":
            return self._json(404, {"detail": "not found"})
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        with cls.lock:
            i, cls.served = cls.served, cls.served + 1
        rid = f"req-{i}"
        denoise = float("nan") if i == cls.nan_request else 20.0 + i
        line = json.dumps(
            {
                "request_id": rid,
                "tag": "pipeline_stage_metrics",
                "stages": [
                    {"name": "TextEncodingStage", "execution_time_ms": 2.0},
                    {"name": "DenoisingStage", "execution_time_ms": denoise},
                    {"name": "DecodingStage", "execution_time_ms": 3.0},
                ],
                "steps": [10.0, 10.0 + i],
                "total_duration_ms": 25.0 + i,
                "memory_snapshots": {},
            }
        ).encode()
        if i == cls.bad_utf8_request:
            line = line.replace(b"DenoisingStage", b"Denois\xff\xfeingStage")
        if cls.perf_log:
            with open(cls.perf_log, "ab") as fh:
                fh.write(line + b"\n")
        self._json(200, {"id": rid, "status": "completed"})

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/v1/videos/"):
            return self._json(200, {"id": self.path.rsplit("/", 1)[-1], "status": "completed"})
        if self.path == "/health":
            body = b"ok"
            self.send_response(200)
        else:
            body = b"not found"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
    ap.add_argument("--mode", default="ok", choices=["ok", "exit", "hang", "alloc"])
    ap.add_argument("--exit-code", type=int, default=3)
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
    a = ap.parse_args()

    mark("process_start")
    if a.stderr_line_bytes:  # one long line (a hex dump) in the engine log
        print(
            os.urandom(a.stderr_line_bytes // 2 + 1).hex()[: a.stderr_line_bytes], file=sys.stderr, flush=True
        )
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"fake engine pid {os.getpid()} mode {a.mode}", flush=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    if a.child:
        subprocess.Popen(sleeper)
    if a.escape_child:
        subprocess.Popen(sleeper, start_new_session=True)
    if a.mode == "exit":
        print("loading model... failed: out of luck", file=sys.stderr, flush=True)
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
    Handler.nan_request, Handler.bad_utf8_request = a.nan_request, a.bad_utf8_request
    Handler.perf_log = os.path.join(a.perf_log_dir, "performance.log") if a.perf_log_dir else None
    server = http.server.ThreadingHTTPServer((a.host, a.port), Handler)
    if a.mode == "alloc" and a.alloc_when == "ready":
        threading.Thread(target=allocate, args=(a.alloc_mib, a.step_mib, a.step_s, hold), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
