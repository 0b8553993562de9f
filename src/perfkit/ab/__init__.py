"""A/B of two engine specs (``perfkit ab``): interleaved launches, per-metric ratios B/A with
intervals that hold at a few launches a side, and a decision per metric.

- the statistics are :mod:`perfkit.stats`'s (launch as the unit: :mod:`perfkit.stats.launches`).
- :mod:`perfkit.ab.metrics`: the per-launch values of each metric, read from a side's bundle.
- :mod:`perfkit.ab.decide`: compares two bundles: the table of ratios and verdicts, exit code.
- :mod:`perfkit.ab.driver`: runs the balanced interleaved launches (A B B A …) into a bundle per
  side.
- :mod:`perfkit.ab.sequential`: launches until every gated metric is decided (alpha spending over
  the looks, slow-spell launches replaced, undecided at the maximum exits 1); the procedure is in
  :mod:`perfkit.ab.procedure`, its replay on a recorded pool in :mod:`perfkit.ab.replay`.
- :mod:`perfkit.ab.power`: a recorded pool's A/A false alarms and detection rates; the pool in
  :mod:`perfkit.ab.pool`, host slow spells in :mod:`perfkit.ab.slow`.
"""
