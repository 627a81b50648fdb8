"""``CPUBackend``: ART's backend protocol on a CPU, for a small model, with no GPU or download.

It serves the policy on 127.0.0.1 like vLLM (``model.openai_client()`` and any OpenAI client
work against it) and trains with ART's own pipeline: ``tokenize_trajectory_groups`` →
``packed_tensors_from_tokenized_results`` → ``loss_fn``, then a torch AdamW step on the full
weights, which the next request samples from. Each step is checkpointed as a Hugging Face folder
(``{model base_path}/{project}/models/{name}/checkpoints/{step:04d}``), which
``CPUBackend(model=...)`` can load again; registering a model that has checkpoints resumes from
the latest.

One backend hosts several models at once (a router and a greeter, each ``await
model.register(backend)``): each gets its own copy of the base weights, optimizer and step
count, the server answers each under its own name (and ``name@step``), and ``train`` changes
only the model it is given.

The same ``seed``, requests and ``threads`` on one machine give the same run: the weights, each
request's samples (:class:`~arttrace.training._cpu_server.SamplingSeeds`) and each training
step, whatever order concurrent requests arrive or finish in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import shutil
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import art
import torch
from art import dev
from art.loss import LossInputs, LossOffPolicyDiagnosticsAccumulator, loss_fn
from art.preprocessing.pack import packed_tensors_from_tokenized_results
from art.preprocessing.tokenize import (
    TokenizedResult,
    tokenize_sft_batch,
    tokenize_trajectory_groups,
)

from .._errors import ConfigurationError, TrainingError
from ._cpu_model import Policy, attention_pattern, load_policy
from ._cpu_server import PolicyServer, SamplingSeeds, Served

_log = logging.getLogger("arttrace")


@dataclass(eq=False)
class _Hosted:
    """One registered model's state: its weights, optimizer, steps trained and sampling seeds."""

    model: Any
    policy: Policy
    seeds: SamplingSeeds = field(init=False)
    step: int = 0
    optimizer: torch.optim.Optimizer | None = None
    training: asyncio.Future[dict[str, float]] | None = None
    """The last ``train``'s thread (it outlives a cancelled caller)."""

    def sampling(self, seed: int, salt: str) -> _Hosted:
        self.seeds = SamplingSeeds(seed, lambda: self.step, salt)
        return self


