"""CPUBackend: ART's backend protocol on a CPU. Its server answers like vLLM over real HTTP,
its training is ART's own tokenize → pack → loss_fn, and it really learns."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import art
import openai
import pytest
import torch
from art.loss import LossInputs, loss_fn
from art.preprocessing.pack import packed_tensors_from_tokenized_results
from art.preprocessing.tokenize import tokenize_trajectory_groups

import arttrace as at
from arttrace._errors import ConfigurationError
from arttrace._journal import Journal
from arttrace.app._front_desk_demo import run_front_desk_demo
from arttrace.app._greeter_demo import CPUSettings, run_greeter_demo
from arttrace.training._cpu_model import attention_pattern

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def backend() -> Any:
    backend = at.CPUBackend(threads=1)
    yield backend
    asyncio.run(backend.close())


async def registered(backend: Any, tmp_path: Path) -> art.TrainableModel[Any]:
    model: art.TrainableModel[Any] = art.TrainableModel(
        name="policy", project="test", base_model="tiny", run_name="t", base_path=str(tmp_path)
    )
    await model.register(backend)
    return model


async def test_serves_like_vllm_with_token_ids(backend, tmp_path):
    model = await registered(backend, tmp_path)
    client = model.openai_client()
    response = await client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        n=2,
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    prompt = response.model_extra["prompt_token_ids"]
    assert (
        prompt
        == backend.policy.tokenizer.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=True
        )["input_ids"]
    )
    assert len(response.choices) == 2
    for choice in response.choices:
        ids = choice.model_extra["token_ids"]
        entries = choice.logprobs.content
        assert [e.token for e in entries] == [f"token_id:{i}" for i in ids]
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
        assert (choice.finish_reason, len(ids)) == ("length", 6) or ids[-1] in (151643, 151645)

    stream = await client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        n=2,
        max_tokens=6,
        logprobs=True,
        seed=7,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    streamed: dict[int, list[int]] = {0: [], 1: []}
    role_chunks = 0
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                role_chunks += 1
                assert chunk.model_extra["prompt_token_ids"] == prompt
            else:
                streamed[choice.index] += choice.model_extra["token_ids"]
                assert len(choice.logprobs.content) == 1
    assert role_chunks == 2
    assert streamed == {c.index: c.model_extra["token_ids"] for c in response.choices}

    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await client.chat.completions.create(model="other", messages=MESSAGES)


async def test_a_written_tool_call_comes_back_as_tool_calls(backend, tmp_path):
    """The server parses what the model writes in the Hermes format Qwen's template teaches."""
    await registered(backend, tmp_path)
    written = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    sample = _sample_of(backend, f"Sure.\n{written}")
    message, finish = backend._server._message(sample)
    assert finish == "tool_calls" and message["content"] == "Sure.\n"
    call = message["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("add", {"a": 1, "b": 2})
    plain, finish = backend._server._message(_sample_of(backend, "<tool_call>not json"))
    assert (plain["content"], finish) == ("<tool_call>not json", "stop")


async def test_gradient_reaches_exactly_the_sampled_tokens(backend, tmp_path):
    """One run of a group is rewarded: ART's assistant mask gives the context no gradient, the
    rewarded run's sampled tokens become more likely and the other run's less."""
    model = await registered(backend, tmp_path)
    at.instrument()
    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key="x")

    @at.trainable
    async def agent() -> str:
        reply = await client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=5, temperature=3.0
        )
        return reply.choices[0].message.content or ""

    runs = []
    for reward in (1.0, 0.0):
        with at.trajectory("q") as t:
            await agent()
            t.reward = reward
        runs.append(t.to_art())
    await client.close()
    at.uninstrument()
    group = art.TrajectoryGroup(runs)
    assert _token_ids(runs[0]) != _token_ids(runs[1])  # hot sampling: two different runs

    results = list(tokenize_trajectory_groups(backend.policy.tokenizer, [group], False, True))
    packed = packed_tensors_from_tokenized_results(results, 128, pad_token_id=-100, verbosity=0)
    row: Any = {k: v[:1] for k, v in packed.items() if isinstance(v, torch.Tensor)}
    everywhere = row["tokens"] != -100  # score every position, context included
    new, _ = backend.policy.token_logprobs(
        row["tokens"],
        row["input_pos"],
        attention_pattern(row["group_ids"], row["parent_ids"]),
        everywhere,
    )
    new.retain_grad()
    loss_fn(LossInputs(inputs=row), new, None, None, {}).policy_loss.backward()
    predicts_sampled = torch.nn.functional.pad(row["assistant_mask"][:, 1:], (0, 1))
    assert (new.grad[~predicts_sampled] == 0).all()
    assert (new.grad[predicts_sampled] != 0).all()
    assert int(predicts_sampled.sum()) == sum(len(_token_ids(r)) for r in runs)
    backend.policy.model.zero_grad()

    before = [_sequence_logprob(backend, r) for r in runs]
    result = await backend.train(model, [group], learning_rate=1e-3)
    after = [_sequence_logprob(backend, r) for r in runs]
    assert after[0] > before[0] and after[1] < before[1]
    assert result.step == 1 and result.metrics["num_trainable_tokens"] == int(
        predicts_sampled.sum()
    )
    checkpoint = tmp_path / "test" / "models" / "t" / "checkpoints" / "0001"
    assert (checkpoint / "model.safetensors").is_file()

    reloaded = at.CPUBackend(checkpoint)  # a checkpoint is a model folder, template included
    assert _sequence_logprob(reloaded, runs[0]) == pytest.approx(after[0], abs=1e-4)


