"""The per-request record format both sides agree on (sglang's ``performance.log`` layout).

Source: sglang ``multimodal_gen`` (``SGLANG_DIFFUSION_STAGE_LOGGING=1`` with
``SGLANG_PERF_LOG_DIR=DIR`` appends one JSON object per request to ``DIR/performance.log``).
The reference engine writes it; :mod:`perfkit.readings.records` reads it.
"""

#: file name inside ``SGLANG_PERF_LOG_DIR`` that holds one JSON object per line
PERF_LOG_NAME = "performance.log"
