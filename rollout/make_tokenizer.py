"""`python -m rollout.make_tokenizer --out shared/assets/tiny_tokenizer`: the tiny tokenizer.

Trains the embedded default's byte-level BPE tokenizer on what the policy reads
and writes: the local web's visible text (a bounded, deterministic sample of its
pages), the three action descriptions with their examples, and train-split task
questions with their gold actions written in each dialect. ChatML special tokens
(``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) take ids 0, 1, 2; digits
are split one per token, as Qwen2 and Llama 3 do. The output is a Hugging Face
tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json`` with the
ChatML chat template) that ``shared.tokenizer.load_tokenizer`` reads like any
checkpoint's. The same inputs give byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rollout.agent.actions import ACTIONS, EXAMPLE_SITE, MODES, describe_actions, render_call
from shared.tokenizer import CHATML_TEMPLATE
from shared.tokenizer import Tokenizer as ChatTokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 4096
MAX_LENGTH = 1024

# Corpus bounds: what keeps training under a minute on two cores.
PAGE_CHARS = 3000  # characters kept of one page
STRIDE = {"geo": 40, "airports": 20}  # every n-th page of the big sites; all of the others
DOCS_PAGES = 200  # Python docs pages, spread evenly
TASKS = 1500
CHAT_EVERY = 5  # one task in five also appears as a chat


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> ChatTokenizer:
    """A byte-level BPE tokenizer with ChatML special tokens, trained on ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return ChatTokenizer(tok, tokenizer_config(), CHATML_TEMPLATE)


def tokenizer_config() -> dict:
    """``tokenizer_config.json`` as ``transformers`` (and so SGLang) reads it."""
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }


# ----------------------------------------------------------------------------- the corpus


def action_texts() -> Iterator[str]:
    """Each mode's action description and its examples."""
    for mode in MODES:
        yield describe_actions(mode, ("127.0.0.1", "localhost"))
        for spec in ACTIONS[mode]:
            yield spec.example


def gold_action_texts(step: dict) -> Iterator[str]:
    """One gold action in the api mode's XML and in the call dialects."""
    name, args = step["action"], step.get("args", {})
    yield f"<action>{name}</action>" + "".join(f"<{k}>{v}</{k}>" for k, v in args.items())
    if name == "visit":
        name = "goto"
    yield render_call(name, args)


def task_texts(lw, n: int = TASKS) -> Iterator[str]:
    """Train-split questions and their gold actions, some framed as ChatML turns."""
    from rollout.tasks.generate import generate

    for i, task in enumerate(generate(lw, "train", n, seed=0, base_url=EXAMPLE_SITE)):
        yield task["question"]
        yield f"<answer>{task['answer']}</answer>"
        actions = [t for step in task.get("gold_path", []) for t in gold_action_texts(step)]
        yield from actions
        if i % CHAT_EVERY == 0:
            yield chatml(task["question"], actions[0] if actions else task["answer"])


def chatml(question: str, reply: str) -> str:
    """One system / user / assistant exchange as the chat template renders it."""
    turns = [("system", "You are a research agent."), ("user", question), ("assistant", reply)]
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)


def page_texts(lw) -> Iterator[str]:
    """A deterministic sample of the local web's visible text."""
    counts: dict[str, int] = {}
    for path in sorted(lw.site.pages):
        page = lw.site.pages[path]
        i = counts[page.site] = counts.get(page.site, -1) + 1
        if i % STRIDE.get(page.site, 1) == 0:
            yield f"{page.title}\n{EXAMPLE_SITE}{path}\n{page.text[:PAGE_CHARS]}"
    docs = sorted(lw.docs)
    step = max(1, len(docs) // DOCS_PAGES)
    for path in docs[::step]:
        yield lw.docs[path].text[:PAGE_CHARS]


def corpus(lw) -> list[str]:
    return [*action_texts(), *task_texts(lw), *page_texts(lw)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.make_tokenizer", description=__doc__)
    parser.add_argument("--out", required=True, help="directory to write the tokenizer into")
    parser.add_argument("--web-cache", default=".cache/web", help="the local web's build cache")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    from rollout.web.build import load

    t0 = time.monotonic()
    texts = corpus(load(args.web_cache))
    chars = sum(len(t) for t in texts)
    print(f"corpus: {len(texts):,} texts, {chars:,} characters", file=sys.stderr)
    tok = train_tokenizer(texts, args.vocab_size)
    tok.save(args.out)
    print(
        f"wrote {args.out}: vocab {tok.vocab_size} ({time.monotonic() - t0:.1f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
