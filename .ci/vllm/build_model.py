"""Build the tiny random-weight Qwen2 model folder that `make test-vllm` serves with vLLM.

Runs in `.venv-vllm` (Python 3.11, vLLM's own transformers and torch). The tokenizer is the
project's offline Qwen2.5-Instruct one (src/arttrace/training/_qwen_tokenizer.py, loaded by path
so arttrace need not be installed here) plus Qwen3's four extra tokens at their Qwen3 ids
(<tool_response> 151665, </tool_response> 151666, <think> 151667, </think> 151668), which the
reasoning parser looks up in the vocabulary. The chat template is Qwen2.5's, which renders
`tools` the way the hermes tool parser expects. Hidden size 128 gives head_dim 32: vLLM's CPU
attention rejects head_dim 16 (hidden 64). Nothing here touches the network.

Usage: python build_model.py <folder>   (does nothing when <folder> is already complete)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRA_TOKENS = [("<tool_response>", 151665), ("</tool_response>", 151666)]
THINK_TOKENS = [("<think>", 151667), ("</think>", 151668)]
STAMP = "arttrace-tiny-qwen2.json"
# Qwen2.5-Instruct's prompt ids for one user message "Hello world" (tests/training/test_art_accepts.py).
HELLO_WORLD = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446]
HELLO_WORLD += [525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 9707, 1879, 151645]
HELLO_WORLD += [198, 151644, 77091, 198]


def load_tokenizer_module():  # type: ignore[no-untyped-def]
    path = ROOT / "src" / "arttrace" / "training" / "_qwen_tokenizer.py"
    spec = importlib.util.spec_from_file_location("_arttrace_qwen_tokenizer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(folder: Path) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import Qwen2Config, Qwen2ForCausalLM

    qwen = load_tokenizer_module()
    tokenizer = qwen.qwen_tokenizer()
    for content, wanted in EXTRA_TOKENS + THINK_TOKENS:
        tokenizer.add_tokens([AddedToken(content, special=False, normalized=False)])
        got = tokenizer.convert_tokens_to_ids(content)
        if got != wanted:
            raise SystemExit(f"{content} got id {got}, Qwen3 has {wanted}")
    tokenizer.chat_template = qwen.CHAT_TEMPLATE

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936,  # Qwen2.5's embedding size (the tokenizer's ids stop at 151668)
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # vLLM reads the chat template from the tokenizer config; keep a plain copy beside it too.
    (folder / "chat_template.jinja").write_text(qwen.CHAT_TEMPLATE)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})
    )
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello world"}], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if ids != HELLO_WORLD:
        raise SystemExit(f"the tokenizer's chat template gives {ids}, Qwen2.5 gives {HELLO_WORLD}")
    (folder / STAMP).write_text(json.dumps({"hello_world_prompt_ids": ids}))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    folder = Path(sys.argv[1])
    if (folder / STAMP).is_file() and (folder / "model.safetensors").is_file():
        print(f"model folder {folder} already built")
        return
    build(folder)
    print(f"built model folder {folder}")


if __name__ == "__main__":
    main()
