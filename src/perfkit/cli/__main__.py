"""``python -m perfkit.cli``: the perfkit command."""

import sys

from perfkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
