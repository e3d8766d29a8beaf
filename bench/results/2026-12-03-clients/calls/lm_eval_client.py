"""lm-evaluation-harness as its users run it against an OpenAI-compatible server:
`lm_eval --model local-completions` (log-likelihoods: multiple choice and perplexity,
then generation) and `--model local-chat-completions` (generation through the chat
template), on the small local tasks in ../lm_eval_tasks/ (no download)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from common import BASE, MODEL, call

TASKS = Path(__file__).resolve().parent.parent / "lm_eval_tasks"
LM_EVAL = str(Path(sys.executable).parent / "lm_eval")
TOKENIZER = os.environ.get(
    "TOKENIZER",
    str(Path.home() / ".cache/minipaged/SmolLM2-135M-Instruct-from-gguf-v1"),
)
os.environ |= {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def lm_eval(model: str, task: str, *extra: str, route="completions", args="") -> str:
    model_args = f"model={MODEL},base_url={BASE}/v1/{route}{args}"
    done = subprocess.run(
        [
            LM_EVAL,
            "--model",
            model,
            "--model_args",
            model_args,
            "--tasks",
            task,
            "--include_path",
            ".",
            *extra,
        ],
        cwd=TASKS,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    table = [line for line in done.stdout.splitlines() if line.startswith(f"|{task}")]
    if done.returncode != 0 or not table:
        raise RuntimeError(f"rc={done.returncode}: {done.stderr.strip()[-400:]}")
    return re.sub(r"\s+", " ", table[0])


HF = f",tokenizer_backend=huggingface,tokenizer={TOKENIZER}"


@call("local-completions multiple choice (loglikelihood), batch_size 1")
def _():
    return lm_eval("local-completions", "room_mc", args=HF)


@call("local-completions multiple choice, --batch_size 8")
def _():
    return lm_eval("local-completions", "room_mc", "--batch_size", "8", args=HF)


@call("local-completions multiple choice, num_concurrent=8")
def _():
    return lm_eval("local-completions", "room_mc", args=HF + ",num_concurrent=8")


@call("local-completions perplexity (loglikelihood_rolling)")
def _():
    return lm_eval("local-completions", "room_ppl", args=HF)


@call("local-completions generate_until")
def _():
    return lm_eval("local-completions", "room_gen", args=HF)


@call("local-chat-completions generate_until --apply_chat_template")
def _():
    return lm_eval(
        "local-chat-completions",
        "room_gen",
        "--apply_chat_template",
        route="chat/completions",
    )
