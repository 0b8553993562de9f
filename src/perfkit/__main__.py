"""``python -m perfkit``: the perfkit command (:func:`perfkit.cli.main`)."""

import sys

from perfkit.cli import main

sys.exit(main())
