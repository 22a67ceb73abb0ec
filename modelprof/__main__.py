"""``python -m modelprof ...``: the same command line as the ``modelprof`` script."""

from __future__ import annotations

import sys

from modelprof.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