@pytest.mark.parametrize("max_steps_off_policy", [0, 1])
async def test_short_training_beats_the_untrained_policy_on_held_out_customers(
    tmp_path, max_steps_off_policy
):
    """The demo's loop (warm-up, Trainer over the captured OpenAI agent, validation on held-out
    customers), shortened: the loss falls, and held-out customers get the house greeting far
    more often than from the untrained policy; pipelined too (the next step's rollouts run
    while a step trains, sampling from a policy one step old)."""
    torch.manual_seed(0)
    settings = CPUSettings(
        examples=4,
        rollouts=6,
        steps=6,
        validation=24,
        max_steps_off_policy=max_steps_off_policy,
    )
    summary = await run_greeter_demo(tmp_path / "demo", settings=settings)
    metrics = [
        json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert len(losses) >= 3
    if not max_steps_off_policy:  # off-policy losses carry importance ratios: not comparable
        assert min(losses[1:]) < losses[0]
    assert summary["val_reward_last"] >= summary["val_reward_step_0"] + 0.3
    assert summary["backend"].startswith("cpu (CPUBackend")
    lags = [m["off_policy_steps_max"] for m in metrics]
    assert lags == [0] + [max_steps_off_policy] * (len(metrics) - 1)
    validations = [
        json.loads(line)
        for line in (tmp_path / "demo" / "validation.jsonl").read_text().splitlines()
    ]
    assert [v["step"] for v in validations] == [0, 6] and validations[0]["examples"] == 24
    checkpoints = tmp_path / "demo" / ".art" / "arttrace-demo" / "models" / "demo" / "checkpoints"
    assert len(list(checkpoints.iterdir())) == 1  # the demo keeps the latest only


async def test_two_policies_on_one_backend_both_learn(tmp_path):
    """The two-policy demo, shortened: a router and a greeter, two tiny models on one
    CPUBackend, each rewarded on its own; each policy's validation on held-out customers
    rises by far more than 0.3, each policy's turns trained its own model."""
    settings = CPUSettings(examples=4, rollouts=6, steps=6, validation=24, warm_up_batches=10)
    out = tmp_path / "demo"
    summary = await run_front_desk_demo(out, settings=settings)
    for policy in ("router", "greeter"):
        assert summary[f"{policy}_val_reward_last"] >= summary[f"{policy}_val_reward_step_0"] + 0.3
    validations = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [v["step"] for v in validations] == [0, 6]
    assert validations[-1]["router/reward_mean"] == summary["router_val_reward_last"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(m["router/groups_kept"] + m["greeter/groups_kept"] > 0 for m in metrics)
    runs = Journal(out).finished(0).values()
    assert [(c.model, c.policy) for c in next(iter(runs)).calls] == [
        ("demo-router", "router"),
        ("demo-greeter", "greeter"),
    ]
    models = out / ".art" / "arttrace-demo" / "models"
    assert {p.name for p in models.iterdir()} >= {"router", "greeter"}
    assert all(list((models / p / "checkpoints").iterdir()) for p in ("router", "greeter"))


async def test_only_the_latest_checkpoints_stay_on_disk_by_default(backend, tmp_path):
    """Each checkpoint is a full copy of the weights: by default the last two stay (222 MB
    after 4 steps of the tiny model otherwise). Serving goes on, a new backend resumes from
    the latest, and keep_checkpoints=None keeps them all."""
    model = await registered(backend, tmp_path)
    client = model.openai_client()
    root = tmp_path / "test" / "models" / "t" / "checkpoints"
    for _ in range(4):
        result = await backend.train(model, [await _rewarded_group(client)], learning_rate=1e-3)
    kept = sorted(p.name for p in root.iterdir())
    assert kept == [f"{result.step - 1:04d}", f"{result.step:04d}"]
    reply = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].message.content is not None
    await model.delete_checkpoints()  # ART's call: keeps the latest, the weights being served
    assert sorted(p.name for p in root.iterdir()) == [f"{result.step:04d}"]

    again = at.CPUBackend(threads=1, keep_checkpoints=None)
    try:
        resumed = await registered(again, tmp_path)
        assert await again._get_step(resumed) == result.step
        for _ in range(2):
            await again.train(resumed, [await _rewarded_group(client)], learning_rate=1e-3)
        assert len(list(root.iterdir())) == 3
    finally:
        await again.close()
    with pytest.raises(ConfigurationError, match="keep at least 1"):
        at.CPUBackend(keep_checkpoints=0)


async def test_a_cancelled_train_still_counts_the_step_it_trained(backend, tmp_path):
    """Cancelling ``train`` (a notebook's interrupt, Ctrl-C under asyncio.run, a timeout)
    cannot stop the thread that changes the weights: the step count and the checkpoint
    follow them, and ``_get_step`` waits for that thread, so a resumed Trainer that asks
    sees the groups trained and does not train them twice."""
    model = await registered(backend, tmp_path)
    group = await _rewarded_group(model.openai_client())
    before = await backend._get_step(model)
    training = asyncio.ensure_future(backend.train(model, [group], learning_rate=1e-3))
    await asyncio.sleep(0.1)  # the step's thread is running
    training.cancel()
    with pytest.raises(asyncio.CancelledError):
        await training
    assert await backend._get_step(model) == before + 1
    checkpoints = tmp_path / "test" / "models" / "t" / "checkpoints"
    assert (checkpoints / f"{before + 1:04d}" / "config.json").exists()


async def _rewarded_group(client: openai.AsyncOpenAI, model: str = "policy") -> art.TrajectoryGroup:
    """Two hot samples of one prompt from ``model``, captured, rewarded 1 and 0."""
    at.instrument()

    @at.trainable
    async def agent() -> None:
        await client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=3, temperature=3.0
        )

    runs = []
    try:
        for reward in (1.0, 0.0):
            with at.trajectory("q") as t:
                await agent()
                t.reward = reward
            runs.append(t.to_art())
    finally:
        at.uninstrument()
    return art.TrajectoryGroup(runs)


