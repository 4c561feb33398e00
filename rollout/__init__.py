"""The rollout side: everything asyncio between the policy and the web.

The environment and its action spaces, the action parser, the reward verifiers, the
progress tracker, the browser pool and the network layer, the rollout engine, the
sidecar HTTP server and its dashboard, the inference client, the task generators and
the local web.

What it may import: :mod:`shared` and its own modules; never :mod:`learner` or the JAX
stack (jax, flax, optax, orbax): a CPU rollout node needs only the browser and HTTP.
Inside, the parts are layered, each importing only those below it: the registry at the
bottom (:mod:`rollout.registry`: environments, task sources and verifiers register
into it, and it imports none of them), the local web (:mod:`rollout.web`), the task
generators (:mod:`rollout.tasks`), the top-level modules the environment is built from
(actions and parser, tracker and records, the network layer), the verifiers, the
environment (:mod:`rollout.env`), the tool domain (:mod:`rollout.tools`), and on top
the sidecar and the commands that run episodes. ``tests/test_import_boundaries.py``
holds that table and checks it, and that no module imports itself through others.
"""
