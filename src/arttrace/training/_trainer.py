"""The training loop: run each example ``group_size`` times, group by example, ship to ART.

``await trainer.step()`` is one GRPO step; ``await trainer.train(...)`` runs steps with
validation at step 0, every ``validate_every`` steps and after the last one. Every finished
rollout is journaled before anything ships, so ``Trainer(..., resume=True)`` continues an
interrupted run without re-running or losing a rollout.

The Trainer orchestrates; each job is its own module: ``_config`` (validated settings),
``_schedule`` (batches, epochs, curriculum), ``_step`` (one step), ``_ship``
(``backend.train``), ``_report`` (metrics, progress bar, plot, ``model.log``); one run and its
reward is ``executors._rollout``'s.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Never, Self

from .._errors import ConfigurationError, UsageError
from .._journal import Journal, Slot
from ..capture._continuity import PolicyTokenizer
from ..capture._trajectory import MetadataValue, Trajectory
from ..capture._warnings import warn_every_time
from ..executors import Executor, InProcessExecutor
from ..executors._rollout import RewardFn, Rollout, RolloutRunner
from ._art_import import ModelFactory, TrainerModel, start_art_import
from ._config import TrainerConfig, check_train_kwargs, read_dataset, unexpected_keyword
from ._curriculum import Curriculum
from ._group import GroupRewardFn, check_group_reward, own_reward
from ._pipeline import Pipeline
from ._policy import Policy, assign, policies_of
from ._report import Reporter, reward_stats
from ._resume import open_run, run_settings, working
from ._schedule import Schedule
from ._step import StepResult, policy_step_key, run_rollouts, run_step

if TYPE_CHECKING:
    import art

__all__ = ["StepResult", "Trainer"]


class Trainer[ExampleT]:
    """GRPO over an existing agent: ``rollout(example)`` is one run of the agent.

    ``await trainer.step()`` runs ``group_size`` rollouts of each of the next
    ``groups_per_step`` examples, journals every finished run, builds one
    ``art.TrajectoryGroup`` per example, drops the groups that teach nothing and ships the rest
    with ``backend.train(model, groups, learning_rate=..., **train_kwargs)``. A group with
    reward spread but no trainable token does not ship either: a ``NothingToTrainWarning``
    per step names the cause, and a step left with nothing to train fails with
    :class:`~arttrace.TrainingError`.

    ``async with Trainer(...) as trainer:`` (or ``with``) closes it on exit: see :meth:`aclose`.
    Every setting that is a value (not a collaborator) is kept, validated, in ``trainer.config``
    (a ``TrainerConfig``).

    Args: The agent and the model
        model: The ``art.TrainableModel`` to train; register it first
            (``await model.register(backend)``). Or a function of no arguments that builds
            it, so that rollouts start without waiting for ART to load (``import art`` takes
            15-35 s of CPU): the Trainer imports ART in a background thread when it is built,
            and calls the function (importing ``art`` inside it is then instant) and
            registers the model with ``backend`` when the first step's groups are built.
            Pass the model itself when the rollouts need it first (to sample from
            ``model.inference_base_url``). Or a list of models and
            :class:`~arttrace.Policy` s, to train several policies of one agent system from
            the same runs, in the same step (docs/policies.md): each policy turn belongs to
            the policy whose model it was sent to (or that its ``@trainable(policy=...)``
            named); each policy gets groups of its own, per example, shipped to its own model.
        backend: An ART backend (``art.local.LocalBackend()``, ``art.ServerlessBackend(...)``,
            :class:`~arttrace.DryRunBackend`); with several policies, the one of each policy
            that names none.
        rollout: One run of the agent on one example. An async function, or a sync one, which
            runs in a worker thread (at most ``max_concurrency`` at a time) in the run's
            context, so ``current_trajectory()`` and a sync OpenAI client work in it. The
            Trainer opens the run's trajectory around it: the rollout must not open its own.
            Its reward: see ``reward_fn``.
        train_dataset: The training examples: any iterable (a generator too), read once into
            a list when the Trainer is built; it must hold at least one example.

    Args: Data
        val_dataset: Validation examples (read once, like ``train_dataset``), each run once by
            :meth:`validate`.
        example_id: The id of an example (a function of it); else its ``"id"`` key, else
            ``train-<index>`` / ``val-<index>``.

    Args: Reward
        reward_fn: Scores a rollout's output: ``reward_fn(example, output)``, sync or async.
            The run's reward, in this order: ``reward_fn(example, output)`` when it is given;
            else the rollout's return value when it is a real number (``float``, ``int``,
            ``numpy.float32``, ``Decimal``, ``Fraction``; not ``bool``); else what the
            rollout set with ``arttrace.current_trajectory().reward = ...`` (anything else it
            returns, such as its answer, is then ignored). No reward, a reward that is not a
            finite real number, or two sources that disagree fail the run with an error that
            says what to do. With several policies, each source may instead give one reward
            per policy, ``{policy name: reward}`` (``current_trajectory().policy_rewards``);
            by default every policy's trajectory of a run gets the run's reward.
        group_reward: Scores a group's runs relative to each other (an LLM judge such as
            :func:`arttrace.rewards.ruler`): ``group_reward(group)``, sync or async, gets an
            :class:`~arttrace.Group` (the example and its runs that finished: trajectory,
            final answer, own reward) and returns one reward per run (or an
            :class:`~arttrace.GroupRewards` with metrics). It is called in this process as
            soon as a group's last run ends, with capture off (its calls never enter a run).
            Each run keeps its own reward as ``independent_reward`` in its metrics; a run
            need not give one (``0.0`` then). With several policies, a reward may be one per
            policy (a mapping), and each policy keeps its own ``independent_reward``.
            Judgments are journaled: ``resume=True`` never judges a group twice. A judge
            that raises or returns a wrong answer fails the group's runs under
            ``max_exceptions``, with the cause. See docs/rewards.md.

    Args: Batching
        group_size: Runs per example; one group per example, never one across examples.
        groups_per_step: Examples (groups) per step. Each epoch is a fresh shuffle seeded by
            ``seed`` and the epoch number; the global ``random`` state is never touched.
        seed: Seeds the shuffle of each epoch. The replies are the backend's to repeat or
            not (``CPUBackend(seed=...)`` does, a vLLM server does not).
        min_reward_spread: Groups whose rewards spread (max - min) less than this, or not at
            all, are dropped: they teach nothing.
        curriculum: A :class:`~arttrace.Curriculum` choosing which groups with learning
            signal ship; its state is saved with the run.
        learning_rate: Passed to ``backend.train``.
        train_kwargs: The other keyword arguments of ``backend.train``, passed unchanged
            (``{"kl_penalty_coef": 0.1, "loss_fn": "ppo"}``). Each name is checked when the
            Trainer is built against the backend's ``train`` signature: an unknown name is an
            error naming the closest valid one (a ``train`` that takes ``**kwargs``, such as
            :class:`~arttrace.DryRunBackend`'s, takes any name).

    Args: Execution
        executor: Where rollouts run: :class:`~arttrace.InProcessExecutor` (the default:
            tasks of this process) or :class:`~arttrace.RayExecutor` (workers of a Ray
            cluster). The rollout, ``reward_fn`` and every example are checked when the
            Trainer is built: one that the executor cannot run is a ``ConfigurationError``.
            The Trainer closes it in :meth:`close`.
        max_concurrency: Runs in flight at a time (an executor may set its own limit).
        max_steps_off_policy: How many steps :meth:`train` may run rollouts ahead of the
            policy: with ``k >= 1`` the rollouts of the next ``k`` steps run while a step
            trains (pipelined training), each run sampling from a policy at most ``k`` steps
            behind the step that ships it. ``0`` (the default): synchronous steps. Every run
            records the policy it sampled from as ``policy_step`` in its metadata (the
            number of steps trained when it started; its calls sampled from that policy or
            a newer one). A journaled run older than ``k`` steps when its step ships (resumed
            with a smaller ``k`` than it ran with) is left out of its group, with a warning.
            With several policies, each counts its own trainings (``policy_step/<name>``).

    Args: Failure handling
        max_exceptions: Rollouts that may raise in one step, as a count (int) or a fraction of
            the step's rollouts (float), before the step fails with
            :class:`~arttrace.TrainingError` naming the most common cause.
        rollout_timeout: Seconds one run (the rollout and its ``reward_fn``) may take, in
            training and validation (default ``None``: no limit, since what is long depends
            on the agent; an LLM call that never answers then holds its step for the client's
            own timeout, 600 s for OpenAI's). Past it the run is stopped where it runs (here,
            or on its Ray worker) and fails with :class:`~arttrace.RolloutTimeoutError`,
            counted under ``max_exceptions``; it is journaled with the calls it recorded. A
            sync rollout's thread cannot be stopped: it runs on, unrecorded.
        train_timeout: Seconds ``backend.train`` may take (default ``None``: no limit). Past
            it the call is cancelled and the step fails with :class:`~arttrace.TrainingError`;
            its groups stay in the journal and ``resume=True`` ships them, after asking the
            backend whether the cancelled call trained them.
        train_retries: How many times a failed ``backend.train`` is retried, with exponential
            backoff from ``retry_delay`` seconds.
        retry_delay: The first retry's delay, in seconds.

    Args: Output
        output_dir: Where the run is kept: the journal (every finished rollout), ``state.json``,
            ``metrics.jsonl``, ``validation.jsonl`` and ``reward_plot.png`` (redrawn after a
            step at most every 30 s, and at the end of :meth:`train`).
        resume: Continue the run in ``output_dir``: finished rollouts are read back from the
            journal, not run again. Without it, an ``output_dir`` that holds a run is an error.
            The run's seed, dataset, ``group_size``, ``groups_per_step`` and curriculum must be
            the ones it started with (a ``ResumeError``, a ``ConfigurationError``, names each
            difference).
            A step the backend already trained is not shipped again. One Trainer works in an
            ``output_dir`` at a time (a lock on it; a second one gets ``RunLockedError``).
        log_to_model: Send each step's metrics to ``model.log`` (ART's history, W&B).
        progress: Show a progress bar of the step's runs and their mean reward, and one line
            on stderr per step and validation: rewards, groups shipped (or why none did),
            loss.

    Args: Diagnostics
        continuity_warn_rate: A step whose turns break token continuity more often than this
            (breaks per turn boundary checked, from 0 to 1; ``1``: never) warns once, with
            the most common cause and its fix (:class:`~arttrace.TokenContinuityWarning`).
            Every step reports ``continuity_*`` and ``art_sequences`` in its metrics; see
            docs/continuity.md.
        tokenizer: The model's tokenizer, which tells the causes of continuity breaks apart
            (``template`` or ``retokenized``): a model name in the Hugging Face cache, a
            folder holding it, or a tokenizer (transformers or tokenizers). Default: the
            model's ``base_model``'s when this machine holds it (nothing is downloaded), for
            turns served as the model's name or ``name@step``; without one, the causes are
            guessed (``continuity_breaks_guessed``).

    Raises:
        ConfigurationError: A setting, dataset, rollout or ``train_kwargs`` name the Trainer
            cannot use.
        TypeError: A keyword argument the Trainer does not take, naming the closest one (a
            keyword argument of ``backend.train`` goes in ``train_kwargs``).
    """

    def __init__(
        self,
        model: art.TrainableModel[Any] | ModelFactory | Sequence[art.TrainableModel[Any] | Policy],
        backend: art.Backend,
        rollout: Rollout[ExampleT],
        train_dataset: Iterable[ExampleT],
        *,
        # data
        val_dataset: Iterable[ExampleT] | None = None,
        example_id: Callable[[ExampleT], str] | None = None,
        # reward
        reward_fn: RewardFn[ExampleT] | None = None,
        group_reward: GroupRewardFn[ExampleT] | None = None,
        # batching
        group_size: int = 8,
        groups_per_step: int = 8,
        seed: int = 0,
        min_reward_spread: float = 0.0,
        curriculum: Curriculum | None = None,
        learning_rate: float = 5e-6,
        train_kwargs: Mapping[str, Any] | None = None,
        # execution
        executor: Executor | None = None,
        max_concurrency: int = 32,
        max_steps_off_policy: int = 0,
        # failure handling
        max_exceptions: int | float = 0.25,
        rollout_timeout: float | None = None,
        train_timeout: float | None = None,
        train_retries: int = 3,
        retry_delay: float = 1.0,
        # output
        output_dir: str | Path = "runs/train",
        resume: bool = False,
        log_to_model: bool = True,
        progress: bool = True,
        # diagnostics
        continuity_warn_rate: float = 0.05,
        tokenizer: Any = None,
        **unexpected: Never,  # an unknown keyword: a TypeError naming it (and train_kwargs)
    ) -> None:
        if unexpected:
            raise unexpected_keyword(next(iter(unexpected)), inspect.signature(Trainer))
        self.config = TrainerConfig(
            group_size=group_size,
            groups_per_step=groups_per_step,
            seed=seed,
            min_reward_spread=min_reward_spread,
            learning_rate=learning_rate,
            train_kwargs={} if train_kwargs is None else train_kwargs,
            max_concurrency=max_concurrency,
            max_steps_off_policy=max_steps_off_policy,
            max_exceptions=max_exceptions,
            rollout_timeout=rollout_timeout,
            train_timeout=train_timeout,
            train_retries=train_retries,
            retry_delay=retry_delay,
            output_dir=Path(output_dir),
            resume=resume,
            log_to_model=log_to_model,
            progress=progress,
            continuity_warn_rate=continuity_warn_rate,
        )
        check_train_kwargs(backend, self.config.train_kwargs)
        if executor is not None and not isinstance(executor, Executor):
            raise ConfigurationError(
                f"executor must be an arttrace executor (arttrace.InProcessExecutor(), "
                f"arttrace.RayExecutor(...)), got {type(executor).__name__}"
            )
        start_art_import()  # rollouts need only capture: ART loads meanwhile
        self._policies: list[Policy] | None = None
        """The policies when several were given (``None``: one model, as always)."""
        if isinstance(model, Sequence) and not isinstance(model, str):
            self._policies = policies_of(model)
            if curriculum is not None:
                raise ConfigurationError(
                    "a curriculum ranks one policy's groups; with several policies, train "
                    "without one (curriculum=None)"
                )
            for policy in self._policies:
                if policy.backend is not None:
                    check_train_kwargs(policy.backend, self.config.train_kwargs)
            model = self._policies[0].model
        self._models = TrainerModel(model, backend)
        self._tokenizers = {
            p.key: PolicyTokenizer.for_trainer(tokenizer, lambda m=p.model: m)  # type: ignore[misc]
            for p in self._policies or []
        }
        self._continuity_tokenizer = PolicyTokenizer.for_trainer(
            tokenizer, lambda: self._models.built
        )
        self._unclaimed: set[str] = set()
        """What turns no policy claims went by, already warned of."""
        self.backend = backend
        self.executor: Executor = InProcessExecutor() if executor is None else executor
        check_group_reward(group_reward)
        self._group_reward = group_reward
        own = own_reward if group_reward is not None and reward_fn is None else reward_fn
        self._runner = RolloutRunner(rollout, own, max_concurrency, rollout_timeout)
        self._schedule = Schedule(
            read_dataset(train_dataset, "train_dataset"),
            groups_per_step=groups_per_step,
            seed=seed,
            example_id=example_id,
            curriculum=curriculum,
        )
        if not self._schedule.dataset:
            raise ConfigurationError(
                "train_dataset is empty: give the Trainer at least one example (an iterable "
                "is read once, when the Trainer is built: a generator already consumed is empty)"
            )
        self.val_dataset: list[ExampleT] = (
            [] if val_dataset is None else read_dataset(val_dataset, "val_dataset")
        )
        self.output_dir = self.config.output_dir
        self._journal = Journal(self.output_dir)
        self._reporter = Reporter(
            self.output_dir,
            self._models,
            self._policies,
            log_to_model=log_to_model,
            progress=progress,
        )
        state = open_run(self._journal, run_settings(self), resume)
        self.completed_steps: int = state.get("completed_steps", 0)
        self._policy_steps: dict[str, int] = {
            p.key: int(state.get("policy_steps", {}).get(p.key, 0)) for p in self._policies or []
        }
        """How many times each policy (of several) has trained: a step with nothing to ship
        for one leaves it as it was (its runs' ``policy_step/<name>``)."""
        if curriculum is not None and "curriculum" in state:
            curriculum.restore(state["curriculum"])
        self._bind()  # last: a Trainer that fails to build leaves no workers behind

    @property
    def model(self) -> art.TrainableModel[Any]:
        """The model being trained (one a factory builds exists once ART has loaded, when
        the first step's groups are built). With several policies: see :attr:`policies`."""
        if self._policies is not None:
            raise UsageError(
                "this Trainer trains several policies: read trainer.policies[name].model"
            )
        model = self._models.built
        if model is None:
            raise UsageError(
                "the Trainer's model comes from a factory, which runs once ART has loaded, "
                "when the first step's groups are built: read trainer.model after a step, or "
                "pass the Trainer the model itself"
            )
        return model

    @property
    def policies(self) -> dict[str, Policy]:
        """The policies trained (and served frozen) by name; one, the model's, when the
        Trainer was given one model."""
        if self._policies is None:
            return {self.model.name: Policy(self.model)}
        return {p.key: p for p in self._policies}

    def _assign(self, run: Trajectory) -> Trajectory:
        """Record on each policy turn of ``run`` the policy it belongs to (several policies
        only), warning once for what no policy claims: those turns train nothing."""
        if self._policies is None:
            return run
        new = assign(run, self._policies) - self._unclaimed
        if new:
            self._unclaimed |= new
            known = ", ".join(f"{p.key} ({', '.join(sorted(p.names()))})" for p in self._policies)
            warn_every_time(
                f"arttrace: policy turns of {', '.join(sorted(new))} (in run "
                f"{run.example_id!r}) belong to none of the Trainer's policies [{known}], so "
                "they are context in every policy's trajectory and train nothing. Give the "
                "Trainer a Policy for that model, or name one of its policies with "
                "@trainable(policy=...)",
                UserWarning,
            )
        return run

    @property
    def rollout(self) -> Rollout[ExampleT]:
        return self._runner.rollout

    @rollout.setter
    def rollout(self, rollout: Rollout[ExampleT]) -> None:
        self._runner = RolloutRunner(
            rollout, self._runner.reward_fn, self.config.max_concurrency, self._runner.timeout
        )
        self._bind()

    def _bind(self) -> None:
        examples = [*self._schedule.dataset, *self.val_dataset]
        self.executor.bind(self._runner, examples, self.config.max_concurrency)

    # -- the schedule ----------------------------------------------------------------------

    @property
    def train_dataset(self) -> Sequence[ExampleT]:
        return self._schedule.dataset

    @property
    def steps_per_epoch(self) -> int:
        return self._schedule.steps_per_epoch

    def batch(self, step: int) -> tuple[int, list[int]]:
        """``(epoch, dataset indices)`` of ``step``: each epoch a fresh seeded shuffle."""
        return self._schedule.batch(step)

    def example_id(self, example: ExampleT, index: int, split: str) -> str:
        return self._schedule.example_id(example, index, split)

    # -- steps -----------------------------------------------------------------------------

    async def step(self) -> StepResult:
        """Run one GRPO step and ship it; see the class docstring."""
        with working(self):
            result = await run_step(self)
            self._reporter.append("metrics.jsonl", result.metrics)
        await self._reporter.report(result.metrics, result.step, "train")
        return result

    async def validate(self) -> dict[str, float]:
        """Run every validation example once; record and return the reward statistics."""
        with working(self):
            return await self._validate()

    async def _validate(self) -> dict[str, float]:
        if not self.val_dataset:
            raise ConfigurationError("no val_dataset was given to the Trainer")
        step = self.completed_steps
        results: dict[Slot, Trajectory] = {}
        slots = {
            (i, 0): (self.example_id(example, i, "val"), example)
            for i, example in enumerate(self.val_dataset)
        }
        await run_rollouts(
            slots,
            lambda slot, example_id, example: self._run_one(example_id, example, "val", step, 0),
            bar=self._reporter.bar("val", step, len(slots), []),
            done=results,
        )
        rewards = [t.reward for t in results.values() if t.reward is not None]
        metrics = {
            "step": step,
            **reward_stats(rewards),
            "examples": len(slots),
            "exceptions": sum(t.exception is not None for t in results.values()),
        }
        for policy in self._policies or []:
            own = [r for t in results.values() if (r := t.reward_for(policy.key)) is not None]
            metrics |= {f"{policy.key}/{k}": v for k, v in reward_stats(own).items()}
        self._reporter.append("validation.jsonl", metrics)
        await self._reporter.report(metrics, step, "val")
        return metrics

    async def train(
        self,
        *,
        num_steps: int | None = None,
        num_epochs: int | None = None,
        validate_every: int | None = None,
    ) -> list[StepResult]:
        """Run until ``num_steps`` steps (or ``num_epochs`` epochs) have completed in all,
        validating at the start, every ``validate_every`` steps and at the end.

        Returns each step's :class:`StepResult` without its ``groups`` (a long run would keep
        every trajectory in memory; they are in the journal)."""
        if num_steps is not None and num_epochs is None:
            total = num_steps
        elif num_epochs is not None and num_steps is None:
            total = num_epochs * self.steps_per_epoch
        else:
            raise ConfigurationError("give exactly one of num_steps or num_epochs")
        with working(self):  # one lock from the first step to the last
            validated = {int(v["step"]) for v in self._reporter.read("validation.jsonl")}
            results: list[StepResult] = []

            async def maybe_validate() -> None:
                if self.val_dataset and self.completed_steps not in validated:
                    await self.validate()
                    validated.add(self.completed_steps)

            if self.completed_steps == 0:
                await maybe_validate()
            pipeline = Pipeline(self, total)
            try:
                while self.completed_steps < total:
                    result = await pipeline.step()
                    self._reporter.append("metrics.jsonl", result.metrics)
                    await self._reporter.report(result.metrics, result.step, "train")
                    results.append(dataclasses.replace(result, groups=[]))
                    del result  # its ART objects go now, not after the next step's rollouts
                    if validate_every and self.completed_steps % validate_every == 0:
                        await maybe_validate()
            finally:
                await pipeline.aclose()
            await maybe_validate()
        await self._reporter.finish()
        return results

    async def flush(self) -> None:
        """Wait for the last step's ``model.log`` and plot. :meth:`train` also redraws the
        plot at its end, if a step came after its last drawing."""
        await self._reporter.flush()

    async def _run_one(
        self, example_id: str, example: ExampleT, split: str, step: int, rollout: int
    ) -> Trajectory:
        """One run of ``example`` in its own trajectory, with its reward."""

        def metadata() -> dict[str, MetadataValue]:
            """Asked when the run starts: the policy it samples from is the latest trained."""
            return {
                "split": split,
                "step": step,
                "rollout": rollout,
                "policy_step": self.completed_steps,
                **{policy_step_key(k): n for k, n in self._policy_steps.items()},
            }

        return await self.executor.run(example_id, example, metadata)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the executor: release its workers (a Ray executor's actors, the worker
        threads of sync rollouts); idempotent. ``with Trainer(...) as trainer:`` calls it on
        exit."""
        self.executor.close()

    async def aclose(self) -> None:
        """:meth:`flush`, then :meth:`close` (even if the flush fails); idempotent.
        ``async with Trainer(...) as trainer:`` calls it on exit."""
        try:
            await self.flush()
        finally:
            self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
