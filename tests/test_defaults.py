"""One default per option: where a run-config field also exists as a keyword of a function
or class (the GRPO math, the packer, the episode's limits, the browser pool, the rollout
client...), the keyword's default is the field's, so code that uses the project as a
library computes what a run with the default config computes.

Two checks: every keyword named like a field of the section it mirrors has that field's
default (a new keyword is covered as soon as it is added), and the keywords whose names
differ from their field's (``ddof`` for ``learner.adv_std``...) are listed by hand. The
few deliberate differences are listed with their reason.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from learner.training import batching, grpo
from learner.training.grpo import ADV_DDOF
from rollout.env import browser, core
from rollout.env import pool as browser_pool
from rollout.sidecar import episode, inference
from shared import config as C

RUN = C.RunConfig()

# (callable, the config section whose same-named fields it mirrors)
MIRRORS = [
    (grpo.grpo_loss, "learner"),
    (batching.pack, "learner"),
    (episode.Limits, "inference"),
    (episode.Context, "env"),
    (core.EpisodeLimits, "env"),
    (core.Environment, "env"),
    (browser.PlaywrightBackend, "env"),
    (browser.SomBackend, "env"),
    (browser_pool.PoolConfig, "rollout"),
    (inference.Sampling, "inference"),
    (inference.InferenceClient, "inference"),
]

# keywords whose field has another name: (callable, keyword, the default it must have)
RENAMED = [
    (grpo.group_advantages, "scale", RUN.learner.scale_rewards),
    (grpo.group_advantages, "ddof", ADV_DDOF[RUN.learner.adv_std]),
    (grpo.grpo_loss, "clip_low", RUN.learner.clip_eps_low),
    (grpo.grpo_loss, "clip_high", RUN.learner.clip_eps_high),
    (grpo.grpo_loss, "agg", RUN.learner.loss_agg),
    (batching.advantages, "scale", RUN.learner.scale_rewards),
    (batching.advantages, "ddof", ADV_DDOF[RUN.learner.adv_std]),
    (batching.pack, "adv_ddof", ADV_DDOF[RUN.learner.adv_std]),
]

# deliberate differences: (callable, keyword) -> why
DIFFERENT = {
    # pack masks stale tokens only when given the policy version too: None is "no check"
    (batching.pack, "max_staleness"): "off unless policy_version is given as well",
    # the client speaks a protocol; "embedded" is learner.serve, which speaks SGLang's
    (inference.InferenceClient, "backend"): "a protocol: embedded speaks sglang's",
}


def _default(fn, name):
    if dataclasses.is_dataclass(fn):
        f = {x.name: x for x in dataclasses.fields(fn)}[name]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return inspect.Parameter.empty
    return inspect.signature(fn).parameters[name].default


def _keywords(fn) -> list[str]:
    if dataclasses.is_dataclass(fn):
        return [f.name for f in dataclasses.fields(fn) if f.init]
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize(("fn", "section"), MIRRORS, ids=lambda x: getattr(x, "__qualname__", x))
def test_same_named_keywords_default_to_the_fields(fn, section):
    fields = {f.name for f in dataclasses.fields(C.SECTIONS[section])}
    values = getattr(RUN, section)
    checked = 0
    for name in _keywords(fn):
        if name not in fields or (fn, name) in DIFFERENT:
            continue
        default = _default(fn, name)
        if default is inspect.Parameter.empty:
            continue  # required: the caller always says
        assert default == getattr(values, name), (
            f"{fn.__qualname__}({name}={default!r}) but {section}.{name} = "
            f"{getattr(values, name)!r}"
        )
        checked += 1
    assert checked, f"{fn.__qualname__} shares no defaulted keyword with [{section}]"


@pytest.mark.parametrize(
    ("fn", "name", "want"), RENAMED, ids=lambda x: getattr(x, "__qualname__", str(x))
)
def test_renamed_keywords_default_to_their_fields(fn, name, want):
    assert _default(fn, name) == want


def test_the_deliberate_differences_still_differ():
    """A listed difference that no longer differs is dropped from the list."""
    for (fn, name), why in DIFFERENT.items():
        section = next(s for f, s in MIRRORS if f is fn)
        assert _default(fn, name) != getattr(getattr(RUN, section), name), why


def test_a_library_call_scales_advantages_as_a_run_does():
    """The default run divides by the sample std (ddof 1, learner.adv_std = "sample"):
    rewards [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.70711 -> +-0.5 / 0.70711 =
    +-0.70711 (the population std, 0.5, would give +-1)."""
    import jax.numpy as jnp
    import numpy as np

    adv, _ = grpo.group_advantages(jnp.array([1.0, 0.0]), 2, eps=0.0)
    np.testing.assert_allclose(adv, [0.70711, -0.70711], atol=1e-5)
