"""The CPU backend's policy: a small causal LM with its chat tokenizer, sampled token by token
with exact logprobs, and scored on packed sequences for training.

The model is read from a local Hugging Face folder, or built from a config with random weights
and the offline Qwen2.5 tokenizer (no download). Before anything is allocated, the memory that
training needs (weights, gradients, Adam's two moments: 16 bytes a float32 parameter) is
checked against what the machine has free.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

from .._errors import ConfigurationError

TINY_QWEN2: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
"""The demo's model: a 2-layer Qwen2 (hidden size 64) over Qwen2.5's 151,665-token vocabulary,
~9.9M parameters, nearly all of them the (tied) embedding."""

FROZEN_EMBEDDING_STD = 0.5
"""The built-in model's embedding init when the embeddings are frozen (see :func:`load_policy`);
trained ones keep the config's ``initializer_range`` (0.02)."""

TRAIN_BYTES_PER_PARAMETER = 16
"""float32 weights, gradients and AdamW's two moments."""


@dataclass
class Token:
    """One sampled token: its id, its logprob under the policy, the ``k`` most likely ids."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Sample:
    """One choice as it is generated."""

    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None


class Policy:
    """A causal LM and its tokenizer; one lock orders sampling steps and training steps."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigurationError(
                "the tokenizer has no chat template, so chat messages cannot be rendered into "
                "the ids the model was trained on: use a model folder whose "
                "tokenizer_config.json (or chat_template.jinja) has a chat_template"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.RLock()
        self.threads: int | None = None
        """torch's intra-op threads; set again in each worker thread, which does not inherit
        it (an oversubscribed machine runs several times slower with too many)."""
        self.stop_ids = {
            int(i)
            for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
            if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id
        }
        endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        if isinstance(endoftext, int) and endoftext != tokenizer.unk_token_id:
            self.stop_ids.add(endoftext)
        self.model.eval()

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def max_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    # -- sampling ---------------------------------------------------------------------------

    def generate(
        self,
        prompt: list[int],
        *,
        n: int = 1,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_logprobs: int = 0,
        seed: int | None = None,
    ) -> Iterator[tuple[int, Token, Sample]]:
        """Sample ``n`` completions of ``prompt`` together, yielding each token as it comes.

        Logprobs are the model's raw ones (temperature 1, before ``top_p``), as vLLM reports
        by default, so they are what the trainer compares its own against.
        """
        # Each step sets no_grad and threads itself: a stream resumes this generator in
        # whichever worker thread is free, and both settings are per thread.
        yield from self._generate(prompt, n, max_tokens, temperature, top_p, top_logprobs, seed)

    def _generate(
        self,
        prompt: list[int],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        top_logprobs: int,
        seed: int | None,
    ) -> Iterator[tuple[int, Token, Sample]]:
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        samples = [Sample() for _ in range(n)]
        max_tokens = min(max_tokens, self.max_length - len(prompt))
        if max_tokens <= 0:
            for sample in samples:
                sample.finish_reason = "length"
            return
        with self.lock, torch.no_grad():
            self.use_threads()
            out = self.model(input_ids=torch.tensor([prompt] * n), use_cache=True, logits_to_keep=1)
        past, logits = out.past_key_values, out.logits[:, -1].float()
        for position in range(max_tokens):
            logprobs = torch.log_softmax(logits, dim=-1)
            chosen = _sample(logits, temperature, top_p, generator)
            tops = torch.topk(logprobs, top_logprobs, dim=-1) if top_logprobs else None
            for i, sample in enumerate(samples):
                if sample.finish_reason is not None:
                    continue
                token_id = int(chosen[i])
                token = Token(token_id, float(logprobs[i, token_id]))
                if tops is not None:
                    token.top = [
                        (int(t), float(v))
                        for t, v in zip(tops.indices[i], tops.values[i], strict=True)
                    ]
                sample.tokens.append(token)
                if token_id in self.stop_ids:
                    sample.finish_reason = "stop"
                elif position == max_tokens - 1:
                    sample.finish_reason = "length"
                yield i, token, sample
            if all(s.finish_reason is not None for s in samples):
                return
            with self.lock, torch.no_grad():
                self.use_threads()
                out = self.model(input_ids=chosen[:, None], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()

    def use_threads(self) -> None:
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    # -- training ---------------------------------------------------------------------------

    def token_logprobs(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
        needed: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For one packed row (``[1, seq]``), per position ``i`` where ``needed``: the logprob
        of token ``i + 1`` and the entropy of the distribution it was drawn from (ART's
        alignment); zero elsewhere. ``allowed`` is the row's ``[1, seq, seq]`` attention
        pattern. Only the needed positions pay for the vocabulary-wide projection.
        """
        keep = torch.nonzero(needed[0]).squeeze(-1)
        bias = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, -torch.inf)
        logits = self.model(
            input_ids=tokens.clamp_min(0),
            position_ids=positions,
            attention_mask=bias[:, None],
            use_cache=False,
            logits_to_keep=keep,
        ).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        following = tokens[:, 1:].clamp_min(0)[:, keep]
        chosen = torch.zeros(tokens.shape, dtype=torch.float32)
        chosen = chosen.index_put(
            (torch.zeros_like(keep), keep),
            logprobs[0].gather(-1, following[0][:, None]).squeeze(-1),
        )
        entropies = torch.zeros(tokens.shape, dtype=torch.float32)
        with torch.no_grad():
            entropies[0, keep] = -(logprobs[0].exp() * logprobs[0]).sum(-1)
        return chosen, entropies


def _sample(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    # Inverse CDF: over a 150k vocabulary, several times faster than torch.multinomial.
    cdf = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def attention_pattern(group_ids: torch.Tensor, parent_ids: torch.Tensor) -> torch.Tensor:
    """Who may attend to whom in ART's packed rows: causal, within one sequence or from a
    sequence to the shared prefix it continues (``art/unsloth/train.py``'s ``calculate_mask``)."""
    seq_len = group_ids.shape[1]
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
    same = group_ids[:, :, None] == group_ids[:, None, :]
    parent = parent_ids[:, :, None] == group_ids[:, None, :]
    return causal[None] & (same | parent)


# -- loading ----------------------------------------------------------------------------------


def load_policy(
    model: str | Path | None = None,
    config: Mapping[str, Any] | None = None,
    seed: int = 0,
    *,
    frozen_embeddings: bool = False,
) -> Policy:
    """The policy from a local model folder, or a random-weight model from ``config`` (a
    Qwen2 config's fields over :data:`TINY_QWEN2`) with the offline Qwen2.5 tokenizer.
    ``frozen_embeddings``: the built-in model's embeddings will not be trained, so they are
    drawn wider (:data:`FROZEN_EMBEDDING_STD`)."""
    torch.manual_seed(seed)
    if model is not None:
        folder = Path(model)
        if not (folder / "config.json").is_file():
            raise ConfigurationError(
                f"{folder} is not a Hugging Face model folder (no config.json): give the path "
                "of a folder saved with save_pretrained, or no model for the built-in tiny one"
            )
        hf_config = AutoConfig.from_pretrained(folder)
        check_memory(_count_parameters(hf_config), str(folder))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigurationError(
                f"{folder} has no chat template (tokenizer_config.json 'chat_template' or "
                "chat_template.jinja): without it chat messages cannot be rendered into the "
                "model's ids; add the template of the model it was fine-tuned from"
            )
        weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return Policy(weights, tokenizer)
    from ._qwen_tokenizer import cached_qwen_tokenizer

    tokenizer = cached_qwen_tokenizer()
    hf_config = Qwen2Config(
        **{**TINY_QWEN2, "vocab_size": len(tokenizer), **(config or {})},
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    check_memory(_count_parameters(hf_config), "the configured model")
    weights = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    if frozen_embeddings:
        # Frozen tied embeddings must separate tokens from the start, so they are drawn wider
        # than the usual 0.02. Trained ones keep 0.02: wide ones make the first logits sharp,
        # and GRPO then collapses onto one answer before it learns (measured on the demo).
        torch.nn.init.normal_(weights.get_input_embeddings().weight, std=FROZEN_EMBEDDING_STD)
    return Policy(weights, tokenizer)


def _count_parameters(config: Any) -> int:
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in shell.parameters())


def check_memory(parameters: int, what: str) -> None:
    """Refuse a model whose training state would not fit in the memory free now."""
    needed = parameters * TRAIN_BYTES_PER_PARAMETER
    available = available_memory()
    if available is not None and needed > available:
        raise ConfigurationError(
            f"{what} has {parameters / 1e6:,.0f}M parameters: training it on CPU needs about "
            f"{needed / 2**30:.1f} GiB (float32 weights, gradients and Adam state), but only "
            f"{available / 2**30:.1f} GiB is free. Use a smaller model (fewer layers, a smaller "
            "hidden size) or a GPU backend (art.LocalBackend)"
        )


def available_memory() -> int | None:
    """Bytes of memory free for a new allocation (MemAvailable on Linux), if known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
