"""``python -m perfkit``: the perfkit command (:func:`perfkit.cli.main`)."""

import sys

from perfkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
