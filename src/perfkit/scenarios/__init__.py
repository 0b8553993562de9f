"""The investigations, as plain functions returning a :class:`perfkit.bundle.ResultBundle`.

- :func:`cold_vs_warm`: cold request vs warm requests in one session, leak checks.
- :func:`warmup_shapes`: does the startup warmup cover the request shapes.
- :func:`memory_budget` / :func:`find_min_budget`: fit and cost under memory caps.
"""
from perfkit.scenarios.cold_warm import cold_vs_warm
from perfkit.scenarios.memory_budget import find_min_budget, memory_budget
from perfkit.scenarios.warmup_shapes import warmup_shapes

__all__ = ["cold_vs_warm", "warmup_shapes", "memory_budget", "find_min_budget"]
