"""`python -m rollout.archive inspect DIR` and `export DIR EPISODE OUT.warc.gz` (:mod:`rollout.archive.store`)."""

import sys

from rollout.archive.store import main

if __name__ == "__main__":
    sys.exit(main())
