"""The ``tools`` environment kind for these tests: the registered one, or one registered here.

Once ``tools`` is registered in :data:`rollout.registry.envs` for real, the fixture
uses that registration; until then it registers the pieces ``rollout.tools``
exposes for the length of a test, as the real registration will.
"""

import pytest

from rollout.registry import EnvKind, envs
from rollout.tools import (
    ACTIONS,
    COMPACT_INTRO,
    DIALECT,
    INTRO,
    KIND,
    NEEDS_BROWSER,
    make_backend,
    make_oracle,
)


def tools_kind() -> EnvKind:
    return EnvKind(
        KIND,
        tuple(ACTIONS),
        lambda ctx: make_backend(ctx.env.observation_chars),
        dialect=DIALECT,
        browser=NEEDS_BROWSER,
        oracle=lambda task, *args, **kwargs: make_oracle(task),
        intro=INTRO,
        compact_intro=COMPACT_INTRO,
        doc="tool calling over country figures",
    )


@pytest.fixture(scope="module")
def tools_mode():
    if KIND in envs:
        yield KIND
        return
    envs.register(KIND, tools_kind())
    yield KIND
    envs.unregister(KIND)
