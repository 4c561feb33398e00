"""`python -m learner.serve`: the embedded inference server, speaking SGLang's native HTTP API.

The command's name; the code is :mod:`learner.serving.server` (``--help`` there says the rest).
"""

import sys

from learner.serving.server import main

if __name__ == "__main__":
    sys.exit(main())
