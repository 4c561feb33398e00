"""`python -m learner.sft`: supervised fine-tuning on exported trajectories (the warm start).

The command's name; the code is :mod:`learner.embedded.sft` (``--help`` there says the rest).
"""

import sys

if __name__ == "__main__":
    from learner.training.host_memory import restart_with_huge_pages

    restart_with_huge_pages()  # before JAX is imported (learner.training.host_memory)

from learner.embedded.sft import main

if __name__ == "__main__":
    sys.exit(main())