async def test_two_registered_models_are_served_and_trained_apart(tmp_path):
    """One backend hosts two models (a router and a greeter of one system): each starts from
    the base weights and is served under its own name and ``name@step``; training one
    changes its weights, step and checkpoints only, the other's replies stay bit for bit."""
    backend = at.CPUBackend(threads=1)
    try:
        first = await registered(backend, tmp_path)
        second: art.TrainableModel[Any] = art.TrainableModel(
            name="second", project="test", base_model="tiny", run_name="s", base_path=str(tmp_path)
        )
        await second.register(backend)
        await second.register(backend)  # again: the same weights, not a third copy
        client = first.openai_client()
        assert second.inference_base_url == first.inference_base_url
        assert [m.id async for m in client.models.list()] == [
            "policy", "policy@0", "second", "second@0"
        ]  # fmt: skip

        async def reply(name: str) -> tuple[list[int], list[float]]:
            response = await client.chat.completions.create(
                model=name, messages=MESSAGES, max_tokens=6, logprobs=True, seed=3
            )
            choice: Any = response.choices[0]
            return choice.model_extra["token_ids"], [e.logprob for e in choice.logprobs.content]

        before = {name: await reply(name) for name in ("policy", "second")}
        assert before["policy"] == before["second"]  # the same base weights

        result = await backend.train(first, [await _rewarded_group(client)], learning_rate=1e-2)
        assert result.step == 1
        assert (await backend._get_step(first), await backend._get_step(second)) == (1, 0)
        assert await reply("second") == await reply("second@0") == before["second"]
        assert (await reply("policy@1"))[1] != before["policy"][1]
        with pytest.raises(openai.NotFoundError):
            await reply("policy@0")  # the weights moved on
        models = tmp_path / "test" / "models"
        assert [p.name for p in (models / "t" / "checkpoints").iterdir()] == ["0001"]
        assert not (models / "s" / "checkpoints").exists()

        trained = await reply("policy")
        group = await _rewarded_group(client, "second")
        assert (await backend.train(second, [group], learning_rate=1e-2)).step == 1
        assert (await backend._get_step(first), await backend._get_step(second)) == (1, 1)
        assert await reply("policy") == trained
        assert (await reply("second@1"))[1] != before["second"][1]
    finally:
        await backend.close()


