"""`python -m learner.engines`: a real SGLang or vLLM server as one of the run's children.

The command's name; the code is :mod:`learner.serving.engines` (``--help`` there says the rest).
"""

import sys

from learner.serving.engines import main

if __name__ == "__main__":
    sys.exit(main())
