"""ATIF files as Harbor writes them, made by the Python of Harbor's venv (``.venv-harbor``; run as
a subprocess by tests/test_native_atif.py, like tests/harbor_validate.py). It imports nothing of
pvisor.

``python tests/harbor_atif_write.py NATIVE OUT`` writes into the directory OUT:

- ``harbor-mini-swe-agent.json``: the mini-swe-agent trajectory NATIVE converted by Harbor's own
  converter (``harbor.agents.installed.mini_swe_agent.convert_mini_swe_agent_to_atif``: ATIF-v1.7);
- ``harbor-terminus-2-v1.8.json``: an ATIF-v1.8 trajectory of Harbor's ``terminus-2`` agent (an
  agent pvisor does not know) built with Harbor's models (``harbor.models.trajectories``): a
  system step, the task with an audio part (1.8), ``bash_command`` calls holding ``keystrokes``
  (one step a batch of two sharing one terminal output without ``source_call_id``, as
  terminus-2 writes it), an image part in a result (``images/screen.png``, written beside it, as
  is the audio), a
  step copied across a compaction (``is_copied_context``), a deterministic dispatch
  (``llm_call_count`` 0) and ``mark_task_complete``;

and prints ``{"harbor": VERSION, "errors": {FILE: [...]}}``: Harbor's validator's errors of each.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

from harbor.agents.installed.mini_swe_agent import convert_mini_swe_agent_to_atif
from harbor.models.trajectories import (
    Agent,
    AudioSource,
    ContentPart,
    FinalMetrics,
    ImageSource,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from harbor.utils.trajectory_validator import TrajectoryValidator

#: a 1x1 PNG
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


def _bash(cid: str, keystrokes: str) -> ToolCall:
    return ToolCall(
        tool_call_id=cid, function_name="bash_command", arguments={"keystrokes": keystrokes, "duration": 0.1}
    )


def terminus() -> Trajectory:
    task = [
        ContentPart(type="text", text="Write hello.txt, then notes/a.md and b.txt."),
        ContentPart(
            type="audio", source=AudioSource(media_type="audio/wav", path="audio/task.wav", duration_sec=2.0)
        ),
    ]
    steps = [
        Step(
            step_id=1, source="system", message="You are an AI assistant solving tasks in a Linux terminal."
        ),
        Step(step_id=2, source="user", message=task),
        Step(
            step_id=3,
            source="agent",
            model_name="openai/gpt-test",
            message="Analysis: the directory is empty. Plan: write hello.txt.",
            reasoning_content="Start with the first file.",
            tool_calls=[_bash("call_0_1", "echo hello > hello.txt\n")],
            observation=Observation(
                results=[
                    ObservationResult(
                        content=[
                            ContentPart(type="text", text="$ echo hello > hello.txt\n$ "),
                            ContentPart(
                                type="image",
                                source=ImageSource(media_type="image/png", path="images/screen.png"),
                            ),
                        ]
                    )
                ]
            ),
            metrics=Metrics(prompt_tokens=120, completion_tokens=30, cached_tokens=20, cost_usd=0.001),
            llm_call_count=1,
        ),
        Step(
            step_id=4,
            source="agent",
            model_name="openai/gpt-test",
            message="Now the notes, two commands at once.",
            # independent commands: terminus-2 typed them in order, but a handoff serves one step's
            # calls as one batch, which OpenCode runs at once (docs/handoff.md, "Sources from
            # elsewhere: ATIF")
            tool_calls=[
                _bash("call_1_1", "mkdir -p notes && echo a > notes/a.md\n"),
                _bash("call_1_2", "echo b > b.txt\n"),
            ],
            observation=Observation(
                results=[
                    ObservationResult(content="$ mkdir -p notes && echo a > notes/a.md\n$ echo b > b.txt\n$ ")
                ]
            ),
            llm_call_count=1,
        ),
        Step(
            step_id=5,
            source="agent",
            message="(copied context of an earlier episode)",
            is_copied_context=True,
        ),
        Step(
            step_id=6,
            source="agent",
            message="Checking the files (dispatched, no inference).",
            tool_calls=[_bash("call_2_1", "ls notes\n")],
            observation=Observation(results=[ObservationResult(source_call_id="call_2_1", content="a.md\n")]),
            llm_call_count=0,
        ),
        Step(
            step_id=7,
            source="agent",
            model_name="openai/gpt-test",
            message="All files are written.",
            tool_calls=[
                ToolCall(
                    tool_call_id="call_3_task_complete", function_name="mark_task_complete", arguments={}
                )
            ],
            observation=Observation(
                results=[ObservationResult(source_call_id="call_3_task_complete", content="ok")]
            ),
            llm_call_count=1,
        ),
    ]
    return Trajectory(
        schema_version="ATIF-v1.8",
        session_id="terminus-2-session",
        agent=Agent(name="terminus-2", version="2.0.0", model_name="openai/gpt-test"),
        steps=steps,
        final_metrics=FinalMetrics(total_prompt_tokens=120, total_completion_tokens=30, total_steps=7),
    )


def main(native: str, out: str) -> None:
    dest = Path(out)
    (dest / "images").mkdir(parents=True, exist_ok=True)
    (dest / "images" / "screen.png").write_bytes(PNG)
    (dest / "audio").mkdir(exist_ok=True)
    (dest / "audio" / "task.wav").write_bytes(b"RIFF$\x00\x00\x00WAVEfmt ")  # a stub: pvisor never reads it
    mini = convert_mini_swe_agent_to_atif(json.loads(Path(native).read_text()), "harbor-mini-session")
    files = {
        "harbor-mini-swe-agent.json": mini,
        "harbor-terminus-2-v1.8.json": terminus(),
    }
    errors: dict[str, list[str]] = {}
    for name, traj in files.items():
        path = dest / name
        path.write_text(json.dumps(traj.to_json_dict(), indent=2, ensure_ascii=False) + "\n")
        validator = TrajectoryValidator()
        validator.validate(str(path))
        errors[str(path)] = list(validator.get_errors())
    json.dump({"harbor": version("harbor"), "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
