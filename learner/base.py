"""`python -m learner.base`: pretrain the embedded default's base model on the copy exercise.

The command's name; the code is :mod:`learner.embedded.base` (``--help`` there says the rest).
"""

import sys

from learner.embedded.base import main

if __name__ == "__main__":
    sys.exit(main())
