"""``perfkit bisect`` and ``perfkit history confirm``: which commit made it slower, an A/B at each
probe.

- :mod:`perfkit.bisect.checkout`: the commit range, subjects and author dates, probe checkouts
  as detached worktrees (the user's checkout never touched), build commands.
- :mod:`perfkit.bisect.probe`: one probe: build, the spec for the checkout (``{checkout}``, the
  Python overlay), ``perfkit ab``'s sequential A/B on one metric.
- :mod:`perfkit.bisect.search`: the binary search over probes (undecided or failed probes
  skipped, never guessed).
- :mod:`perfkit.bisect.confirm`: an A/B between the commits on either side of a history change
  point, its outcome stored next to it.
- :mod:`perfkit.report.bisect`: bisect.json / confirm.json, summary.md and report.html.
"""
