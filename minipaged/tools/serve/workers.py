"""The worker's side of the routers' protocol: what vllm-router and sglang-router ask of
a replica besides generation (server and model info, load, the render routes, a
prefix-cache reset, a health check that generates), in vLLM's shapes where vLLM has the
route and SGLang's where only SGLang has it. Registered by api.Server; the reset runs on
the engine loop's thread, between two steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from minipaged.sampling import SamplingParams
from minipaged.tools.serve import protocol
from minipaged.tools.serve.protocol import APIError

# the mark a router's worker URL carries to say it is SGLang's (http://HOST:PORT/sglang):
# both routers read GET /get_load, each in its own shape, and neither says who it is
SGLANG = "/sglang"
# a step within this many seconds: a busy engine is healthy without a token of its own
RECENT_STEP = 10.0
# vLLM's SamplingParams fields a render answer carries (GenerateRequest.sampling_params)
RENDERED_PARAMS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "prompt_logprobs",
)


class CallerMount:
    """ASGI middleware: a request to /sglang/PATH is served as PATH and marked as
    sglang-router's (request.state.caller), so that one replica answers both routers:
    give sglang-router the worker URL http://HOST:PORT/sglang, vllm-router the plain
    one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and (
            path == SGLANG or path.startswith(f"{SGLANG}/")
        ):
            inner = path[len(SGLANG) :] or "/"
            scope = dict(
                scope,
                path=inner,
                raw_path=inner.encode(),
                state=dict(scope.get("state") or {}, caller="sglang"),
            )
        await self.app(scope, receive, send)