async def test_the_same_seed_gives_the_same_run(tmp_path):
    """Two runs of the demo's loop with one seed sample the same replies and train to the same
    losses and rewards, to the last bit, although the Trainer's concurrent requests reach the
    server and finish in a different order each time."""
    settings = CPUSettings(examples=3, rollouts=4, steps=2, warm_up_batches=8, validation=12)
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        await run_greeter_demo(out, seed=0, settings=settings)
        at.uninstrument()
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        timeless = [{k: v for k, v in m.items() if "seconds" not in k} for m in metrics]
        journal = Journal(out)
        replies = [
            sorted(
                (t.example_id, list(t.calls[0].choices[0].token_ids or []), t.reward)
                for t in journal.finished(step).values()
            )
            for step in range(settings.steps)
        ]
        runs.append((timeless, (out / "validation.jsonl").read_text(), replies))
    assert runs[0] == runs[1]
    assert all("train/loss" in m for m in runs[0][0])  # both steps trained


async def test_the_same_seed_gives_the_same_two_policy_run(tmp_path):
    """The two-policy demo too: one seed, the same replies of each model with their rewards,
    the same per-policy figures, losses and validation. (Which router reply shares a run with
    which greeter reply may differ, and with it the spread of the runs' mean rewards: the two
    calls of concurrent runs reach the server in any order. Each policy trains on its own
    conversation only: ART skips the other's, which has nothing to train.)"""
    settings = CPUSettings(examples=2, rollouts=4, steps=2, warm_up_batches=4, validation=4)

    def odd_lengths(customer: str, department: str, greeting: str) -> dict[str, float]:
        """Rewards that differ in a group of the barely warmed-up models' replies."""
        return {"router": len(department) % 2, "greeter": len(greeting) % 2}

    per_policy = ("router/", "greeter/", "reward_mean")
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        await run_front_desk_demo(out, seed=0, settings=settings, rewards=odd_lengths)
        at.uninstrument()
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        timeless = json.dumps(  # a policy that shipped nothing has NaN figures
            [
                {k: v for k, v in m.items() if k.startswith(per_policy) and "seconds" not in k}
                for m in metrics
            ]
        )
        replies = {
            policy: sorted(
                (t.example_id, list(call.choices[0].token_ids or []), t.reward_for(policy))
                for step in range(settings.steps)
                for t in Journal(out).finished(step).values()
                for call in t.calls
                if call.policy == policy
            )
            for policy in ("router", "greeter")
        }
        runs.append((timeless, (out / "validation.jsonl").read_text(), replies))
    assert runs[0] == runs[1]
    for policy in ("router", "greeter"):
        assert len(runs[0][2][policy]) == 2 * 2 * 4  # steps x examples x rollouts
        assert f'"{policy}/train/loss"' in runs[0][0]  # both trained


