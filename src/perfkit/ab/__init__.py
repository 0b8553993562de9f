"""A/B of two engine specs (``perfkit ab``): interleaved launches, per-metric ratios B/A with
intervals that hold at a few launches a side, and a decision per metric; docs/ab.md."""