class CPUBackend:
    """An ART backend that samples and trains a small causal LM on this machine's CPU.

    ``model``: a local Hugging Face model folder (it must have a chat template); without one,
    a random-weight Qwen2 built from ``config`` (fields over
    :data:`arttrace.training._cpu_model.TINY_QWEN2`) with the offline Qwen2.5 tokenizer.
    ``seed``: seeds the built-in model's weights and the sampling of requests that bring no
    ``seed`` of their own: the same seed, requests and ``threads`` give the same run.
    ``threads``: torch's intra-op threads for this process (``None`` leaves torch's default;
    on a shared machine 1 is often fastest). ``max_tokens``: a request's default completion
    limit. ``train_embeddings=False`` freezes the token embeddings and output projection: with
    a 150k vocabulary they are most of a small model's parameters and of its training time.
    ``keep_checkpoints``: how many of the latest step checkpoints to keep on disk (default 2:
    the one a registration resumes from and the one before; ``None``: all). Each is a full copy
    of the weights (55 MB for the tiny model), so keeping all fills a disk in a long run.

    Each ART model registered gets its own weights, starting from the same base (``model``
    or the seeded built-in one), its own optimizer and step count; the first registered trains
    on :attr:`policy`, built here, and samples as a one-model backend does.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int = 0,
        threads: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_tokens: int = 256,
        train_embeddings: bool = True,
        keep_checkpoints: int | None = 2,
    ) -> None:
        if keep_checkpoints is not None and keep_checkpoints < 1:
            raise ConfigurationError(
                f"keep_checkpoints={keep_checkpoints}: keep at least 1 (the one the next "
                "registration resumes from), or None to keep them all"
            )
        self._keep = keep_checkpoints
        if threads is not None:
            torch.set_num_threads(threads)
        self._source, self._config, self._seed = model, config, seed
        self._threads, self._train_embeddings = threads, train_embeddings
        self.policy: Policy = self._build_policy()
        """The first registered model's policy (the base weights until it trains)."""
        self._host, self._port, self._max_tokens = host, port, max_tokens
        self._server: PolicyServer | None = None
        self._hosted: dict[str, _Hosted] = {}
        """Each registered model's state, by model name, in the order they registered."""

    def _build_policy(self) -> Policy:
        policy = load_policy(
            self._source, self._config, self._seed, frozen_embeddings=not self._train_embeddings
        )
        policy.threads = self._threads
        if not self._train_embeddings:
            for module in (
                policy.model.get_input_embeddings(),
                policy.model.get_output_embeddings(),
            ):
                module.weight.requires_grad_(False)
        return policy

    def _another_policy(self) -> Policy:
        """The base weights again, for a second model (the caller's torch RNG left as it was),
        sharing the first's tokenizer."""
        with torch.random.fork_rng(devices=[]):
            built = self._build_policy()
        policy = Policy(built.model, self.policy.tokenizer)
        policy.threads = self._threads
        return policy

    # -- ART's Backend protocol -------------------------------------------------------------

    async def register(self, model: Any) -> None:
        """Host ``model``: a new name gets its own copy of the base weights (resumed from its
        latest checkpoint when it has one); a name registered before keeps its weights."""
        name = str(model.name)
        if (hosted := self._hosted.get(name)) is not None:
            hosted.model = model
            return
        first = not self._hosted
        if first:  # claimed at once: a concurrent registration builds its own weights
            self._hosted[name] = hosted = _Hosted(model, self.policy).sampling(self._seed, "")
        else:
            policy = await asyncio.to_thread(self._another_policy)
            if name in self._hosted:  # registered concurrently while the weights were built
                self._hosted[name].model = model
                return
            self._hosted[name] = hosted = _Hosted(model, policy).sampling(self._seed, name)
        if getattr(model, "trainable", False):
            latest = self._checkpoints(model)
            if latest:
                step, folder = latest[-1]
                await asyncio.to_thread(self._load, hosted, folder)
                hosted.step = step

    async def _prepare_backend_for_training(
        self, model: Any, config: Any = None
    ) -> tuple[str, str]:
        if self._server is None:
            self._server = PolicyServer(
                self.policy,
                self._served,
                host=self._host,
                port=self._port,
                max_tokens=self._max_tokens,
            )
            await asyncio.to_thread(self._server.start)
        return self._server.base_url, self._server.api_key

    def _model_inference_name(self, model: Any, step: int | None = None) -> str:
        return str(model.name)

    async def _get_step(self, model: Any) -> int:
        """The steps trained, once a training step still running has ended (its caller was
        cancelled; see :meth:`train`)."""
        hosted = self._hosted.get(str(model.name))
        if hosted is None:
            return 0
        training = hosted.training
        if training is not None and not training.done():
            with contextlib.suppress(Exception):  # a failed step did not count: its error
                await asyncio.shield(training)  # went to its own caller
        return hosted.step

    async def _delete_checkpoint_files(self, model: Any, steps_to_keep: list[int]) -> None:
        """``model.delete_checkpoints()``: the latest is kept whatever ``steps_to_keep`` says
        (it holds the weights being served, which a registration resumes from)."""
        found = self._checkpoints(model)
        for step, folder in found[:-1]:
            if step not in steps_to_keep:
                shutil.rmtree(folder, ignore_errors=True)

    @contextlib.asynccontextmanager
    async def exact_adapter_lease(self, model: Any, step: int) -> AsyncIterator[None]:
        yield  # full weights, updated in place: there is no adapter to hold

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.stop)

    @property
    def base_url(self) -> str | None:
        """The server's OpenAI base URL once a model is registered."""
        return self._server.base_url if self._server else None

    async def train(
        self,
        model: Any,
        trajectory_groups: Iterable[art.TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        loss_fn: Literal["cispo", "ppo"] = "cispo",
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        advantage_balance: float = 0.0,
        scale_rewards: bool = True,
        importance_sampling_level: Literal[
            "token", "sequence", "average", "geometric_average"
        ] = "token",
        max_negative_advantage_importance_sampling_weight: float | None = None,
        mask_prob_ratio: bool = False,
        kimi_k2_tau: float | None = None,
        allow_training_without_logprobs: bool = False,
        packed_sequence_length: int | None = None,
        max_grad_norm: float = 1.0,
        save_checkpoint: bool = True,
        **unsupported: Any,
    ) -> art.TrainResult:
        """One optimizer step on the groups with ART's loss; returns ART's loss figures
        (``loss``, ``entropy``, ``probs_corr``, ``grad_norm``, off-policy diagnostics, token
        counts and seconds). The keyword arguments are ``LocalBackend.train``'s that apply."""
        if unsupported:
            raise ConfigurationError(
                f"CPUBackend.train does not support {sorted(unsupported)}: remove them (its "
                "options are LocalBackend's loss, advantage and packing arguments; there is no "
                "reference model for a KL penalty)"
            )
        hosted = self._check_model(model)
        config: dev.TrainConfig = {
            "ppo": loss_fn == "ppo",
            "importance_sampling_level": importance_sampling_level,
            "mask_prob_ratio": mask_prob_ratio,
        }
        for key, value in (
            ("epsilon", epsilon),
            ("epsilon_high", epsilon_high),
            ("kimi_k2_tau", kimi_k2_tau),
            (
                "max_negative_advantage_importance_sampling_weight",
                max_negative_advantage_importance_sampling_weight,
            ),
        ):
            if value is not None:
                config[key] = value  # type: ignore[literal-required]
        groups = list(trajectory_groups)

        def step() -> dict[str, float]:
            """The optimizer step, the step count and the checkpoint, in one thread."""
            metrics = self._train_step(
                hosted,
                groups,
                config,
                learning_rate,
                advantage_balance,
                scale_rewards,
                allow_training_without_logprobs,
                packed_sequence_length,
                max_grad_norm,
            )
            if metrics.get("num_gradient_steps"):
                hosted.step += 1
                if save_checkpoint:
                    self._save(hosted, model)
            return metrics

        # Cancelling the caller (a notebook's interrupt, Ctrl-C under asyncio.run, a timeout)
        # cannot stop the thread: the weights change whatever happens. So the step count and
        # the checkpoint change with them, in the thread, and _get_step waits for it: a
        # resumed Trainer sees that the groups trained and does not train them twice.
        training = hosted.training = asyncio.ensure_future(asyncio.to_thread(step))
        metrics = await asyncio.shield(training)
        return art.TrainResult(step=hosted.step, metrics=metrics)

    async def _train_sft(
        self,
        model: Any,
        trajectories: Iterable[art.Trajectory],
        config: art.TrainSFTConfig,
        dev_config: Any,
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """Supervised fine-tuning on the trajectories' assistant turns, one optimizer step per
        batch (``config.batch_size``, 8 for ``"auto"``), through ART's ``tokenize_sft_batch``."""
        from art.utils.model_config import get_instruction_response_parts

        hosted = self._check_model(model)
        tokenizer = hosted.policy.tokenizer
        instruction, response = get_instruction_response_parts(model.base_model, tokenizer)
        items = list(trajectories)
        size = 8 if config.batch_size == "auto" else int(config.batch_size)
        for number, start in enumerate(range(0, len(items), size)):
            rate = (
                config.learning_rate[number]
                if isinstance(config.learning_rate, list)
                else config.learning_rate
            )
            batch = tokenize_sft_batch(
                items[start : start + size],
                rate,
                tokenizer,
                instruction,
                response,
                max_seq_length=hosted.policy.max_length,
                assistant_turns=config.assistant_turns,
            )
            if batch.num_trainable_tokens:
                yield await asyncio.to_thread(
                    self._sft_step, hosted, batch.trajectory_tensors, rate
                )
        hosted.step += 1
        await asyncio.to_thread(self._save, hosted, model)

    # -- training ---------------------------------------------------------------------------

    def _train_step(
        self,
        hosted: _Hosted,
        groups: list[art.TrajectoryGroup],
        config: dev.TrainConfig,
        learning_rate: float,
        advantage_balance: float,
        scale_rewards: bool,
        allow_training_without_logprobs: bool,
        packed_sequence_length: int | None,
        max_grad_norm: float,
    ) -> dict[str, float]:
        started = time.perf_counter()
        results = _canonical(
            tokenize_trajectory_groups(
                hosted.policy.tokenizer,
                [_by_reward(g) for g in groups],
                allow_training_without_logprobs=allow_training_without_logprobs,
                scale_rewards=scale_rewards,
                shuffle_group_trajectories=False,  # _canonical shuffles, as ART would
            )
        )
        if not results:
            _log.warning(
                "CPUBackend.train: no trajectory had a non-zero advantage and trainable "
                "tokens, so this step trains nothing; groups need rewards that differ and "
                "turns captured with logprobs and token ids"
            )
            return {"num_gradient_steps": 0.0, "num_trajectories": 0.0}
        longest = max(len(r.token_ids) for r in results)
        # Long rows: many sequences share one forward pass, which is what costs on a CPU.
        seq_len = packed_sequence_length or min(
            hosted.policy.max_length, max(1024, 64 * math.ceil(longest / 64))
        )
        packed = packed_tensors_from_tokenized_results(
            results,
            seq_len,
            pad_token_id=-100,
            advantage_balance=advantage_balance,
            verbosity=0,
        )
        rows = packed["tokens"].shape[0]
        optimizer = self._optimizer_for(hosted, learning_rate)
        policy = hosted.policy
        policy.use_threads()
        diagnostics = LossOffPolicyDiagnosticsAccumulator()
        totals = {"loss": 0.0, "entropy": 0.0, "probs_corr": 0.0}
        keys = ["tokens", "group_ids", "parent_ids", "input_pos", "assistant_mask", "logprobs"]
        keys += ["advantages", "weights"]
        tensors: dict[str, torch.Tensor] = {k: packed[k] for k in keys}  # type: ignore[literal-required]
        with policy.lock:
            policy.model.train()
            optimizer.zero_grad()
            for row in range(rows):
                inputs: Any = {k: v[row : row + 1] for k, v in tensors.items()}
                pattern = attention_pattern(inputs["group_ids"], inputs["parent_ids"])
                needed = torch.nn.functional.pad(inputs["assistant_mask"][:, 1:], (0, 1))
                new_logprobs, entropies = policy.token_logprobs(
                    inputs["tokens"], inputs["input_pos"], pattern, needed
                )
                # loss_fn shifts entropies one place left of the logprobs (ART's convention).
                entropies = torch.nn.functional.pad(entropies[:, :-1], (1, 0))
                loss = loss_fn(LossInputs(inputs=inputs), new_logprobs, None, entropies, config)
                (loss.policy_loss / rows).backward()
                totals["loss"] += float(loss.policy_loss.detach()) / rows
                entropy = loss.entropy.detach() if loss.entropy is not None else 0.0
                totals["entropy"] += float(entropy) / rows
                totals["probs_corr"] += float(loss.probs_corr.detach()) / rows
                diagnostics.add(loss.offpolicy_diagnostics)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_grad_norm)
            optimizer.step()
            policy.model.eval()
        if not math.isfinite(totals["loss"]):
            raise TrainingError(
                "the loss is not finite; lower the learning rate (weights were updated with a "
                "clipped gradient: restart from the last checkpoint)"
            )
        trainable = int(packed["assistant_mask"].sum())
        seconds = time.perf_counter() - started
        return {
            **totals,
            "grad_norm": float(grad_norm),
            "learning_rate": learning_rate,
            **diagnostics.to_metrics(),
            "num_gradient_steps": 1.0,
            "num_sequences": float(rows),
            "num_trajectories": float(len({id(r.trajectory) for r in results})),
            "num_tokens": float(int((packed["tokens"] != -100).sum())),
            "num_trainable_tokens": float(trainable),
            "seconds": seconds,
        }

    def _sft_step(
        self, hosted: _Hosted, tensors: list[dict[str, torch.Tensor]], rate: float
    ) -> dict[str, float]:
        optimizer = self._optimizer_for(hosted, rate)
        model = hosted.policy.model
        hosted.policy.use_threads()
        tokens = sum(int((t["labels"] != -100).sum()) for t in tensors)
        with hosted.policy.lock:
            model.train()
            optimizer.zero_grad()
            total = 0.0
            for t in tensors:
                labels = t["labels"][0, 1:]
                keep = torch.nonzero(labels != -100).squeeze(-1)
                logits = model(
                    input_ids=t["input_ids"], use_cache=False, logits_to_keep=keep
                ).logits.float()
                loss = torch.nn.functional.cross_entropy(logits[0], labels[keep], reduction="sum")
                (loss / max(tokens, 1)).backward()
                total += float(loss.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            model.eval()
        return {
            "loss": total / max(tokens, 1),
            "grad_norm": float(grad_norm),
            "learning_rate": rate,
            "num_trainable_tokens": float(tokens),
        }

    def _optimizer_for(self, hosted: _Hosted, learning_rate: float) -> torch.optim.Optimizer:
        if hosted.optimizer is None:
            trained = [p for p in hosted.policy.model.parameters() if p.requires_grad]
            hosted.optimizer = torch.optim.AdamW(trained, lr=learning_rate, weight_decay=0.0)
        for group in hosted.optimizer.param_groups:
            group["lr"] = learning_rate
        return hosted.optimizer

    # -- checkpoints ------------------------------------------------------------------------

    def _checkpoint_root(self, model: Any) -> Path:
        return Path(model._get_output_dir()) / "checkpoints"

    def _checkpoints(self, model: Any) -> list[tuple[int, Path]]:
        root = self._checkpoint_root(model)
        found = [
            (int(p.name), p)
            for p in root.glob("[0-9]*")
            if p.name.isdigit() and (p / "config.json").exists()
        ]
        return sorted(found)

    def _save(self, hosted: _Hosted, model: Any) -> None:
        from transformers.utils import logging as hf_logging

        folder = self._checkpoint_root(model) / f"{hosted.step:04d}"
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # one "Writing model shards" bar a step is noise
        try:
            with hosted.policy.lock:
                hosted.policy.model.save_pretrained(folder)
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        hosted.policy.tokenizer.save_pretrained(folder)
        if self._keep is not None:
            for _, old in self._checkpoints(model)[: -self._keep]:
                shutil.rmtree(old, ignore_errors=True)

    def _load(self, hosted: _Hosted, folder: Path) -> None:
        from transformers import AutoModelForCausalLM

        weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with hosted.policy.lock:
            hosted.policy.model.load_state_dict(weights.state_dict())
        hosted.optimizer = None

    def _check_model(self, model: Any) -> _Hosted:
        hosted = self._hosted.get(str(model.name))
        if hosted is None:
            raise ConfigurationError(
                f"model {model.name!r} is not registered with this CPUBackend: call "
                "`await model.register(backend)` first"
            )
        return hosted

    def _served(self) -> dict[str, Served]:
        """Each hosted model under its name and ``name@step`` (the weights it has now)."""
        served: dict[str, Served] = {}
        for name, hosted in self._hosted.items():
            answer = Served(hosted.policy, hosted.seeds)
            served[name] = served[f"{name}@{hosted.step}"] = answer
        return served


# -- the same groups, the same step ----------------------------------------------------------


def _by_reward(group: art.TrajectoryGroup) -> art.TrajectoryGroup:
    """``group`` with its runs in reward order: ART sums the rewards in the group's order, and
    which run of a group holds which sample varies with the order concurrent requests ran in."""
    runs = sorted(group.trajectories, key=lambda t: t.reward)
    return art.TrajectoryGroup(runs, exceptions=group.exceptions, metadata=group.metadata)


def _canonical(results: Iterable[TokenizedResult]) -> list[TokenizedResult]:
    """Each group's tokenized runs in an order set by their content, then shuffled as ART's
    ``tokenize_trajectory_groups`` does (``random.Random(prompt_id)``): the packing, and so the
    loss to the last bit, depends on that order, which must not depend on which run of a group
    got which sample."""
    by_prompt: dict[int, list[TokenizedResult]] = {}
    for result in results:
        by_prompt.setdefault(result.prompt_id, []).append(result)
    ordered: list[TokenizedResult] = []
    for prompt_id, group in by_prompt.items():
        group.sort(key=_content)
        random.Random(prompt_id).shuffle(group)
        ordered += group
    return ordered


def _content(result: TokenizedResult) -> tuple[Any, ...]:
    logprobs = [-math.inf if math.isnan(x) else x for x in result.logprobs]
    return result.token_ids, result.assistant_mask, logprobs, result.advantage, result.weight
