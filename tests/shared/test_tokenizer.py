"""The tokenizer and chat template: the tiny asset, real-checkpoint-style templates, files."""

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from shared.tokenizer import (
    TINY_TOKENIZER_DIR,
    ChatTemplateError,
    Tokenizer,
    copy_tokenizer_files,
    load_tokenizer,
    read_tokenizer_files,
    write_tokenizer_files,
)

# Qwen2's ChatML template as its checkpoints ship it (tools branch left out): a default
# system message when the chat has none.
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'system' and loop.first %}{%- continue %}{%- endif %}\n"
    "    {%- if message.role not in ['user', 'assistant', 'system'] %}\n"
    "        {{- raise_exception('Unexpected role: ' + message.role) }}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# A Llama-3-style template: the bos token comes from the tokenizer config.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def _word_level_dir(tmp_path, specials, template, config_extra):
    """A real tokenizer.json (word level) plus a tokenizer_config.json, as a checkpoint has."""
    words = ["hi", "there", "system", "user", "assistant", "You", "are", "a", "helpful", "."]
    vocab = {t: i for i, t in enumerate([*specials, *words, "[UNK]"])}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": template, **config_extra}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_dir(tmp_path)


def test_tiny_tokenizer_special_ids_and_size():
    tok = load_tokenizer()
    assert tok.vocab_size == 4096
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [
        0,
        1,
        2,
    ]
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (2, 0, None)
    assert tok.stop_ids == (2, 0)


def test_tiny_tokenizer_round_trips_text_bytes_and_actions():
    tok = load_tokenizer()
    for text in [
        "<action>search</action><query>capital of Sidi Mérouane</query>",
        'goto("http://127.0.0.1:8900/geo/city/1270723")',
        "population 48,141 · 日本 🙂 tabs\tand\nnewlines",
    ]:
        assert tok.decode(tok.encode(text)) == text
    # digits are split one per token (copying numbers token by token)
    assert [tok.id_to_token(i) for i in tok.encode("2024")] == ["2", "0", "2", "4"]


def test_tiny_chat_template_renders_chatml_and_ids():
    tok = load_tokenizer()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, tokenize=True)
    assert ids == tok.chat_ids(messages) == tok.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # two <|im_start|>... <|im_end|> turns closed
    assert tok.decode(ids, skip_special_tokens=False) == text
    with pytest.raises(ChatTemplateError, match="unknown role robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])


def test_qwen2_style_template_default_system_and_raise_exception(tmp_path):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _word_level_dir(
        tmp_path,
        specials,
        QWEN2_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    )
    text = tok.apply_chat_template([{"role": "user", "content": "hi there"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (2, 0, None)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi there"}], tokenize=True)
    assert ids[:2] == [1, tok.token_to_id("system")]
    with pytest.raises(ChatTemplateError, match="Unexpected role: tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_bos_token_as_added_token_dict_and_pad_falls_back_to_eos(tmp_path):
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = _word_level_dir(
        tmp_path,
        specials,
        LLAMA3_TEMPLATE,
        {
            "bos_token": {"content": "<|begin_of_text|>", "__type": "AddedToken"},
            "eos_token": "<|eot_id|>",
        },
    )
    text = tok.apply_chat_template([{"role": "user", "content": " hi "}])
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tok.bos_id == 0 and tok.eos_id == 3 and tok.pad_id == 3


def test_template_file_wins_and_named_templates(tmp_path):
    tok = _word_level_dir(tmp_path, ["<s>"], [{"name": "default", "template": "D"}], {})
    assert tok.apply_chat_template([]) == "D"
    (tmp_path / "chat_template.jinja").write_text("F{{ messages | length }}")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user"}]) == "F1"


def test_tokenizer_files_copy_and_round_trip(tmp_path):
    files = read_tokenizer_files(TINY_TOKENIZER_DIR)
    assert sorted(files) == ["tokenizer.json", "tokenizer_config.json"]
    write_tokenizer_files(files, tmp_path / "a")
    assert copy_tokenizer_files(tmp_path / "a", tmp_path / "b") == sorted(files)
    a, b = load_tokenizer(tmp_path / "a"), load_tokenizer(tmp_path / "b")
    assert (
        a.encode("Seek › Atlas")
        == b.encode("Seek › Atlas")
        == load_tokenizer().encode("Seek › Atlas")
    )
    with pytest.raises(ValueError, match="not a tokenizer file"):
        write_tokenizer_files({"../evil": ""}, tmp_path / "c")
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_dir(tmp_path / "missing")


def test_training_is_deterministic(tmp_path):
    """The tiny tokenizer's training function gives identical files for identical input."""
    from rollout.make_tokenizer import action_texts, train_tokenizer

    corpus = [*action_texts(), "The population of Gumia is 48,141."] * 20
    for name in ("a", "b"):
        train_tokenizer(corpus, vocab_size=400).save(tmp_path / name)
    assert (tmp_path / "a/tokenizer.json").read_bytes() == (
        tmp_path / "b/tokenizer.json"
    ).read_bytes()
    tok = load_tokenizer(tmp_path / "a")
    assert tok.vocab_size == 400 and tok.eos_id == 2
    assert tok.decode(tok.encode("<action>search</action>")) == "<action>search</action>"
