"""Environments, task sources and verifiers, found by name: in-tree and third-party alike.

Three registries, each from a name to what it names (``get(name)``, ``name in``,
``names()``; ``register(name, obj)`` adds one):

- :data:`envs`: environment kinds (``env.kind``): an :class:`EnvKind` bundles an
  action table, the dialect the agent writes it in, whether it needs a browser,
  a backend factory and a scripted oracle. In-tree: ``api``, ``playwright``, ``som``
  (:mod:`rollout.env`) and ``tools`` (:mod:`rollout.tools`).
- :data:`task_sources`: where episodes' tasks come from (``rollout.task_source``):
  a callable ``source(TaskRequest) -> list[dict]``. In-tree: ``generated`` (the
  task generator), ``file`` (a tasks JSONL, ``rollout.tasks_file``) and ``tools``.
- :data:`verifiers`: task scorers by task ``type``: a callable with the in-tree
  scorers' signature, ``scorer(task, body, cited, record, config, judgement) ->
  (score in [0, 1], parts)`` (:mod:`rollout.verifiers.scorers`).

The in-tree entries are registered by functions of the modules that own them
(``rollout.env:register_kinds``, ``rollout.tools:register_kind``, ...), which each
registry names as data, the way an entry point names a plugin's object: on the first
lookup (or registration) it imports those modules and calls the functions, in the
order listed, so the in-tree names come in one order whatever was imported first.
Third-party packages add entries through Python entry points in the groups
``deep_research_harness.envs``, ``deep_research_harness.task_sources`` and
``deep_research_harness.verifiers``: the entry point's name is the registered
name and it loads the object to register. Entry points are listed on the first
lookup and each is loaded only when its name is asked for, so a broken plugin
fails only the runs that use it, with an error naming its distribution; a plugin
that takes a name already registered (or two plugins one name) is an error too. The
sidecar, the engine, ``rollout.eval``, SFT export and the learner never list
these names: a run config naming a new one is all it takes.

The registry is the bottom of the plugin system: everything registers into it and it
imports none of it, neither what it registers nor who registers; its one import from
the project is :mod:`rollout.action_spec` (what an action table is made of, itself
importing nothing), which :class:`EnvKind` checks a kind's actions against.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from rollout.action_spec import ActionSpec, Answer

if TYPE_CHECKING:
    import aiohttp

    from rollout.env.core import Backend
    from rollout.env.pool import Lease
    from rollout.net.core import Net
    from rollout.net.urls import UrlPolicy
    from rollout.tracking.records import Step
    from shared.config import EnvConfig, RolloutConfig, RunConfig, SearchConfig

__all__ = [
    "ENV_GROUP",
    "TASK_SOURCE_GROUP",
    "VERIFIER_GROUP",
    "BackendContext",
    "EnvKind",
    "Registry",
    "RegistryError",
    "TaskRequest",
    "UnknownName",
    "envs",
    "task_sources",
    "verifiers",
]

ENV_GROUP = "deep_research_harness.envs"
TASK_SOURCE_GROUP = "deep_research_harness.task_sources"
VERIFIER_GROUP = "deep_research_harness.verifiers"

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")  # the form of every registered name
DIALECTS = ("xml", "call", "som")

T = TypeVar("T")


class RegistryError(ValueError):
    """A name registered twice, a malformed entry, or a plugin that fails to load."""


class UnknownName(RegistryError, KeyError):
    """A name nobody registered; the message lists the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# ----------------------------------------------------------------------------- what is registered


@dataclass(frozen=True)
class BackendContext:
    """What an environment kind's backend factory may use to build one episode's backend.

    A kind takes what it needs: the api kind the HTTP ``session`` and ``search``
    config, the browser kinds the ``lease`` (a browser context), a kind with
    neither a web nor a browser (a tool-calling domain) perhaps only ``env``."""

    kind: str  # the registered name
    web_url: str  # the web's base URL (the local web by default)
    env: EnvConfig
    search: SearchConfig
    policy: UrlPolicy  # the URL allowlist of the episode (``net.policy``)
    net: Net  # what the process's episodes share to reach the web
    episode_id: str
    session: aiohttp.ClientSession | None = None
    lease: Lease | None = None  # a browser context, for kinds with ``browser=True``
    run_dir: Path | None = None


