"""``perfkit bisect`` and ``perfkit history confirm``: which commit made it slower, an A/B at each
probe (checkout, probe, search, confirm; outputs in :mod:`perfkit.report.history_site`). See
docs/history.md ("Which commit?").
"""
