"""The HTTP layer: OpenAI-shaped routes (FastAPI), /metrics, and the dashboard.

The first stop of a request that comes over the network: read (bounded), checked
(protocol.py) and tokenized here, then handed to the engine loop; its updates leave as
JSON or as SSE. Every error a client can cause is OpenAI's error JSON, and none leaves a
traceback in the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import math
import secrets
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from minipaged import policies
from minipaged.tools.serve import logprobs, protocol, responses, tools
from minipaged.tools.serve.clients import TrustedProxies
from minipaged.tools.serve.dashboard import Dashboard, page
from minipaged.tools.serve.loop import EngineLoop, Update
from minipaged.tools.serve.metrics import Metrics
from minipaged.tools.serve.protocol import ERROR_TYPES, APIError
from minipaged.tools.serve.workers import CallerMount, Workers

SAMPLING_FIELDS = {
    "n",
    "temperature",
    "top_k",
    "top_p",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "logit_bias",
    "logprobs",
    "prompt_logprobs",
}
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
# structured outputs compiled at once (each on a thread; the others wait their turn)
COMPILING = 2
LOG = logging.getLogger("minipaged.serve")
try:
    VERSION = version("minipaged")  # /version, as vLLM answers it with its own
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0.1.0"


class ClientGone(Exception):
    """The client hung up before its answer was ready: nobody reads one, nothing is
    logged."""


@dataclass
class ServerConfig:
    model_name: str  # the name clients put in "model" (vLLM's --served-model-name)
    # when set, every /v1 route wants "Authorization: Bearer <key>",
    api_key: str | None = None
    # and the dashboard's data shows text only to the key
    # unfinished requests beyond max_num_seqs that may queue; more get 503
    max_waiting: int = 256
    dashboard_show_text: bool = False
    # a chat request without max_tokens (less if the context or pool is smaller)
    default_max_tokens: int = 256
    # more is a 400 (None: the context is the only limit)
    max_tokens_limit: int | None = None
    # sequences one client may have unfinished; more is a 429 (0: no bound).
    max_concurrent_per_client: int = 0
    # Off for a server built in Python (one caller); the command line's is on
    # vLLM's --enable-force-include-usage: every stream, the usage in every chunk
    force_include_usage: bool = False
    # vLLM's --root-path: behind a proxy's prefix; /v1 and <root_path>/v1 both answer
    root_path: str = ""
    max_body_bytes: int = 1 << 20  # a larger body gets 413
    # /v1/responses sent with store, kept in memory; the oldest are evicted first
    max_stored_responses: int = 256
    # seconds between dashboard snapshots (about 10 a second)
    snapshot_interval: float = 0.1
    # --forwarded-allow-ips: proxies whose X-Forwarded-For and `user` name the client
    forwarded_allow_ips: tuple[str, ...] = ()
    # the model's folder or hub id, as the routers' info routes give it (model_name if
    # None)
    model_path: str | None = None


class RootPath:
    """ASGI middleware: every request's scope names `root_path` (a proxy's prefix,
    vLLM's --root-path), so that /llm/v1/models is routed as /v1/models; /v1/models
    still is.
    """

    def __init__(self, app, root_path: str):
        self.app, self.root_path = app, root_path

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope, root_path=self.root_path)
        await self.app(scope, receive, send)


class Server:
    """One engine, its loop thread and its watchers, behind one FastAPI app (`.app`).
    Nothing here touches the engine: the loop owns it. In Python: `Server(engine,
    tokenizer, ServerConfig(model_name=...))`, and `with ServerThread(server) as url:`
    (cli.py) serves it from a thread of your process."""

    def __init__(self, engine, tokenizer, config: ServerConfig):
        self.config, self.tokenizer = config, tokenizer
        self.max_model_len, self.max_num_seqs = (
            engine.max_model_len,
            engine.config.max_num_seqs,
        )
        self.num_frames, self.block_size = (
            engine.blocks.num_frames,
            engine.blocks.block_size,
        )
        # for the schema: the engine checks token ids
        self.vocab_size = engine.model.config.vocab_size
        # structured output's compiler: a bad regex is a 400 at the door
        self.constrainer = engine.constrainer
        # patterns compiling at once, each on a worker thread
        self.compiling = asyncio.Semaphore(COMPILING)
        # a request's `priority` needs a waiting order that reads it
        order = engine.scheduler.order
        self.uses_priority, self.order_name = (
            getattr(order, "uses_priority", False),
            policies.name_of(order),
        )
        self.metrics = Metrics(
            config.model_name,
            self.max_model_len,
            {"block_size": self.block_size, "num_gpu_blocks": self.num_frames},
        )
        self.logged: set[str] = set()  # unknown fields ignored and logged once (debug)
        self.dashboard = Dashboard(
            config.model_name,
            config.snapshot_interval,
            config.dashboard_show_text,
            engine=engine,
        )
        self.loop = EngineLoop(engine, [self.metrics, self.dashboard])
        self.slots = ClientSlots(config.max_concurrent_per_client)
        self.proxies = TrustedProxies(config.forwarded_allow_ips)
        self.workers = Workers(
            self, engine, config.model_path or config.model_name, VERSION
        )
        self.ids = itertools.count()
        self.stored = responses.Store(config.max_stored_responses)
        self.created = int(time.time())
        self.app = self._routes(FastAPI(title="minipaged", lifespan=self._lifespan))
        # vLLM's --root-path: the router strips the prefix when a path has it
        if config.root_path:
            self.app.add_middleware(RootPath, root_path=config.root_path.rstrip("/"))
        # /sglang/...: sglang-router's (workers.py)
        self.app.add_middleware(CallerMount)
        self.app.openapi = self.openapi

    @asynccontextmanager
    async def _lifespan(self, app):
        self.loop.start()
        yield
        self.loop.stop()

    # ---- routes ----------------------------------------------------------------------
    def _routes(self, app: FastAPI) -> FastAPI:
        app.exception_handler(APIError)(
            lambda request, error: JSONResponse(
                error.body(), error.status, error.headers
            )
        )
        app.exception_handler(HTTPException)(self._no_route)
        # nginx's "client closed"
        app.exception_handler(ClientGone)(
            lambda request, error: Response(status_code=499)
        )
        # a bug: still OpenAI's JSON for the client, and (Starlette re-raises it) a
        # traceback in the log
        app.exception_handler(Exception)(
            lambda request, error: JSONResponse(
                APIError(500, f"internal error: {type(error).__name__}").body(), 500
            )
        )
        app.get("/health")(self.health)
        app.get("/metrics")(
            lambda: Response(
                self.metrics.render(), media_type="text/plain; version=0.0.4"
            )
        )
        app.get("/v1/models")(self.models)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/chat/completions")(self.chat_completions)
        # vLLM's (SageMaker's): either of the two above
        app.post("/invocations")(self.invocations)
        # OpenAI's Responses API, as vLLM serves it (chat's path underneath)
        app.post("/v1/responses", include_in_schema=False)(self.responses)
        app.get("/v1/responses/{response_id}", include_in_schema=False)(
            self.get_response
        )
        app.post("/v1/responses/{response_id}/cancel", include_in_schema=False)(
            self.cancel_response
        )
        app.delete("/v1/responses/{response_id}", include_in_schema=False)(
            self.delete_response
        )
        app.get("/v1/responses/{response_id}/input_items", include_in_schema=False)(
            self.input_items
        )
        # generation only: a route that says so, and what to use instead
        app.post("/v1/embeddings", include_in_schema=False)(self.embeddings)
        app.post("/tokenize")(self.tokenize)  # vLLM's routes beside OpenAI's
        app.post("/detokenize")(self.detokenize)
        app.get("/tokenizer_info")(self.tokenizer_info)
        app.get("/version")(lambda: {"version": VERSION})
        # vLLM's /ping (SageMaker's): /health by another name
        app.get("/ping")(self.health)
        app.post("/ping")(self.health)
        # vLLM's: requests not yet done
        app.get("/load")(lambda: {"server_load": self.loop.num_unfinished})
        self.workers.routes(app)  # the routers' protocol: info, load, render, reset
        app.get("/", include_in_schema=False)(lambda: HTMLResponse(page()))
        app.get("/dashboard/snapshot")(self.snapshot)
        app.get("/dashboard/events", include_in_schema=False)(self.snapshot_events)
        return app

    def openapi(self) -> dict:
        """/openapi.json: the request and response models of protocol.py, with this
        server's own bounds (the model it serves, n up to max_num_seqs, max_tokens up to
        its limit, token ids in its vocabulary, prompts per request up to what may
        queue), so that a client generator or a fuzzer knows what is accepted."""
        if self.app.openapi_schema is None:
            self.app.openapi_schema = self._schema()
        return self.app.openapi_schema

    def _schema(self) -> dict:
        schema = get_openapi(
            title="minipaged",
            version=VERSION,
            routes=self.app.routes,
            description="An OpenAI-compatible server (python -m minipaged.serve).",
        )
        models = [
            protocol.CompletionRequest,
            protocol.ChatCompletionRequest,
            protocol.CompletionResponse,
            protocol.ChatCompletionResponse,
            protocol.ModelList,
            protocol.ErrorResponse,
            protocol.TokenizeRequest,
            protocol.TokenizeChatRequest,
            protocol.TokenizeResponse,
            protocol.DetokenizeRequest,
            protocol.DetokenizeResponse,
            protocol.TokenizerInfoResponse,
            protocol.VersionResponse,
            responses.ResponsesRequest,
        ]
        _, defs = models_json_schema(
            [(m, "validation") for m in models],
            ref_template="#/components/schemas/{model}",
        )
        schema.setdefault("components", {})["schemas"] = self._own_bounds(defs["$defs"])

        def ref(name: str) -> dict:
            return {"schema": {"$ref": f"#/components/schemas/{name}"}}

        # key: the route wants the API key
        def errors(*statuses: int, key: bool = True) -> dict:
            return {
                str(s): {
                    "description": ERROR_TYPES[s],
                    "content": {"application/json": ref("ErrorResponse")},
                }
                for s in statuses + ((401,) if key and self.config.api_key else ())
            }

        paths, refusals = (
            schema["paths"],
            (400, 404, 413, 415, 503) + ((429,) if self.slots.limit else ()),
        )
        for path, request, response in (
            ("/v1/completions", "CompletionRequest", "CompletionResponse"),
            ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletionResponse"),
        ):
            paths[path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": ref(request)},
            }
            paths[path]["post"]["responses"] = errors(*refusals) | {
                "200": {
                    "description": (
                        "the answer; with stream=true, server-sent events of chunks"
                        " ending in [DONE]"
                    ),
                    "content": {
                        "application/json": ref(response),
                        "text/event-stream": {
                            "schema": {  # each event
                                "type": "object",
                                "required": ["data"],
                                "properties": {"data": {"type": "string"}},
                            }
                        },
                    },
                }
            }
        either = {
            "anyOf": [
                ref("ChatCompletionRequest")["schema"],
                ref("CompletionRequest")["schema"],
            ]
        }
        # vLLM's (SageMaker's) /invocations: a chat or a completion, answered as its
        # own route does
        paths["/invocations"]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": either}},
        }
        paths["/invocations"]["post"]["responses"] = paths["/v1/completions"]["post"][
            "responses"
        ] | {
            "200": {
                "description": (
                    "the chat's or the completion's answer (streamed with stream=true)"
                ),
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                ref("ChatCompletionResponse")["schema"],
                                ref("CompletionResponse")["schema"],
                            ]
                        }
                    },
                    "text/event-stream": paths["/v1/completions"]["post"]["responses"][
                        "200"
                    ]["content"]["text/event-stream"],
                },
            }
        }
        paths["/load"]["get"]["responses"] = {
            "200": {
                "description": "vLLM's: requests not yet done",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["server_load"],
                            "properties": {
                                "server_load": {"type": "integer", "minimum": 0}
                            },
                        }
                    }
                },
            }
        }
        paths["/v1/models"]["get"]["responses"] = errors() | {
            "200": {
                "description": "the model served",
                "content": {"application/json": ref("ModelList")},
            }
        }
        for path, operation in (
            ("/health", "get"),
            ("/ping", "get"),
            ("/ping", "post"),
        ):
            paths[path][operation]["responses"] = {
                "200": {"description": "the engine loop runs"}
            } | errors(503)
        tokenize = {
            "anyOf": [
                ref("TokenizeRequest")["schema"],
                ref("TokenizeChatRequest")["schema"],
            ]
        }
        for path, request, response in (
            ("/tokenize", {"schema": tokenize}, "TokenizeResponse"),
            ("/detokenize", ref("DetokenizeRequest"), "DetokenizeResponse"),
        ):
            paths[path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": request},
            }
            paths[path]["post"]["responses"] = {
                "200": {
                    "description": "vLLM's answer",
                    "content": {"application/json": ref(response)},
                }
            } | errors(400, 404, 413, 415, key=False)
        for path, response in (
            ("/tokenizer_info", "TokenizerInfoResponse"),
            ("/version", "VersionResponse"),
        ):
            paths[path]["get"]["responses"] = {
                "200": {
                    "description": "vLLM's answer",
                    "content": {"application/json": ref(response)},
                }
            }
        # the Responses routes (registered out of the generated schema, written here)
        paths |= responses.openapi_paths(ref, errors, refusals)
        paths["/metrics"]["get"]["responses"] = {
            "200": {
                "description": "Prometheus metrics",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        }
        self.workers.document(paths, ref, errors)
        if self.config.api_key:
            schema["components"]["securitySchemes"] = {
                "key": {"type": "http", "scheme": "bearer"}
            }
            for path in (
                "/v1/models",
                "/v1/completions",
                "/v1/chat/completions",
                "/invocations",
                "/v1/chat/completions/render",
                "/v1/completions/render",
                "/reset_prefix_cache",
                "/flush_cache",
                *(path for path in paths if path.startswith("/v1/responses")),
            ):
                for operation in paths[path].values():
                    operation["security"] = [{"key": []}]
        return schema

    def _own_bounds(self, schemas: dict) -> dict:
        """The request schemas with what this server accepts: its model, n up to
        max_num_seqs (and a client's share), max_tokens up to the limit, token ids in
        the vocabulary, prompts up to what may queue (and a client's share)."""
        limit = min(
            self.config.max_tokens_limit or self.max_model_len, self.max_model_len - 1
        )
        for name in ("CompletionRequest", "ChatCompletionRequest"):
            fields = schemas[name]["properties"]
            fields["model"]["anyOf"][0]["enum"] = [self.config.model_name]
            fields["n"]["maximum"] = min(
                self.max_num_seqs, self.slots.limit or self.max_num_seqs
            )
            fields["max_tokens"]["anyOf"][0]["maximum"] = fields[
                "max_completion_tokens"
            ]["anyOf"][0]["maximum"] = limit
            fields["stop_token_ids"]["anyOf"][0]["items"]["maximum"] = (
                self.vocab_size - 1
            )
        schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] = (
            self.vocab_size - 1
        )
        # after str
        ids, texts, ids_batch = schemas["CompletionRequest"]["properties"]["prompt"][
            "anyOf"
        ][1:]
        most = self.max_num_seqs + self.config.max_waiting
        # each prompt is one client slot or more
        texts["maxItems"] = ids_batch["maxItems"] = min(most, self.slots.limit or most)
        ids["items"]["maximum"] = ids_batch["items"]["items"]["maximum"] = (
            self.vocab_size - 1
        )
        return schemas

    async def _no_route(self, request: Request, error: HTTPException) -> JSONResponse:
        """An unknown path (404) or a wrong method (405), in OpenAI's shape rather than
        FastAPI's."""
        if error.status_code == 404:
            message = (
                f"{request.method} {request.url.path} is not a route of this server: it"
                " answers /v1/models, /v1/completions, /v1/chat/completions,"
                " /v1/responses, vLLM's"
                " /tokenize, /detokenize, /tokenizer_info, /version and /ping,"
                " the routers' worker routes (/get_server_info, /get_load, ...:"
                " docs/06_serving.md), /health, /metrics and / (the dashboard)"
            )
        elif error.status_code == 405:
            allowed = (error.headers or {}).get("allow", "another method")
            message = (
                f"{request.url.path} does not take {request.method}: use {allowed}"
            )
        else:
            message = str(error.detail)
        return JSONResponse(
            APIError(error.status_code, message).body(),
            error.status_code,
            headers=error.headers,
        )

    async def health(self) -> Response:
        if self.loop.error:
            raise APIError(503, self.loop.error)
        return Response(status_code=200)

    async def models(self, request: Request) -> dict:
        self._authorize(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": self.config.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "minipaged",
                    "root": self.config.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                }
            ],
        }

    async def completions(self, request: Request) -> Response:
        return await self._completions(
            request, await self._body(request, protocol.CompletionRequest)
        )

    async def _completions(self, request: Request, body) -> Response:
        prompts, most = body.prompts(), self.max_num_seqs + self.config.max_waiting
        # it could never be queued whole: not a 503 (clients retry those)
        if len(prompts) > most:
            raise APIError(
                400,
                f"{len(prompts)} prompts in one request, but this server holds at most"
                f" {most} requests at once ({self.max_num_seqs} running, --max-waiting"
                f" {self.config.max_waiting} waiting): send at most {most} prompts per"
                " request",
                "prompt",
            )
        if body.scoring:
            self._check_scoring(body)
        prompts = [self._prompt(p, "prompt", body) for p in prompts]
        return await self._generate(request, body, prompts, chat=False)

    @staticmethod
    def _check_scoring(body) -> None:
        """max_tokens=0 (vLLM's "echo without generation"): only with echo, whose answer
        is the prompt (and its logprobs), and with no min_tokens."""
        _, field = body.asked_max_tokens
        if not body.echo:
            raise APIError(
                400,
                f"{field}=0 generates nothing, so without echo the answer would be"
                " empty: send echo=true (with logprobs or prompt_logprobs) to score the"
                f" prompt, or a {field} of 1 or more to generate",
                field,
            )
        if body.min_tokens:
            raise APIError(
                400,
                f"min_tokens must be at most {field}=0, got {body.min_tokens}",
                "min_tokens",
            )

    async def chat_completions(self, request: Request) -> Response:
        return await self._chat_completions(
            request, await self._body(request, protocol.ChatCompletionRequest)
        )

    async def responses(self, request: Request) -> Response:
        """POST /v1/responses: read as a chat request (responses.py), run on chat's
        path, answered as a Response object or as the Responses event sequence; kept
        for GET and previous_response_id unless store is false."""
        raw = await self._read(request)
        self._check(responses.ResponsesRequest, raw)
        responses.refuse_what_vllm_leaves_out(raw)
        history: list[dict] = []
        if raw.get("previous_response_id") is not None:
            history = self.stored.get(
                raw["previous_response_id"], "previous_response_id"
            ).messages
        stream = raw.get("stream", False)
        chat = responses.chat_request(raw, history, stream is True)
        chat["stream"] = stream  # a stream that is not a boolean: chat's 400
        body = self._check(protocol.ChatCompletionRequest, chat)
        conversation = history + responses.messages_of(raw.get("input"))
        input_items = responses.input_items_of(raw["input"])
        response_id, model = responses.new_id("resp"), self.config.model_name
        keep = raw.get("store", True) is not False
        answer = await self._chat_completions(request, body)
        if stream is not True:
            data = json.loads(answer.body)
            choice = data["choices"][0]
            out = responses.response(
                raw,
                response_id,
                model,
                data["created"],
                responses.items_of(choice),
                data["usage"],
                choice["finish_reason"],
            )
            if keep:
                messages = conversation + responses.as_messages(out["output"])
                self.stored.put(response_id, responses.Kept(out, messages, input_items))
            return JSONResponse(out)
        events = responses.EventStream(raw, response_id, model)

        async def stream_events():
            for event in events.start():
                yield event
            async for piece in answer.body_iterator:
                for line in piece.split("\n"):
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        yield events.event("error", **chunk["error"])
                        continue
                    for event in events.chunk(chunk):
                        yield event
            for event in events.finish():
                yield event
            if keep:
                messages = conversation + responses.as_messages(events.items)
                self.stored.put(
                    response_id,
                    responses.Kept(events.snapshot(), messages, input_items),
                )

        return StreamingResponse(stream_events(), media_type="text/event-stream")

    async def get_response(self, request: Request, response_id: str) -> dict:
        """GET /v1/responses/{id}: a response kept with store."""
        self._authorize(request)
        return self.stored.get(response_id).response

    async def delete_response(self, request: Request, response_id: str) -> dict:
        """DELETE /v1/responses/{id} (OpenAI's): forget a kept response."""
        self._authorize(request)
        return self.stored.delete(response_id)

    async def input_items(self, request: Request, response_id: str) -> dict:
        """GET /v1/responses/{id}/input_items (OpenAI's): its request's input items,
        a page at a time."""
        self._authorize(request)
        kept = self.stored.get(response_id)
        return responses.listing(kept.input_items, request.query_params)

    async def cancel_response(self, request: Request, response_id: str) -> dict:
        """POST /v1/responses/{id}/cancel: only a background response can be cancelled
        (vLLM's answer), and minipaged runs none."""
        self._authorize(request)
        self.stored.get(response_id)
        raise APIError(
            400,
            "Cannot cancel a synchronous response: only a response created with"
            " background=true can be cancelled, and this server runs none (close the"
            " connection to stop a response being generated)",
            "response_id",
        )

    async def embeddings(self, request: Request) -> Response:
        """POST /v1/embeddings: a 404 that says why (minipaged serves generation only)
        and what serves embeddings instead."""
        raise APIError(
            404,
            "minipaged serves generation only (/v1/completions, /v1/chat/completions,"
            " /v1/responses):"
            " it has no /v1/embeddings. For embeddings, serve an"
            " embedding model with vLLM's pooling runner (`vllm serve MODEL --runner"
            " pooling`, which pools a decoder's hidden states, last-token or mean), or"
            " any other OpenAI-compatible embeddings server",
            "model",
        )

    async def invocations(self, request: Request) -> Response:
        """vLLM's POST /invocations (SageMaker's one route): a chat request (it has
        `messages`) or a completions request (it has `prompt`), answered as its own
        route answers it.
        """
        raw = await self._read(request)
        if isinstance(raw, dict) and "messages" in raw:
            return await self._chat_completions(
                request, self._check(protocol.ChatCompletionRequest, raw)
            )
        if isinstance(raw, dict) and "prompt" in raw:
            return await self._completions(
                request, self._check(protocol.CompletionRequest, raw)
            )
        raise APIError(
            400,
            "POST /invocations takes a chat request (with `messages`, as"
            " /v1/chat/completions) or a completions request (with `prompt`, as"
            " /v1/completions)",
        )

    async def _chat_completions(self, request: Request, body) -> Response:
        prompt = self._prompt(self._render(body), "messages", body)
        prompt["prompt"] = body.messages[-1].text()  # for --dashboard-show-text
        return await self._generate(request, body, [prompt], chat=True)

    def _render(self, body) -> list[int]:
        """A conversation's prompt ids, through the model's chat template (vLLM's
        options)."""
        try:
            return self.tokenizer.encode_chat(
                body.conversation(),
                body.add_generation_prompt,
                body.continue_final_message,
                body.add_special_tokens,
                body.tool_plan.template_tools(),
            )
        except tools.BadStructure as error:
            raise APIError(400, str(error), error.field) from None
        except (
            ValueError
        ) as error:  # no chat template, or a conversation the template refuses
            raise APIError(400, str(error), "messages") from None

    async def tokenize(self, request: Request) -> dict:
        """vLLM's POST /tokenize: a prompt, or messages through the chat template, as
        token ids."""
        raw = await self._read(request, key=False)
        chat = isinstance(raw, dict) and "messages" in raw
        body = self._check(
            protocol.TokenizeChatRequest if chat else protocol.TokenizeRequest, raw
        )
        ids = (
            self._render(body)
            if chat
            else self.tokenizer.encode(body.prompt, body.add_special_tokens)
        )
        return {
            "count": len(ids),
            "max_model_len": self.max_model_len,
            "tokens": ids,
            "token_strs": (
                self.tokenizer.token_strings(ids) if body.return_token_strs else None
            ),
        }

    async def detokenize(self, request: Request) -> dict:
        """vLLM's POST /detokenize: token ids back to text (special tokens written
        out)."""
        body = self._check(
            protocol.DetokenizeRequest, await self._read(request, key=False)
        )
        bad = [t for t in body.tokens if t >= self.vocab_size]
        if bad:
            raise APIError(
                400,
                f"token id {bad[0]} is out of vocabulary (this model's ids are "
                f"0..{self.vocab_size - 1})",
                "tokens",
            )
        return {"prompt": self.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    async def tokenizer_info(self) -> dict:
        """vLLM's GET /tokenizer_info: tokenizer_config.json as read, with its class and
        chat template."""
        config = self.tokenizer.config
        return config | {
            "tokenizer_class": str(
                config.get("tokenizer_class", "PreTrainedTokenizerFast")
            ),
            "chat_template": self.tokenizer.chat_template,
        }

    async def snapshot(self, request: Request) -> JSONResponse:
        return JSONResponse(self._dashboard_view(request) or {})

    async def snapshot_events(self, request: Request) -> StreamingResponse:
        """Server-sent events: each new snapshot, checked every snapshot_interval
        seconds."""

        async def events():
            version = -1
            while not await request.is_disconnected():
                if (
                    self.dashboard.version != version
                    and self.dashboard.latest is not None
                ):
                    version, latest = (
                        self.dashboard.version,
                        self._dashboard_view(request),
                    )
                    yield f"data: {json.dumps(latest, separators=(',', ':'))}\n\n"
                await asyncio.sleep(self.config.snapshot_interval)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _dashboard_view(self, request: Request) -> dict | None:
        """The latest snapshot; with --api-key, prompts and answers only for the key
        (the page itself stays open for the projector: /?key=KEY passes the key on to
        its events).
        """
        return (
            self.dashboard.latest
            if self._has_key(request, in_query=True)
            else self.dashboard.public
        )

    # ---- a request, checked ----------------------------------------------------------
    def _has_key(self, request: Request, in_query: bool = False) -> bool:
        """No --api-key, or the request has it: 'Authorization: Bearer <key>' (or
        ?key=<key>
        where in_query, for a browser's EventSource, which cannot send headers)."""
        key = self.config.api_key
        if key is None:
            return True
        given = request.headers.get("authorization", "")
        if in_query and not given:
            given = f"Bearer {request.query_params.get('key', '')}"
        return secrets.compare_digest(given.encode(), f"Bearer {key}".encode())

    def _client(self, request: Request, body=None) -> str:
        """Who sent a request, for --max-concurrent-per-client and the fair order: its
        address and the key it sent. A room shares one --api-key, so the address tells
        laptops apart; programs on one machine (the benchmark's clients, users behind
        one proxy) tell themselves apart by their keys. From a proxy of
        --forwarded-allow-ips, the address is its X-Forwarded-For client and the body's
        `user` counts too (clients.TrustedProxies).
        """
        address, user = self.proxies.client(
            request.client.host if request.client else "unknown",
            request.headers.get("x-forwarded-for", ""),
            getattr(body, "user", None),
        )
        key = request.headers.get("authorization", "")
        if user:
            return f"{address} {key} user={user}"
        return f"{address} {key}"

    def _authorize(self, request: Request) -> None:
        if not self._has_key(request):
            raise APIError(
                401,
                "Incorrect or missing API key: send the header "
                "'Authorization: Bearer <key>' with the key the server was started"
                " with",
            )

    async def _body(self, request: Request, model):
        """The body as a checked request: the key, media type, size, JSON, fields, model
        name."""
        return self._check(model, await self._read(request))

    async def _read(self, request: Request, key: bool = True):
        """The body's JSON, read within bounds, after the API key (key: the route wants
        it) and the media type (vLLM's 415 for anything but JSON)."""
        if key:
            self._authorize(request)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise APIError(
                415,
                "Unsupported Media Type: Only 'application/json' is allowed (send the"
                " header 'Content-Type: application/json'; this request's is"
                f" {media or 'missing'!r})",
            )
        limit, length = (
            self.config.max_body_bytes,
            request.headers.get("content-length", ""),
        )
        too_large = APIError(
            413, f"the request body is larger than this server's limit of {limit} bytes"
        )
        if length.isdigit() and int(length) > limit:
            raise too_large
        raw = bytearray()
        try:
            # a body without Content-Length is counted as it comes
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > limit:
                    raise too_large
        except ClientDisconnect:  # it hung up halfway through its body
            raise ClientGone from None
        return protocol.decode(raw)

    def _check(self, model, raw):
        """A decoded body as a checked request of `model`: its fields, its model name,
        its n."""
        body = protocol.parse(model, raw)
        if body.model is not None and body.model != self.config.model_name:
            raise APIError(
                404,
                f"The model `{body.model}` does not exist. This server serves "
                f"`{self.config.model_name}` (GET /v1/models lists it).",
                "model",
            )
        if getattr(body, "n", 1) > self.max_num_seqs:
            raise APIError(
                400,
                f"n={body.n} is more than this server's --max-num-seqs"
                f" {self.max_num_seqs} (the most sequences in one batch)",
                "n",
            )
        self._log_ignored(body)
        return body

    def _log_ignored(self, body) -> None:
        """Unknown fields are ignored, as vLLM ignores them; each name is logged once,
        at debug level, so that a room's clients do not fill the projector's log."""
        new = [name for name in protocol.ignored(body) if name not in self.logged]
        # a client inventing names does not grow it for ever
        if new and len(self.logged) < 1000:
            self.logged.update(new)
            LOG.debug(
                "ignored request fields (unknown to minipaged, as to vLLM): %s",
                ", ".join(new),
            )

    def _prompt(self, prompt, field: str, body) -> dict:
        """{"prompt_token_ids", "prompt"} for the engine: a text prompt tokenized (with
        the BOS unless add_special_tokens is false), the last truncate_prompt_tokens
        kept (vLLM's; the first with truncation_side "right"), then
        the context-length check."""
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt, body.add_special_tokens), prompt
        else:
            ids, text = prompt, None
        keep = (
            self.max_model_len
            if body.truncate_prompt_tokens == -1
            else body.truncate_prompt_tokens
        )
        if keep is not None and keep > self.max_model_len:
            raise APIError(
                400,
                f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
                f"({self.max_model_len}). Please, select a smaller truncation size.",
                "truncate_prompt_tokens",
            )
        # vLLM's truncation_side: left cuts the start, right the end
        if keep is not None and keep < len(ids):
            ids, text = (
                (
                    ids[:keep]
                    if body.truncation_side == "right"
                    else ids[len(ids) - keep :]
                ),
                None,
            )
        if len(ids) >= self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, your {field} has {len(ids)} tokens (and one token must be "
                f"generated). Please shorten your {field}.",
                field,
            )
        return {"prompt_token_ids": ids, "prompt": text}

    def _params(self, body, prompts: list[dict], chat: bool):
        longest = max(len(p["prompt_token_ids"]) for p in prompts)
        max_tokens, field = body.asked_max_tokens
        limit = self.config.max_tokens_limit
        # scoring (max_tokens=0 with echo): the engine samples one token, which nobody
        # sees (Run.scoring drops it), as vLLM's echo without generation does
        if max_tokens == 0:
            max_tokens = 1
        # the default, no more than the context left and the pool holds for n
        if max_tokens is None:
            default = self.config.default_max_tokens if chat else COMPLETIONS_MAX_TOKENS
            max_tokens = max(
                1,
                min(
                    default,
                    limit or default,
                    self.max_model_len - longest,
                    self._pool_room(longest, body.n),
                ),
            )
        elif limit is not None and max_tokens > limit:
            raise APIError(
                400,
                f"{field}={max_tokens} is more than this server's limit of {limit}"
                " tokens (--max-tokens-limit); ask for fewer",
                field,
            )
        try:
            params = body.sampling_params(max_tokens)
        except ValueError as error:
            # tools.BadStructure names its field
            field = getattr(error, "field", None) or str(error).split()[0]
            raise APIError(
                400,
                str(error),
                field if field in SAMPLING_FIELDS or hasattr(error, "field") else None,
            ) from None
        for field, what, ids in (
            ("stop_token_ids", "entry", params.stop_token_ids),
            ("logit_bias", "key", params.logit_bias),
        ):
            # as vLLM says it: the id and the size
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise APIError(
                    400,
                    f"{field} {what} {bad[0]} is out of vocabulary (this model's"
                    f" vocabulary size is {self.vocab_size}: ids"
                    f" 0..{self.vocab_size - 1})",
                    field,
                )
        if longest + params.max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens."
                f" However, you requested {longest + params.max_tokens} tokens"
                f" ({longest} in the prompt, {params.max_tokens} in the completion)."
                " Please reduce the length of the prompt or of the completion"
                " (max_tokens).",
                "max_tokens",
            )
        return params

    async def _compile(self, spec, body, done, prompts: list):
        """Compile a request's structured output on a worker thread (the event loop and
        the engine's thread go on), held in the backend's cache until the engine has
        taken it; return the function that lets go of it. A pattern the backend refuses
        (bad, unwritable, past its budget) is a 400 naming the field, and the client's
        slots are given back."""
        if spec is None:
            return lambda: None
        try:
            async with self.compiling:
                # quick: its vocabulary waits for a compile
                backend = self.constrainer()
                hold = getattr(backend, "hold", None)
                if hold is None:  # another backend: compiled and cached its own way
                    await asyncio.to_thread(backend.compile, spec)
                    return lambda: None
                return await finish_even_if_cancelled(
                    asyncio.to_thread(hold, spec, self._busy)
                )
        except BaseException as error:  # refused, or the handler cancelled
            for _ in prompts if done is not None else ():
                done()
            if isinstance(error, ValueError):
                raise APIError(400, str(error), tools.field_of(body)) from None
            raise

    def _busy(self) -> bool:
        """Does the engine run requests now (read from any thread)?"""
        return self.loop.num_unfinished > 0

    def _pool_room(self, prompt_len: int, n: int) -> int:
        """The most tokens each of n sequences may add to a prompt with the whole KV
        pool to itself, in the worst case (each with its own frames):
        LLMEngine._check_fits in reverse.
        """
        return (self.num_frames // n) * self.block_size - prompt_len

    # ---- a request, run --------------------------------------------------------------
    async def _generate(
        self, request: Request, body, prompts: list[dict], chat: bool
    ) -> Response:
        params = self._params(body, prompts, chat)
        if self.loop.error:
            raise APIError(503, self.loop.error)
        if (
            self.loop.num_unfinished + len(prompts)
            > self.max_num_seqs + self.config.max_waiting
        ):
            raise APIError(
                503,
                f"the server is full ({self.loop.num_unfinished} requests unfinished,"
                f" at most {self.max_num_seqs} running (--max-num-seqs) and"
                f" {self.config.max_waiting} waiting (--max-waiting)): retry in a"
                " moment",
            )
        if body.priority and not self.uses_priority:
            raise APIError(
                400,
                f"priority={body.priority} needs a server started with"
                " --scheduling-policy priority (this one orders its queue by"
                f" {self.order_name!r})",
                "priority",
            )
        client = self._client(request, body)
        done = self.slots.take(client, len(prompts), params.n)  # or a 400/429
        # admitted: now compile its structure, off the event loop
        release = await self._compile(params.structured_outputs, body, done, prompts)
        response_id = (
            f"{'chatcmpl' if chat else 'cmpl'}-{next(self.ids)}-{secrets.token_hex(3)}"
        )
        run = Run(
            self.loop,
            request,
            [f"{response_id}-{i}" for i in range(len(prompts))],
            prompts,
            params,
            done,
            body.priority,
            client,
            scoring=getattr(body, "scoring", False),
        )
        try:
            await run.start()  # raises APIError if the engine refused a prompt
        finally:
            release()  # the engine has its automaton (or refused the request)
        kind = "chat.completion" if chat else "text_completion"
        prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
        if body.stream:
            chunks = run.chunks(
                response_id,
                f"{kind}.chunk" if chat else kind,
                self.config.model_name,
                body,
                body.role if chat else None,
                self._chat_echo(body) if chat else "",
                self.tokenizer,
                self.config.force_include_usage,
            )
            return StreamingResponse(chunks, media_type="text/event-stream")
        outputs = await run.outputs()
        choice = (
            partial(protocol.chat_choice, role=body.role)
            if chat
            else protocol.completion_choice
        )
        echo = self._chat_echo(body) if chat else ""
        choices = [
            tool_calls(
                body,
                choice(
                    i * params.n + c.index,
                    echo + c.text,
                    c.finish_reason,
                    c.stop_reason,
                ),
            )
            | self._token_ids(body, output.prompt_token_ids, c.token_ids, chat)
            | (
                logprobs.chat_fields(body, c, self.tokenizer)
                if chat
                else logprobs.completion_fields(body, output, c, self.tokenizer)
            )
            for i, output in enumerate(outputs)
            for c in output.outputs
        ]
        completion_tokens = sum(
            len(c.token_ids) for output in outputs for c in output.outputs
        )
        # chat's (vLLM's) are the answer's, not a choice's
        asked = chat and body.prompt_logprobs is not None
        prompt = (
            {"prompt_logprobs": logprobs.prompt_logprobs(outputs[0].prompt_logprobs)}
            if asked
            else {"prompt_logprobs": None}
            if chat
            else {}
        )  # vLLM's chat answer has the field, null when not asked
        # vLLM's: the chat's prompt ids beside its choices
        if chat and body.return_token_ids:
            prompt["prompt_token_ids"] = outputs[0].prompt_token_ids
        return JSONResponse(
            protocol.envelope(response_id, kind, self.config.model_name, choices)
            | prompt
            | {"usage": protocol.usage(prompt_tokens, completion_tokens)}
        )

    @staticmethod
    def _token_ids(body, prompt_ids: list[int], ids: list[int], chat: bool) -> dict:
        """vLLM's return_token_ids: a choice's token ids (and a completion's prompt ids
        in it)."""
        if not body.return_token_ids:
            return {}
        return {"token_ids": list(ids)} | (
            {} if chat else {"prompt_token_ids": list(prompt_ids)}
        )

    @staticmethod
    def _chat_echo(body) -> str:
        """vLLM's chat echo: the answer starts with the last message's content when that
        message
        has the answer's role (continue_final_message: the answer continues it)."""
        return (
            body.messages[-1].text()
            if body.echo and body.messages[-1].role == body.role
            else ""
        )


async def finish_even_if_cancelled(work):
    """Await `work` (a hold on a compiled automaton, whose result is the function that
    lets go of it); if the handler is cancelled meanwhile (its client left), the work
    still finishes on its thread, and its hold is let go then."""
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(
            lambda f: None if f.cancelled() or f.exception() else f.result()()
        )
        raise


def tool_calls(body, choice: dict) -> dict:
    """A chat choice whose text is a tool call (tools and tool_choice) answered as
    `tool_calls`."""
    plan = getattr(body, "tool_plan", None)
    if plan is None or plan.mode == "none":
        return choice
    fields, choice["finish_reason"] = plan.answer(
        choice["message"]["content"], choice["finish_reason"]
    )
    choice["message"] = {"role": choice["message"]["role"]} | fields
    return choice


class ClientSlots:
    """An opt-in share of the batch (--max-concurrent-per-client): each client (an
    address and key, Server._client) may have at most `limit` sequences unfinished
    (each prompt's n samples), as each takes a row of every step. A request beyond it is
    a 429 at once, with a Retry-After estimated from that client's requests in flight
    (how long requests have lately held their slots, less how long its oldest has
    held its own); the count is taken at the door and given back as the engine lets go
    of each request. Off (0) by default: requests queue, and the fair order keeps each
    client's share.
    """

    FIRST_GUESS = 5.0  # seconds a request holds its slots, before any has finished
    MOST_WAIT = 60  # the openai client honours a Retry-After of at most 60 s

    def __init__(self, limit: int):
        self.limit = limit  # 0: no bound
        # client -> sequences unfinished; the event loop's only
        self.held: Counter[str] = Counter()
        # client -> when each of its unfinished prompts took its slots
        self.since: dict[str, list[float]] = {}
        self.typical: float | None = None  # a moving mean of how long slots are held

    def take(self, client: str, prompts: int, n: int):
        """Count prompts × n sequences for client; return the callback that gives one
        prompt's n back (None with no bound), or raise the APIError that says why
        not."""
        if not self.limit:
            return None
        wanted = prompts * n
        if wanted > self.limit:  # never fits: a 400 (a client retries a 429)
            raise APIError(
                400,
                f"this request asks for {wanted} sequences ({prompts} prompts, n={n}),"
                f" but this server was started with --max-concurrent-per-client"
                f" {self.limit}: each client may have at most {self.limit} unfinished"
                " at once. Send fewer prompts or a smaller n, or start the server"
                " without the option (0, the default: requests queue)",
                "n" if n > 1 else "prompt",
            )
        if self.held[client] + wanted > self.limit:
            wait = self.retry_after(client)
            raise APIError(
                429,
                f"this client already has {self.held[client]} sequences unfinished, and"
                f" this server was started with --max-concurrent-per-client"
                f" {self.limit} (each client at most {self.limit} at once): retry in"
                f" about {wait} s, when one of them should have finished",
                headers={"Retry-After": str(wait)},
            )
        self.held[client] += wanted
        now = time.monotonic()
        self.since.setdefault(client, []).extend([now] * prompts)
        return lambda: self._give_back(client, n, now)

    def retry_after(self, client: str) -> int:
        """Whole seconds until the client's oldest request should let go of its slots:
        the typical hold less its age, at least 1 and at most 60."""
        typical = self.typical if self.typical is not None else self.FIRST_GUESS
        age = time.monotonic() - min(self.since.get(client) or [time.monotonic()])
        return int(min(self.MOST_WAIT, max(1.0, math.ceil(typical - age))))

    def _give_back(self, client: str, n: int, started: float) -> None:
        held = time.monotonic() - started
        self.typical = held if self.typical is None else 0.8 * self.typical + 0.2 * held
        since = self.since.get(client, [])
        if started in since:
            since.remove(started)
        if not since:
            self.since.pop(client, None)
        self.held[client] -= n
        if self.held[client] <= 0:
            del self.held[client]


def unscored(update: Update) -> Update:
    """A scoring request's update (max_tokens=0): its prompt's logprobs kept, the one
    token the engine sampled dropped, each sequence ended by its length of 0."""

    def empty(c):
        return dataclasses.replace(
            c,
            text="",
            token_ids=[],
            logprobs=None if c.logprobs is None else [],
            cumulative_logprob=None if c.cumulative_logprob is None else 0.0,
            finish_reason="length",
            stop_reason=None,
        )

    output = update.output
    return dataclasses.replace(
        update,
        text={},
        token_ids={},
        logprobs={},
        finished={i: empty(c) for i, c in update.finished.items()},
        output=(
            None
            if output is None
            else dataclasses.replace(output, outputs=[empty(c) for c in output.outputs])
        ),
    )


class Run:
    """The engine requests of one HTTP request (one per prompt) and their shared update
    queue. Whatever ends it early (a disconnect, a cancelled handler) aborts what is
    unfinished.
    """

    def __init__(
        self,
        loop: EngineLoop,
        request: Request,
        request_ids: list[str],
        prompts: list,
        params,
        done=None,
        priority: int = 0,
        client: str = "",
        scoring: bool = False,
    ):
        self.loop, self.request, self.params, self.done = (
            loop,
            request,
            params,
            done,
        )  # done: per engine request
        # the client: a fair waiting order shares by it
        self.priority, self.client = (
            priority,
            client,
        )
        self.ids, self.prompts = request_ids, prompts
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        self.unfinished = set(request_ids)
        # text that came while waiting for every acceptance
        self.early: list[Update] = []
        self.watcher: asyncio.Task | None = None
        self.gone = False  # the client hung up
        # max_tokens=0: the one token the engine samples is dropped from every update
        self.scoring = scoring

    async def start(self) -> None:
        """Hand the prompts to the loop; return once each is accepted, or raise the
        first refusal
        (the others are aborted: nothing of a refused request stays in the engine)."""
        self.watcher = asyncio.create_task(self._watch_disconnect())
        for request_id, prompt in zip(self.ids, self.prompts):
            self.loop.add_request(
                request_id,
                prompt,
                self.params,
                self.updates,
                self.done,
                self.priority,
                self.client,
            )
        waiting = set(self.ids)
        while waiting:
            update = await self.updates.get()
            if update.error is not None:
                self.unfinished.discard(update.request_id)
                self.close()
                raise APIError(400, update.error)
            if update.text or update.output:
                self.early.append(update)
            if update.output:
                self.unfinished.discard(update.request_id)
            waiting.discard(update.request_id)

    async def updates_until_done(self):
        try:
            for update in self.early:
                yield unscored(update) if self.scoring else update
            while self.unfinished:
                update = await self.updates.get()
                if update.output is not None or update.error is not None:
                    self.unfinished.discard(update.request_id)
                yield unscored(update) if self.scoring else update
        finally:
            self.close()

    async def outputs(self) -> list:
        outputs = {}
        async for update in self.updates_until_done():
            if update.error is not None:
                raise APIError(503, update.error)
            if update.output is not None:
                outputs[update.request_id] = update.output
        # its requests were aborted: some outputs are missing, and nobody reads them
        if self.gone:
            raise ClientGone
        return [outputs[request_id] for request_id in self.ids]

    async def chunks(
        self,
        response_id: str,
        kind: str,
        model: str,
        body,
        role: str | None,
        echo: str = "",
        tokenizer=None,
        force_usage: bool = False,
    ):
        """Server-sent events, in vLLM's shapes: one choice per chunk. A chat first
        gives each choice its role (and, with echo, the echoed text); then each piece of
        new text; each choice's last chunk carries its finish_reason and stop_reason as
        soon as that choice finishes (n > 1: one may end before the others), beside its
        last text; the usage when asked (stream_options.include_usage; with
        continuous_usage_stats, the usage so far in every chunk; force_usage: both,
        whatever was asked), then [DONE]. return_token_ids adds each chunk's new token
        ids, logprobs their logprobs; a completion's echo is its first chunk.
        """
        created, n, chat, with_ids = (
            int(time.time()),
            self.params.n,
            role is not None,
            bool(body.return_token_ids),
        )
        # top: None without logprobs
        top, as_ids = (
            body.num_logprobs,
            bool(body.return_tokens_as_token_ids),
        )
        # per completions choice: where its next token's text starts (text_offset)
        offsets = Counter()
        # force: vLLM's --enable-force-include-usage, whatever was asked
        usage = body.include_usage or force_usage
        continuous = force_usage or (
            usage and body.stream_options.continuous_usage_stats
        )
        prompt_of = {request_id: i for i, request_id in enumerate(self.ids)}
        prompt_lens = [len(p["prompt_token_ids"]) for p in self.prompts]
        tokens, done, started = (
            Counter(),
            set(),
            set(),
        )  # per choice: its tokens so far; finished; given ids
        # content, or tool calls
        shape = tools.StreamShape(body.tool_plan) if chat else None
        completion_tokens = 0

        def event(index: int | None, choice: dict, ids=None) -> str:
            """One chunk: `choice` of choice `index` (None: the usage at the end, no
            choice)."""
            extra = {}
            if index is None:
                extra["usage"] = protocol.usage(sum(prompt_lens), completion_tokens)
            else:
                prompt = self.prompts[index // n]["prompt_token_ids"]
                if with_ids:
                    choice = choice | {"token_ids": list(ids or ())}
                    if index not in started and not chat:
                        choice["prompt_token_ids"] = prompt
                    elif index not in started and index == 0:
                        extra["prompt_token_ids"] = prompt
                    started.add(index)
                if continuous:
                    extra["usage"] = protocol.usage(len(prompt), tokens[index])
            chunk = (
                protocol.envelope(
                    response_id, kind, model, [] if index is None else [choice], created
                )
                | extra
            )
            return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

        def text(index: int, piece: str, ids, steps=None, completion=None) -> str:
            """New text of choice `index`; with `completion`, also its end (vLLM's last
            chunk carries the last token's text beside the finish_reason)."""
            reason, stop = (
                (completion.finish_reason, completion.stop_reason)
                if completion
                else (None, None)
            )
            if completion is not None:
                done.add(index)
            delta = shape.delta(index, piece, completion is not None) if chat else None
            if chat and delta is None:
                # held until the choice ends ("auto", "required": calls or text)
                return ""
            choice = (
                protocol.chat_delta(
                    index, delta, shape.finish_reason(index, reason), stop
                )
                if chat
                else protocol.completion_choice(index, piece, reason, stop)
            )
            # the logprobs of this chunk's tokens
            if top is not None and steps is not None:
                if chat:
                    choice["logprobs"] = logprobs.chat_logprobs(
                        ids, steps, top, tokenizer, as_ids
                    )
                else:
                    choice["logprobs"] = logprobs.completion_logprobs(
                        ids, steps, top, tokenizer, as_ids, offset=offsets[index]
                    )
                    offsets[index] += sum(
                        len(name) for name in choice["logprobs"]["tokens"]
                    )
            return event(index, choice, ids)

        def finish(index: int, completion) -> str:
            done.add(index)
            reason, stop = completion.finish_reason, completion.stop_reason
            return event(
                index,
                (
                    protocol.chat_delta(
                        index,
                        shape.delta(index, "", True),
                        shape.finish_reason(index, reason),
                        stop,
                    )
                    if chat
                    else protocol.completion_choice(index, "", reason, stop)
                ),
            )

        if chat:  # vLLM's first chunks: each choice's role, then what echo repeats
            for index in range(len(self.ids) * n):
                yield event(
                    index,
                    protocol.chat_delta(index, {"role": role, "content": ""}, None),
                )
            for index in range(len(self.ids) * n) if echo else ():
                yield text(index, echo, ())
        # a completion's text starts with its prompt: vLLM's first chunk of each choice
        elif body.echo:
            for index in range(len(self.ids) * n):
                prompt = self.prompts[index // n]
                yield text(
                    index,
                    (
                        prompt["prompt"]
                        if prompt["prompt"] is not None
                        else tokenizer.decode(
                            prompt["prompt_token_ids"], skip_special_tokens=False
                        )
                    ),
                    (),
                )
        async for update in self.updates_until_done():
            if update.error is not None:
                yield f"data: {json.dumps(APIError(503, update.error).body())}\n\n"
                break
            base = prompt_of[update.request_id] * n
            tokens.update({base + i: len(ids) for i, ids in update.token_ids.items()})
            ending = dict(update.finished)  # choices that end in this update, by index
            for completion in (
                update.output.outputs if update.output is not None else ()
            ):
                completion_tokens += len(completion.token_ids)
                if base + completion.index not in done:
                    ending.setdefault(completion.index, completion)
            for i in sorted(
                update.text.keys()
                | (update.token_ids.keys() if with_ids or top is not None else set())
            ):
                yield text(
                    base + i,
                    update.text.get(i, ""),
                    update.token_ids.get(i, ()),
                    update.logprobs.get(i),
                    ending.pop(i, None),
                )
            # ended with no new text (an end-of-sequence token)
            for i, completion in sorted(ending.items()):
                yield finish(base + i, completion)
        if usage:
            yield event(None, {})
        yield "data: [DONE]\n\n"

    async def _watch_disconnect(self) -> None:
        """The request's body is read: the next ASGI message is the client going
        away."""
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.close()

    def close(self) -> None:
        for request_id in self.unfinished:
            self.loop.abort(request_id)
        self.unfinished.clear()
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
