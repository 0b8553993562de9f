"""The gate: sglang-layout baseline files, comparison with sglang's tolerance rule, the
within-run invariants the investigations declare, verdict files and exit codes."""
