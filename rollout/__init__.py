"""The rollout side: everything asyncio between the policy and the web.

What it may import: :mod:`shared` and its own modules; never :mod:`learner` or the JAX
stack (jax, flax, optax, orbax): a CPU rollout node needs only the browser and HTTP.

Inside, the parts are layered, each importing only those below it
(``tests/test_import_boundaries.py`` holds the table and checks it, and that no module
imports itself through others):

- the registry (:mod:`rollout.registry`, with :mod:`rollout.action_spec`): environments,
  task sources and verifiers register into it, and it imports none of them;
- the local web (:mod:`rollout.web`) and the web archive (:mod:`rollout.archive`);
- the network layer (:mod:`rollout.net`: urls, resolution, egress, proxies, politeness,
  search backends), the episode record and tracker (:mod:`rollout.tracking`) and the
  task generators (:mod:`rollout.tasks`);
- the agent's actions, dialects, parser and scripted policies (:mod:`rollout.agent`);
- the reward verifiers (:mod:`rollout.verifiers`);
- the environment, its three modes and the browser pool (:mod:`rollout.env`);
- the tool-calling domain (:mod:`rollout.tools`) and the sidecar (:mod:`rollout.sidecar`:
  the engine, the server, the dashboard, the buffer, the inference client);
- on top, the commands: ``rollout.serve``, ``rollout.eval``, ``rollout.search``,
  ``rollout.sft_export``, ``rollout.make_tokenizer``.

The module paths from before the packages by role (``rollout.parser``,
``rollout.engine``, ...) still import, as deprecated aliases of the modules that replaced
them (:mod:`rollout.moved`).
"""

from rollout.moved import MOVED
from shared import moved

moved.install(MOVED)