@dataclass(frozen=True, eq=False)
class EnvKind:
    """An environment kind: everything ``env.kind = NAME`` selects.

    ``actions`` is the single source of what the agent may do: the parser reads it,
    the system prompt is rendered from it (:func:`rollout.agent.actions.describe_actions`).
    ``dialect`` is how the agent writes an action: ``xml`` (``<action>NAME</action>``
    and argument tags), ``call`` (a Python call read with :mod:`ast`, never run) or
    ``som`` (calls, plus the bracket form ``click [3]``). ``browser``: episodes need a
    browser context from the pool (``BackendContext.lease``). ``opens_page``: episodes
    start at the task's ``start_url``, which tasks must then name (False for a kind whose
    episodes open on no page, e.g. a tool-calling domain: ``Backend.start`` gets ``""``
    when the task names none). ``make_backend`` builds
    one episode's :class:`~rollout.env.core.Backend`. ``oracle``, when given, builds
    the scripted policy of ``rollout.policy = "oracle"`` / ``"noisy_oracle"`` and
    ``rollout.eval --policy oracle``: ``oracle(task, web_url, rollout, *, noisy, seed)``
    returns an object whose ``next(observation_text) -> model text`` acts.
    ``intro`` / ``compact_intro`` open the system prompt's action list (defaults: the
    dialect's). ``reached``, when given, names what one successful tool step reached
    besides the page it landed on: keys compared (as URLs, by
    :func:`~rollout.verifiers.citations.url_key`) with a task's ``evidence`` URLs by the
    evidence process reward, for a kind whose steps read something other than pages
    (the ``tools`` kind's lookups reach ``tools://figures/ISO/indicator``)."""

    name: str
    actions: tuple[ActionSpec, ...]
    make_backend: Callable[[BackendContext], Backend]
    dialect: Literal["xml", "call", "som"] = "call"
    browser: bool = False
    opens_page: bool = True
    oracle: Callable[..., Any] | None = None
    intro: str | None = None
    compact_intro: str | None = None
    doc: str = ""
    reached: Callable[[Step], Iterable[str]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise RegistryError(f"environment kind name {self.name!r}: expected {NAME.pattern}")
        if self.dialect not in DIALECTS:
            raise RegistryError(
                f"environment kind {self.name!r}: dialect {self.dialect!r}; expected one of "
                f"{', '.join(DIALECTS)}"
            )
        actions = tuple(self.actions)
        if not actions or not all(isinstance(a, ActionSpec) for a in actions):
            raise RegistryError(
                f"environment kind {self.name!r}: actions must be a non-empty sequence of "
                "rollout.agent.actions.ActionSpec"
            )
        if not any(issubclass(a.cls, Answer) for a in actions):
            raise RegistryError(
                f"environment kind {self.name!r}: its actions need an answer "
                "(rollout.agent.actions.Answer), the action that ends an episode"
            )
        names = [a.name for a in actions]
        if len(set(names)) != len(names):
            raise RegistryError(f"environment kind {self.name!r}: an action name repeats")
        object.__setattr__(self, "actions", actions)
        if not callable(self.make_backend):
            raise RegistryError(f"environment kind {self.name!r}: make_backend is not callable")
        if self.reached is not None and not callable(self.reached):
            raise RegistryError(f"environment kind {self.name!r}: reached is not callable")


@dataclass(frozen=True)
class TaskRequest:
    """What a task source is asked for: ``n`` tasks (None: all it has, or its default
    number) of ``split``, deterministic in ``seed``, with URLs under ``web_url``."""

    cfg: RunConfig
    web_url: str
    split: str
    n: int | None = None
    seed: int = 0

    @property
    def rollout(self) -> RolloutConfig:
        return self.cfg.rollout


# ----------------------------------------------------------------------------- the registry


class Registry(Generic[T]):
    """Names -> objects: in-tree entries registered by ``builtins`` on the first lookup,
    third-party ones from the entry-point ``group``.

    ``builtins`` lists where the in-tree entries come from, in order: ``"module:function"``
    (the module is imported and the function called with no arguments; it registers
    them) or a bare ``"module"`` (imported; it registers them as it is imported). A
    module that registers as it is imported fixes the order only when it is the one
    builtin: the first of its registrations loads the others.

    ``label`` names what is registered in messages (``unknown mode 'x'``); ``key``
    is the config key that chooses among them; ``check`` validates an object before it
    is registered (raising :class:`RegistryError`)."""

    def __init__(
        self,
        label: str,
        group: str,
        *,
        key: str = "",
        builtins: str | Sequence[str] | None = None,
        check: Callable[[str, Any], None] | None = None,
    ):
        self.label, self.group, self.key = label, group, key
        self._check = check
        self._builtins = (builtins,) if isinstance(builtins, str) else tuple(builtins or ())
        self._entries: dict[str, T] = {}
        self._plugins: dict[str, list[EntryPoint]] | None = None  # name -> entry points
        self._settled: set[str] = set()  # loaded from an entry point, or replaced by code
        self._loading_builtins = False

    # ------------------------------------------------------------------ registering

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Register ``obj`` as ``name`` and return it; a name already taken is an error
        unless ``replace``."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RegistryError(
                f"{self.label} name {name!r}: expected letters, digits, '_', '.' or '-', "
                "starting with a letter"
            )
        if self._check is not None:
            self._check(name, obj)
        if not self._loading_builtins:
            self._load_builtins()
        if name in self._entries and not replace:
            raise RegistryError(
                f"{self.label} {name!r} is registered already; pass replace=True to replace it"
            )
        self._entries[name] = obj
        if replace:  # meant to win over any plugin's entry point of the name
            self._settled.add(name)
        else:
            self._settled.discard(name)
        return obj

    def unregister(self, name: str) -> None:
        """Forget ``name`` (e.g. a test's registration)."""
        self._entries.pop(name, None)
        self._settled.discard(name)

    def refresh(self) -> None:
        """List the entry points again (after installing a plugin into a running process)."""
        self._plugins = None

    # ------------------------------------------------------------------ looking up

    def get(self, name: str) -> T:
        """The object registered as ``name``; :class:`UnknownName` (listing the known names)
        when there is none. ``registry[name]`` is the same; ``name in registry`` asks."""
        return self[name]

    def __getitem__(self, name: str) -> T:
        self._load_builtins()
        eps = self._entry_points().get(name) if isinstance(name, str) else None
        if name in self._entries:
            if eps and name not in self._settled:
                raise RegistryError(
                    f"{self.label} {name!r} is registered in the tree (or by code) and again by "
                    f"{', '.join(sorted(_dist_name(ep) for ep in eps))} in the entry-point group "
                    f"{self.group}; a plugin cannot take an existing name"
                )
            return self._entries[name]
        if not eps:
            raise UnknownName(self._unknown(name))
        if len(eps) > 1:
            dists = ", ".join(sorted(_dist_name(ep) for ep in eps))  # listing order varies by fs
            raise RegistryError(
                f"{self.label} {name!r} is registered by more than one plugin ({dists}) "
                f"in the entry-point group {self.group}; uninstall all but one"
            )
        obj = self._load(eps[0])
        self._entries[name] = obj
        self._settled.add(name)
        return obj

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries or name in self._entry_points()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> tuple[str, ...]:
        """Every registered name: in-tree ones first, in registration order, then the
        plugins' (their entry points listed, not loaded)."""
        self._load_builtins()
        return tuple(dict.fromkeys([*self._entries, *sorted(self._entry_points())]))

    # ------------------------------------------------------------------ loading

    def _unknown(self, name: object) -> str:
        where = f" ({self.key})" if self.key else ""
        return (
            f"unknown {self.label} {name!r}{where}; registered: {', '.join(self.names())}. "
            f"Plugins add more through the entry-point group {self.group}"
        )

    def _load_builtins(self) -> None:
        if not self._builtins or self._loading_builtins:
            return
        self._loading_builtins = True
        try:
            while self._builtins:  # one that fails stays, to be tried again on the next lookup
                module, _, function = self._builtins[0].partition(":")
                loaded = importlib.import_module(module)
                if function:
                    getattr(loaded, function)()
                self._builtins = self._builtins[1:]
        finally:
            self._loading_builtins = False

    def _entry_points(self) -> dict[str, list[EntryPoint]]:
        if self._plugins is None:
            found: dict[str, list[EntryPoint]] = {}
            seen: set[tuple[str, str]] = set()
            for ep in entry_points(group=self.group):
                if (ep.name, ep.value) in seen:  # one distribution seen twice on sys.path
                    continue
                seen.add((ep.name, ep.value))
                found.setdefault(ep.name, []).append(ep)
            self._plugins = found
        return self._plugins

    def _load(self, ep: EntryPoint) -> T:
        where = f"entry point {ep.name} = {ep.value} (group {self.group}) of {_dist_name(ep)}"
        try:
            obj = ep.load()
        except Exception as e:
            raise RegistryError(f"{where} failed to load: {type(e).__name__}: {e}") from e
        if self._check is not None:
            try:
                self._check(ep.name, obj)
            except RegistryError as e:
                raise RegistryError(f"{where}: {e}") from None
        return obj


