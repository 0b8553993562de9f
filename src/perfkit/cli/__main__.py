"""``python -m perfkit.cli``: the perfkit command."""

import sys

from perfkit.cli import main

sys.exit(main())
