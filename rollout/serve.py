"""`python -m rollout.serve`: the rollout sidecar (aiohttp).

The command's name; the code is :mod:`rollout.sidecar.server` (``--help`` there says the rest).
"""

import sys

from rollout.sidecar.server import main

if __name__ == "__main__":
    sys.exit(main())
