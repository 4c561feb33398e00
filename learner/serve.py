"""`python -m learner.serve`: the embedded inference server, speaking SGLang's native HTTP API.

The command's name; the code is :mod:`learner.serving.server` (``--help`` there says the rest).
"""

import sys

if __name__ == "__main__":
    from learner.training.host_memory import restart_with_huge_pages

    restart_with_huge_pages()  # before JAX is imported (learner.training.host_memory)

from learner.serving.server import main

if __name__ == "__main__":
    sys.exit(main())