async def test_a_group_trains_the_same_whatever_order_its_runs_come_in(tmp_path):
    """Which run of a group holds which sample varies with the order concurrent requests ran
    in; the step must not: the same runs in another order give the same loss and weights."""
    first, second = at.CPUBackend(threads=1), at.CPUBackend(threads=1)  # the same seed
    try:
        model = await registered(first, tmp_path / "first")
        client = model.openai_client()
        runs = [*(await _rewarded_group(client)).trajectories]
        runs += (await _rewarded_group(client)).trajectories
        other = await registered(second, tmp_path / "second")
        results = [
            await backend.train(m, [art.TrajectoryGroup(order)], learning_rate=1e-2)
            for backend, m, order in ((first, model, runs), (second, other, runs[::-1]))
        ]
    finally:
        await first.close()
        await second.close()
    a, b = ({k: v for k, v in r.metrics.items() if k != "seconds"} for r in results)
    assert a == b and a["num_trajectories"] == 4
    for x, y in zip(first.policy.model.parameters(), second.policy.model.parameters(), strict=True):
        assert torch.equal(x, y)


def test_a_model_folder_without_a_chat_template_is_refused(tmp_path, backend):
    backend.policy.model.save_pretrained(tmp_path)
    tokenizer = backend.policy.tokenizer
    tokenizer.save_pretrained(tmp_path)
    for name in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / name).unlink(missing_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigurationError, match="no chat template"):
        at.CPUBackend(tmp_path)


def test_a_model_too_large_for_memory_is_refused_before_allocating():
    huge = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80}
    with pytest.raises(ConfigurationError, match="GiB"):
        at.CPUBackend(config={**huge, "num_attention_heads": 64, "num_key_value_heads": 8})


def _sample_of(backend: Any, text: str) -> Any:
    from arttrace.training._cpu_model import Sample, Token

    ids = [*backend.policy.tokenizer.encode(text, add_special_tokens=False), 151645]
    return Sample([Token(i, -1.0) for i in ids], "stop")


def _token_ids(trajectory: art.Trajectory) -> list[int]:
    choice = trajectory.messages_and_choices[-1]
    return list(choice.model_extra["token_ids"])  # type: ignore[union-attr]


def _sequence_logprob(backend: Any, trajectory: art.Trajectory) -> float:
    """The policy's logprob of the run's sampled tokens after its prompt."""
    choice: Any = trajectory.messages_and_choices[-1]
    prompt, sampled = choice.model_extra["prompt_token_ids"], _token_ids(trajectory)
    tokens = torch.tensor([prompt + sampled])
    needed = torch.zeros_like(tokens, dtype=torch.bool)
    needed[0, len(prompt) - 1 : -1] = True
    with torch.no_grad():
        logprobs, _ = backend.policy.token_logprobs(
            tokens,
            torch.arange(tokens.shape[1])[None],
            attention_pattern(torch.zeros_like(tokens), torch.full_like(tokens, -1)),
            needed,
        )
    return float(logprobs.sum())
