"""``python -m durq.bench worker ...``: the bench's worker process (see durq.bench.worker)."""

from __future__ import annotations

import sys

from durq.bench.worker import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "worker":
        sys.stderr.write("usage: python -m durq.bench worker --broker URL [options]\n")
        sys.exit(2)
    main(args[1:])
