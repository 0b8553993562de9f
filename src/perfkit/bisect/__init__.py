"""``perfkit bisect`` and ``perfkit history confirm``: which commit made it slower, an A/B at each
probe. See docs/history.md ("Which commit?")."""
