"""The reference engine: a real LTX-Video pipeline (diffusers) behind an sglang-style HTTP server.

Start it with ``python -m perfkit.refengine --preset tiny --port 0 --perf-log-dir DIR``.
"""