def _dist_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return f"the distribution {name!r}" if name else "an unnamed distribution"


# ----------------------------------------------------------------------------- the three


def _check_kind(name: str, obj: Any) -> None:
    if not isinstance(obj, EnvKind):
        raise RegistryError(
            f"environment {name!r} is a {type(obj).__name__}; expected a rollout.registry.EnvKind"
        )
    if obj.name != name:
        raise RegistryError(f"environment kind {obj.name!r} registered as {name!r}: names differ")


def _check_callable(what: str) -> Callable[[str, Any], None]:
    def check(name: str, obj: Any) -> None:
        if not callable(obj):
            raise RegistryError(f"{what} {name!r} is a {type(obj).__name__}; expected a callable")

    return check


envs: Registry[EnvKind] = Registry(
    "mode",
    ENV_GROUP,
    key="env.kind",
    builtins=("rollout.env:register_kinds", "rollout.tools:register_kind"),
    check=_check_kind,
)
task_sources: Registry[Callable[[TaskRequest], list[dict]]] = Registry(
    "task source",
    TASK_SOURCE_GROUP,
    key="rollout.task_source",
    builtins=("rollout.tasks.sources:register_sources", "rollout.tools:register_task_source"),
    check=_check_callable("task source"),
)
verifiers: Registry[Callable[..., tuple[float, dict]]] = Registry(
    "task type",
    VERIFIER_GROUP,
    key="the task's type",
    builtins=("rollout.verifiers.scorers:register_scorers",),
    check=_check_callable("verifier"),
)
