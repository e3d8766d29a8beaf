"""Simon Willison's `llm`, as its users call it: the command line against models
declared in extra-openai-models.yaml (a chat model, a completion model, one with
`responses: true`), with --system, -o options, --schema, a continued conversation,
and the Python API."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import BASE, MODEL, call

home = Path(tempfile.mkdtemp(prefix="llm-home-"))
(home / "extra-openai-models.yaml").write_text(
    f"""- model_id: smol
  model_name: {MODEL}
  api_base: {BASE}/v1
  supports_schema: true
  supports_tools: true
- model_id: smol-completion
  model_name: {MODEL}
  api_base: {BASE}/v1
  completion: true
- model_id: smol-responses
  model_name: {MODEL}
  api_base: {BASE}/v1
  responses: true
  supports_schema: true
"""
)
os.environ["LLM_USER_PATH"] = str(home)
os.environ["OPENAI_API_KEY"] = "none"
LLM = str(Path(sys.executable).parent / "llm")


def llm(*args: str) -> str:
    done = subprocess.run([LLM, *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"rc={done.returncode}: {done.stderr.strip()[-300:]}")
    assert done.stdout.strip(), "no output"
    return done.stdout.strip()


@call("llm -m smol PROMPT")
def _():
    return llm("-m", "smol", "Name a colour.", "-o", "max_tokens", "16")


@call("llm -m smol --system ... -o temperature 0")
def _():
    return llm(
        "-m",
        "smol",
        "--system",
        "Be brief.",
        "Name a colour.",
        "-o",
        "temperature",
        "0",
        "-o",
        "max_tokens",
        "16",
    )


@call("llm -m smol --no-stream")
def _():
    return llm("-m", "smol", "--no-stream", "Name a colour.", "-o", "max_tokens", "16")


@call("llm -c (continue the conversation)")
def _():
    return llm("-c", "And another one?", "-o", "max_tokens", "16")


@call("llm -m smol --schema 'name, age int'")
def _():
    out = llm(
        "-m",
        "smol",
        "--schema",
        "name, age int",
        "Invent a person.",
        "-o",
        "max_tokens",
        "100",
    )
    return json.loads(out)


@call("llm -m smol-completion PROMPT")
def _():
    return llm("-m", "smol-completion", "Once upon a time", "-o", "max_tokens", "16")


@call("llm -m smol-responses PROMPT (responses: true)")
def _():
    return llm("-m", "smol-responses", "Name a colour.", "-o", "max_tokens", "16")


@call("llm -m smol-responses --schema")
def _():
    out = llm(
        "-m",
        "smol-responses",
        "--schema",
        "name, age int",
        "Invent a person.",
        "-o",
        "max_tokens",
        "100",
    )
    return json.loads(out)


@call("Python API: llm.get_model('smol').prompt(...)")
def _():
    import llm as llm_api

    model = llm_api.get_model("smol")
    response = model.prompt("Name a colour.", max_tokens=16)
    assert response.text()
    return response.text()


@call("llm logs (the calls were logged)")
def _():
    return llm("logs", "-n", "1", "--json")[:100]