class Workers:
    """The router-facing routes of one Server: they read what the server knew at start
    and what the metrics watcher saw at the last step, and touch the engine only
    through the loop."""

    def __init__(self, server, engine, model_path: str, version: str):
        self.server, self.version = server, version
        self.model_path = model_path
        self.architecture = engine.model.config.architecture
        self.prefix_caching = bool(engine.config.enable_prefix_caching)
        self.bos = engine.model.config.bos_token_id or 0
        # the replica's name for a router's KV directory, new at each start
        self.instance_id = f"minipaged-{secrets.token_hex(6)}"
        self.model_config = read_config(model_path)
        # the KV-cache events' publisher (kv_events.py), set when the command line
        # starts one (--kv-events-config); None: GET /kv_event_sources answers {}
        self.kv_events = None

    def routes(self, app: FastAPI) -> None:
        for path in ("/get_server_info", "/server_info"):
            app.get(path)(self.server_info)
        for path in ("/get_model_info", "/model_info"):
            app.get(path)(self.model_info)
        app.get("/get_load")(self.load)
        app.post("/v1/chat/completions/render")(self.render_chat)
        app.post("/v1/completions/render")(self.render_completions)
        app.get("/health_generate")(self.health_generate)
        app.post("/reset_prefix_cache")(self.reset_prefix_cache)
        app.post("/flush_cache")(self.reset_prefix_cache)
        app.get("/kv_event_sources")(self.kv_event_sources)

    async def kv_event_sources(self, request: Request) -> dict[str, dict]:
        """vLLM's GET /kv_event_sources: where a router subscribes to this replica's
        KV-cache events, by data-parallel rank; {} when none are published."""
        if self.kv_events is None:
            return {}
        return self.kv_events.sources(request.url.hostname)

    # ---- what the replica is -------------------------------------------------------
    async def server_info(self) -> dict:
        """SGLang's GET /get_server_info (also /server_info): its server arguments
        flat, with what vllm-router's kv_aware reads (model_id, instance_id,
        kv_block_size)."""
        s, name = self.server, self.server.config.model_name
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": name,
            "model_id": name,
            "instance_id": self.instance_id,
            "version": self.version,
            "kv_block_size": s.block_size,
            "page_size": s.block_size,
            "num_gpu_blocks": s.num_frames,
            "max_total_num_tokens": s.num_frames * s.block_size,
            "context_length": s.max_model_len,
            "max_model_len": s.max_model_len,
            "max_running_requests": s.max_num_seqs,
            "enable_prefix_caching": self.prefix_caching,
            "disable_radix_cache": not self.prefix_caching,
            "scheduling_policy": s.order_name,
            "dp_size": 1,
            "tp_size": 1,
        }

    async def model_info(self) -> dict:
        """SGLang's GET /get_model_info (also /model_info)."""
        config = self.model_config
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures") or [self.architecture],
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    # ---- how busy it is ------------------------------------------------------------
    async def load(self, request: Request):
        """GET /get_load: vllm-router's {"load": requests not yet done}; under
        /sglang, SGLang's list of one entry per data-parallel rank (one here)."""
        if getattr(request.state, "caller", None) != "sglang":
            return {"load": self.server.loop.num_unfinished}
        load = self.server.metrics.load
        return [
            {
                "dp_rank": 0,
                "num_reqs": load.running + load.waiting,
                "num_waiting_reqs": load.waiting,
                "num_tokens": load.tokens,
            }
        ]

    async def health_generate(self) -> Response:
        """SGLang's GET /health_generate: 200 once the engine has generated a token (a
        busy engine that stepped lately needs none of its own), else 503 saying why."""
        loop = self.server.loop
        if loop.error:
            raise APIError(503, loop.error)
        stepped_at = self.server.metrics.load.stepped_at
        if loop.num_unfinished and stepped_at is not None:
            if time.monotonic() - stepped_at < RECENT_STEP:
                return Response(status_code=200)
        request_id = f"health-generate-{next(self.server.ids)}"
        updates: asyncio.Queue = asyncio.Queue()
        params = SamplingParams(max_tokens=1, temperature=0)
        prompt = {"prompt_token_ids": [self.bos]}
        loop.add_request(request_id, prompt, params, updates, client="health_generate")
        finished = False
        try:
            async with asyncio.timeout(loop.watchdog_seconds):
                while not finished:
                    update = await updates.get()
                    if update.error is not None:
                        finished = True
                        raise APIError(
                            503,
                            f"the engine refused a one-token request: {update.error}",
                        )
                    finished = update.output is not None
        except TimeoutError:
            raise APIError(
                503,
                f"the engine generated no token in {loop.watchdog_seconds:g} s",
            ) from None
        finally:
            if not finished:  # timed out, or the caller left
                loop.abort(request_id)
        return Response(status_code=200)

    # ---- vLLM's render routes: the prompt as the engine would get it ---------------
    async def render_chat(self, request: Request) -> dict:
        """vLLM's POST /v1/chat/completions/render: the chat request checked and
        rendered through the chat template, answered as vLLM's GenerateRequest (its
        token_ids and sampling_params), nothing generated."""
        s = self.server
        body = await s._body(request, protocol.ChatCompletionRequest)
        prompt = s._prompt(s._render(body), "messages", body)
        return self._generate_request("chatcmpl", body, prompt, chat=True)

    async def render_completions(self, request: Request) -> list[dict]:
        """vLLM's POST /v1/completions/render: one GenerateRequest per prompt."""
        s = self.server
        body = await s._body(request, protocol.CompletionRequest)
        prompts = [s._prompt(p, "prompt", body) for p in body.prompts()]
        return [self._generate_request("cmpl", body, p, chat=False) for p in prompts]

    def _generate_request(self, kind: str, body, prompt: dict, chat: bool) -> dict:
        params = dataclasses.asdict(self.server._params(body, [prompt], chat))
        options = None  # vLLM's: a stream's options, or none
        if body.stream and body.stream_options is not None:
            options = body.stream_options.model_dump()
        return {
            "request_id": f"{kind}-{secrets.token_hex(16)}",
            "token_ids": prompt["prompt_token_ids"],
            "features": None,
            "sampling_params": {k: params[k] for k in RENDERED_PARAMS if k in params},
            "model": body.model,
            "stream": body.stream,
            "stream_options": options,
            "cache_salt": None,
            "priority": body.priority,
            "kv_transfer_params": None,
        }

    # ---- the prefix cache, dropped -------------------------------------------------
    async def reset_prefix_cache(self, request: Request) -> JSONResponse:
        """vLLM's POST /reset_prefix_cache and SGLang's POST /flush_cache: drop every
        cached block no sequence maps, on the engine's thread between two steps, and
        say how many (blocks that running sequences map stay cached)."""
        s = self.server
        s._authorize(request)
        if s.loop.error:
            raise APIError(503, s.loop.error)
        try:
            dropped = await asyncio.wait_for(
                s.loop.call(reset_prefix_cache), s.loop.watchdog_seconds
            )
        except TimeoutError:
            raise APIError(
                503,
                "the engine did not take the reset within"
                f" {s.loop.watchdog_seconds:g} s: its step is stuck (see /health)",
            ) from None
        return JSONResponse(
            {
                "dropped_blocks": dropped,
                "message": (
                    f"dropped {dropped} cached blocks that no sequence maps; blocks"
                    " that running sequences map stay cached"
                ),
            }
        )

    # ---- /openapi.json -------------------------------------------------------------
    def document(self, paths: dict, ref, errors) -> None:
        """Each route's answers in the schema (api.Server._schema's ref and errors)."""
        for path in ("/get_server_info", "/server_info"):
            paths[path]["get"]["responses"] = answer(
                "SGLang's server arguments, with vllm-router's fields",
                obj(
                    "model_path",
                    "served_model_name",
                    "model_id",
                    "instance_id",
                    "kv_block_size",
                ),
            )
        for path in ("/get_model_info", "/model_info"):
            paths[path]["get"]["responses"] = answer(
                "SGLang's model info",
                obj("model_path", "tokenizer_path", "is_generation"),
            )
        paths["/get_load"]["get"]["responses"] = answer(
            "vllm-router's load (requests not yet done); under /sglang, SGLang's list",
            {"type": "object", "required": ["load"], "properties": {"load": COUNT}},
        )
        paths["/kv_event_sources"]["get"]["responses"] = answer(
            "where a router subscribes to the KV-cache events, by data-parallel rank"
            " ({} without --kv-events-config)",
            {"type": "object", "additionalProperties": {"type": "object"}},
        )
        generate = obj("request_id", "token_ids", "sampling_params", "model")
        generate["properties"]["token_ids"] = {"type": "array", "items": COUNT}
        for path, request, response in (
            ("/v1/chat/completions/render", "ChatCompletionRequest", generate),
            (
                "/v1/completions/render",
                "CompletionRequest",
                {"type": "array", "items": generate},
            ),
        ):
            paths[path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": ref(request)},
            }
            paths[path]["post"]["responses"] = errors(400, 404, 413, 415) | answer(
                "vLLM's GenerateRequest: the prompt's token ids and sampling params",
                response,
            )
        paths["/health_generate"]["get"]["responses"] = {
            "200": {"description": "the engine generates"}
        } | errors(503, key=False)
        for path in ("/reset_prefix_cache", "/flush_cache"):
            paths[path]["post"]["responses"] = errors(503) | answer(
                "the cached blocks no sequence maps, dropped",
                obj("dropped_blocks", "message"),
            )


COUNT = {"type": "integer", "minimum": 0}


def obj(*required: str) -> dict:
    return {"type": "object", "required": list(required), "properties": {}}


def answer(description: str, schema: dict) -> dict:
    return {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


def reset_prefix_cache(engine) -> int:
    """On the engine thread (loop.call): the block manager's reset, 0 for a block
    manager without a prefix cache (the contiguous and static baselines)."""
    reset = getattr(engine.blocks, "reset_prefix_cache", None)
    if reset is None:
        return 0
    return reset()


def read_config(model_path: str) -> dict:
    """The model folder's config.json ({} when the path is no folder: a hub id)."""
    path = Path(model_path) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
