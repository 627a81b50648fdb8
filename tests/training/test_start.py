"""A training script's first rollout starts while ART loads: the Trainer imports ART in a
background thread, builds a factory's model once it has loaded, and ships the step as
before; a failed ART import fails the step with its cause, not a hang.

Each test is a fresh interpreter (this one has ART loaded already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import openai
    import arttrace as at
    from arttrace.testing import Reply, ScriptedLLM, serve
    from arttrace.training import _art_import

    out = sys.argv[1]
    seen = {}

    def build_model():
        import art  # instant: the Trainer calls this once ART has loaded
        seen["factory_called_with_art_loaded"] = _art_import._import.done.is_set()
        return art.TrainableModel(name="m", project="p", run_name="r",
                                  base_model="Qwen/Qwen2.5-0.5B-Instruct", base_path=out + "/.art")

    async def main():
        at.instrument()
        with serve(ScriptedLLM(lambda request: Reply("hello there"))) as server:
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)

            @at.trainable
            async def agent(question):
                if "loaded_at_first_call" not in seen:
                    seen["loaded_at_first_call"] = _art_import._import.done.is_set()
                reply = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": question}])
                return reply.choices[0].message.content

            async def rollout(example):
                await agent(example)
                return float(at.current_trajectory().metadata["rollout"])  # spread in a group

            trainer = at.Trainer(build_model, at.DryRunBackend(out + "/dry"), rollout,
                                 ["q1", "q2"], group_size=2, groups_per_step=2,
                                 output_dir=out + "/run", progress=False)
            try:
                result = await trainer.step()
            except at.TrainingError as error:
                seen["error"] = str(error)
                seen["cause"] = repr(error.__cause__)
            else:
                seen["groups"] = len(result.groups)
                seen["model"] = type(trainer.model).__module__ + "." + type(trainer.model).__name__
                seen["registered"] = trainer.model._backend is trainer.backend
        print("RESULT " + json.dumps(seen))

    asyncio.run(main())
    """
)


def run(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[0].removeprefix("RESULT "))
    return result


def test_rollouts_start_before_art_has_loaded_and_the_step_ships(tmp_path: Path) -> None:
    seen = run(tmp_path)
    assert seen["loaded_at_first_call"] is False  # the first LLM call did not wait for ART
    assert seen["factory_called_with_art_loaded"] is True
    assert seen["groups"] == 2 and seen["registered"] is True
    assert str(seen["model"]).startswith("art.") and seen["model"].endswith("TrainableModel")
    report = json.loads((tmp_path / "dry" / "m" / "step-00000" / "report.json").read_text())
    assert report["groups_with_signal"] == 2 and report["trainable_tokens"] > 0


def test_a_failed_art_import_fails_the_step_with_its_cause(tmp_path: Path) -> None:
    """A broken ART install (here an ``art`` that raises on import) surfaces when the step
    ships, as a TrainingError naming the cause; the rollouts ran and are journaled."""
    broken = tmp_path / "site" / "art"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"
    )
    seen = run(tmp_path, {"PYTHONPATH": str(tmp_path / "site")})
    error = str(seen["error"])
    assert "ART could not be imported" in error and "libtorch_cpu.so" in error
    assert "resume=True" in error and "ImportError" in str(seen["cause"])
    lines = (tmp_path / "run" / "journal" / "step-00000" / "rollouts.jsonl").read_text()
    assert len(lines.splitlines()) == 4  # every rollout ran and is kept for the resume
