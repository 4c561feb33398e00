"""The tokenizer and chat template both sides of a run agree on.

A tokenizer is a Hugging Face checkpoint's tokenizer files: ``tokenizer.json``
(read with the ``tokenizers`` library) and ``tokenizer_config.json`` (special
tokens and the Jinja chat template; a ``chat_template.jinja`` file beside it wins,
as newer checkpoints ship it). The template is rendered the way ``transformers``
renders it (sandboxed Jinja, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
``tojson``, the special tokens as variables), so a real Qwen or Llama checkpoint's
tokenizer and the built-in tiny one load through the same code:
:func:`load_tokenizer`.

The rollout side renders prompts with it, the learner and ``learner.serve``
decode with it, and checkpoints carry its files (:data:`TOKENIZER_FILES`). This
module imports neither JAX nor the rollout package.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

TINY_TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "tiny_tokenizer"

# Files of a tokenizer directory that are copied into checkpoints and exports.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)

# ChatML, as Qwen2 checkpoints frame turns; the tiny tokenizer ships it. No default
# system message: the environment always writes one.
CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}\n"
    "{{- raise_exception('unknown role ' + message['role'] + "
    "'; expected system, user, assistant or tool') }}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


class ChatTemplateError(ValueError):
    """A chat template refused the messages (its ``raise_exception``) or failed to render."""


def _token_content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"cannot read special token {value!r}")


def _select_template(raw: Any) -> str | None:
    """``chat_template`` may be a string or a list of named templates (``default`` is used)."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        return named.get("default") or next(iter(named.values()), None)
    raise ValueError(f"cannot read chat_template of type {type(raw).__name__}")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    # transformers' filter: no ASCII escaping, unlike Jinja's HTML-safe built-in
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class Tokenizer:
    """Encode, decode and render chats for one model.

    ``eos_id`` is the token that ends an assistant turn (the generation stop
    token); ``pad_id`` pads batches (``eos_id`` when the checkpoint names none);
    ``bos_id`` is None for tokenizers without one (Qwen2, the tiny tokenizer).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        config: Mapping[str, Any],
        chat_template: str | None,
        path: Path | None = None,
    ) -> None:
        self.backend = backend
        self.config = dict(config)
        self.chat_template = chat_template
        self.path = path
        self.special_tokens: dict[str, str | None] = {
            name: _token_content(config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self.bos_id = self._id_of(self.special_tokens["bos_token"])
        self.eos_id = self._id_of(self.special_tokens["eos_token"])
        pad = self._id_of(self.special_tokens["pad_token"])
        self.pad_id = pad if pad is not None else self.eos_id
        self._template = _environment().from_string(chat_template) if chat_template else None

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        tid = self.backend.token_to_id(token)
        if tid is None:
            raise ValueError(f"special token {token!r} is not in the vocabulary")
        return tid

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` and ``tokenizer_config.json`` from a checkpoint directory."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json")
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config_path = path / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template_file = path / "chat_template.jinja"
        if template_file.is_file():
            template = template_file.read_text()
        else:
            template = _select_template(config.get("chat_template"))
        return cls(backend, config, template, path)

    # ------------------------------------------------------------------------- tokens

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, added special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end generation by default: eos, and the pad/end-of-text token if special."""
        ids = [self.eos_id] if self.eos_id is not None else []
        eot = self.backend.token_to_id("<|endoftext|>")
        if eot is not None and eot not in ids:
            ids.append(eot)
        return tuple(ids)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special-token strings in it map to their ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------------- chat

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render ``messages`` with the chat template; token ids when ``tokenize``.

        Extra keyword arguments (``tools``, ``enable_thinking``...) reach the
        template as variables, as in ``transformers``.
        """
        if self._template is None:
            raise ChatTemplateError(f"tokenizer at {self.path} has no chat template")
        variables = {k: v for k, v in self.special_tokens.items() if v is not None}
        variables.update(kwargs)
        try:
            text = self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **variables
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
        return self.encode(text) if tokenize else text

    def chat_ids(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """The rendered chat as token ids (``apply_chat_template(..., tokenize=True)``)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))  # type: ignore[arg-type]

    # ------------------------------------------------------------------------- files

    def save(self, out_dir: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (template inside) to a directory."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        config = dict(self.config)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """The tokenizer in ``path`` (a checkpoint directory), or the built-in tiny one."""
    return Tokenizer.from_dir(TINY_TOKENIZER_DIR if path is None else path)


def tokenizer_files(path: str | Path) -> list[Path]:
    """The tokenizer files present in a directory, in :data:`TOKENIZER_FILES` order."""
    path = Path(path)
    return [path / name for name in TOKENIZER_FILES if (path / name).is_file()]


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy a directory's tokenizer files into ``dst``; the names copied."""
    files = tokenizer_files(src)
    if not files:
        raise FileNotFoundError(f"{src}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    Path(dst).mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, Path(dst) / f.name)
    return [f.name for f in files]


def read_tokenizer_files(path: str | Path) -> dict[str, str]:
    """The tokenizer files of a directory as ``{name: text}`` (for storing in a checkpoint)."""
    return {f.name: f.read_text() for f in tokenizer_files(path)}


def write_tokenizer_files(files: Mapping[str, str], dst: str | Path) -> None:
    """Write ``{name: text}`` (from :func:`read_tokenizer_files`) into a directory."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if name not in TOKENIZER_FILES:
            raise ValueError(f"not a tokenizer file name: {name!r}")
        (Path(dst) / name).write_text(text)
