"""``python -m perfkit.refengine``: start the reference engine (see :mod:`perfkit.refengine.cli`)."""

import time

_T0 = time.time()  # before heavy imports: the process_start mark

from perfkit.refengine.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(t0=_T0))
