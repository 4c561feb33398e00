"""`python -m learner.base`: pretrain the embedded default's base model on the copy exercise.

The command's name; the code is :mod:`learner.embedded.base` (``--help`` there says the rest).
"""

import sys

if __name__ == "__main__":
    from learner.training.host_memory import restart_with_huge_pages

    restart_with_huge_pages()  # before JAX is imported (learner.training.host_memory)

from learner.embedded.base import main

if __name__ == "__main__":
    sys.exit(main())
