"""`python -m learner.train`: the GRPO training entry point.

Parses the run config (``--config``, default ``configs/tiny.toml``; ``--set``;
``--print-config``) like every entry point. The training loop itself is not implemented yet; until it is, this
command validates the config and exits with status 2 saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared.config import add_config_args, config_from_args

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner.train", description=__doc__)
    add_config_args(parser, default=DEFAULT_CONFIG)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    print(
        "learner.train: config is valid "
        f"(mode={config.env.mode}, inference={config.inference.backend}), "
        "but the GRPO training loop is not implemented yet.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
