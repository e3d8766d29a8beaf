"""Shim for vLLM's tests/utils.py: RemoteOpenAIServer starts `python -m minipaged.serve` instead of
`vllm serve`. Written for this run (not vLLM's code). The tree served is $MINIPAGED_TREE
(default /work/main), run with $MINIPAGED_PYTHON (default /work/main/.venv/bin/python), cwd and
PYTHONPATH = the tree, so that its own minipaged package is the one imported."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import requests

TREE = os.environ.get("MINIPAGED_TREE", "/work/main")
PYTHON = os.environ.get("MINIPAGED_PYTHON", "/work/main/.venv/bin/python")
MODEL_MAX_LEN = 8192  # SmolLM2-135M-Instruct's max_position_embeddings
LOG_DIR = Path(os.environ.get("MINIPAGED_LOG_DIR", str(Path(__file__).resolve().parents[1] / "logs")))

# vLLM flags minipaged has under the same name and meaning (each takes a value unless noted)
KEPT_WITH_VALUE = {"--max-model-len", "--max-num-seqs", "--api-key", "--block-size", "--served-model-name",
                   "--scheduling-policy", "--speculative-config", "--root-path"}
KEPT_BOOL = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-force-include-usage"}
_HELP = {}


def tree_has(flag: str) -> bool:
    """Whether the tree's `python -m minipaged.serve` knows `flag` (an older tree may not)."""
    if TREE not in _HELP:
        _HELP[TREE] = subprocess.run([PYTHON, "-m", "minipaged.serve", "--help"], cwd=TREE, capture_output=True,
                                     text=True, env=dict(os.environ, PYTHONPATH=TREE), timeout=120).stdout
    return flag in _HELP[TREE]
# vLLM flags that take no value (dropped: minipaged has no such option)
DROPPED_BOOL = {"--enforce-eager", "--enable-server-load-tracking", "--enable-auto-tool-choice",
                "--trust-remote-code", "--disable-frontend-multiprocessing", "--enable-prompt-tokens-details",
                "--disable-log-stats", "--enable-log-requests",
                "--disable-log-requests", "--return-tokens-as-token-ids", "--enable-chunked-prefill",
                "--no-enable-chunked-prefill", "--enable-prompt-embeds", "--enable-lora", "--enable-sleep-mode",
                "--disable-uvicorn-access-log", "--enable-request-id-headers", "--enable-log-outputs"}


def translate(model: str, vllm_args: list[str]) -> tuple[list[str], list[str]]:
    """vLLM serve args -> (minipaged args, dropped vLLM args)."""
    kept, dropped = {}, []
    kept_bool = []
    args = list(vllm_args)
    i = 0
    while i < len(args):
        arg = str(args[i])
        name, eq, value = arg.partition("=")
        if name in KEPT_BOOL and tree_has(name):
            kept_bool.append(name)
            i += 1
            continue
        if name in KEPT_BOOL:  # this tree lacks it
            dropped.append(name)
            i += 1
            continue
        if name in DROPPED_BOOL or not name.startswith("--"):
            dropped.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                value = str(args[i + 1])
                i += 1
            else:  # a flag without a value we do not know: drop it
                dropped.append(name)
                i += 1
                continue
        i += 1
        if name in KEPT_WITH_VALUE and tree_has(name):
            kept[name] = value
        else:
            dropped.append(f"{name}={value}")
    kept.setdefault("--served-model-name", model)
    if "--max-model-len" in kept and int(kept["--max-model-len"]) > MODEL_MAX_LEN:
        dropped.append(f"--max-model-len={kept['--max-model-len']} (clamped to {MODEL_MAX_LEN})")
        kept["--max-model-len"] = str(MODEL_MAX_LEN)
    max_len = kept.get("--max-model-len", str(MODEL_MAX_LEN))
    out = []
    for name, value in kept.items():
        out += [name, value]
    out += kept_bool
    # vLLM-like bounds: no per-client cap, a long queue, max_tokens bounded by the context only
    out += ["--max-concurrent-per-client", "0", "--max-waiting", "100000", "--max-tokens-limit", max_len,
            "--device", os.environ.get("MINIPAGED_DEVICE", "cpu"), "--log-level", "warning"]
    return out, dropped


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteOpenAIServer:
    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict: dict | None = None,
                 seed: int | None = 0, auto_port: bool = True, max_wait_seconds: float | None = None,
                 override_hf_configs: dict | None = None, **kwargs) -> None:
        self.model = model
        self.show_hidden_metrics = any(str(a).startswith("--show-hidden-metrics-for-version")
                                       for a in vllm_serve_args)
        self.host = "127.0.0.1"
        self.port = free_port()
        args, self.dropped = translate(model, vllm_serve_args)
        if (env_dict or {}).get("VLLM_API_KEY") and "--api-key" not in args:  # vLLM's env for --api-key
            args += ["--api-key", env_dict["VLLM_API_KEY"]]
        if "--api-key" in args:
            self.DUMMY_API_KEY = args[args.index("--api-key") + 1]
        self.command = [PYTHON, "-m", "minipaged.serve", "--host", self.host, "--port", str(self.port), *args]
        env = dict(os.environ, PYTHONPATH=TREE, PYTHONUNBUFFERED="1")
        env.update(env_dict or {})
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"server-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.log.write(" ".join(self.command) + f"\n# dropped vLLM args: {self.dropped}\n")
        self.log.flush()
        self.proc = subprocess.Popen(self.command, cwd=TREE, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_for_server(timeout=max_wait_seconds or 180)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()

    def _wait_for_server(self, *, timeout: float) -> None:
        start = time.time()
        while True:
            try:
                if requests.get(self.url_for("v1/models"), timeout=2,
                                headers={"Authorization": f"Bearer {self.DUMMY_API_KEY}"}).status_code == 200:
                    return
            except Exception:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {self.log_path}")
            if time.time() - start > timeout:
                self.proc.kill()
                raise RuntimeError(f"server did not start in {timeout} s; see {self.log_path}")
            time.sleep(0.5)

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs):
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0,
                                  **kwargs)


class RemoteOpenAIServerCustom(RemoteOpenAIServer):
    pass
