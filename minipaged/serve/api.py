"""The HTTP layer: OpenAI-shaped routes (FastAPI), /metrics, and the dashboard.

The first stop of a request that comes over the network: read (bounded), checked (protocol.py)
and tokenized here, then handed to the engine loop; its updates leave as JSON or as SSE.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from minipaged.serve import protocol
from minipaged.serve.dashboard import Dashboard, page
from minipaged.serve.loop import EngineLoop, Update
from minipaged.serve.metrics import Metrics
from minipaged.serve.protocol import APIError

SAMPLING_FIELDS = {"n", "temperature", "top_k", "top_p", "max_tokens", "stop", "stop_token_ids",
                   "ignore_eos", "seed"}


@dataclass
class ServerConfig:
    model_name: str                 # the name clients put in "model" (vLLM's --served-model-name)
    api_key: str | None = None      # when set, every /v1 route wants "Authorization: Bearer <key>"
    max_waiting: int = 256          # unfinished requests beyond max_num_seqs that may queue; more get 503
    dashboard_show_text: bool = False
    max_body_bytes: int = 1 << 20   # a larger body gets 413
    snapshot_interval: float = 0.1  # seconds between dashboard snapshots (about 10 a second)


class Server:
    """One engine, its loop thread and its watchers, behind one FastAPI app (`.app`). Nothing
    here touches the engine: the loop owns it. In Python: `Server(engine, tokenizer,
    ServerConfig(model_name=...))`, and `with ServerThread(server) as url:` (cli.py) serves it
    from a thread of your process."""

    def __init__(self, engine, tokenizer, config: ServerConfig):
        self.config, self.tokenizer = config, tokenizer
        self.max_model_len, self.max_num_seqs = engine.max_model_len, engine.config.max_num_seqs
        self.metrics = Metrics(config.model_name)
        self.dashboard = Dashboard(config.model_name, config.snapshot_interval, config.dashboard_show_text)
        self.loop = EngineLoop(engine, [self.metrics, self.dashboard])
        self.ids = itertools.count()
        self.created = int(time.time())
        self.app = self._routes(FastAPI(title="minipaged", lifespan=self._lifespan))

    @asynccontextmanager
    async def _lifespan(self, app):
        self.loop.start()
        yield
        self.loop.stop()

    # ---- routes ----------------------------------------------------------------------------
    def _routes(self, app: FastAPI) -> FastAPI:
        app.exception_handler(APIError)(lambda request, error: JSONResponse(error.body(), error.status))
        app.get("/health")(self.health)
        app.get("/metrics")(lambda: Response(self.metrics.render(), media_type="text/plain; version=0.0.4"))
        app.get("/v1/models")(self.models)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/chat/completions")(self.chat_completions)
        app.get("/")(lambda: HTMLResponse(page()))
        app.get("/dashboard/snapshot")(self.snapshot)
        app.get("/dashboard/events")(self.snapshot_events)
        return app

    async def health(self) -> Response:
        if self.loop.error:
            raise APIError(503, self.loop.error)
        return Response(status_code=200)

    async def models(self, request: Request) -> dict:
        self._authorize(request)
        return {"object": "list", "data": [{
            "id": self.config.model_name, "object": "model", "created": self.created,
            "owned_by": "minipaged", "root": self.config.model_name, "parent": None,
            "max_model_len": self.max_model_len}]}

    async def completions(self, request: Request) -> Response:
        body = await self._body(request, protocol.CompletionRequest)
        prompts = [self._prompt(p, "prompt") for p in body.prompts()]
        return await self._generate(request, body, prompts, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        body = await self._body(request, protocol.ChatCompletionRequest)
        conversation = body.conversation()
        try:
            ids = self.tokenizer.encode_chat(conversation, body.add_generation_prompt)
        except ValueError as error:  # no chat template, or a message the template refuses
            raise APIError(400, str(error), "messages") from None
        prompt = self._prompt(ids, "messages") | {"prompt": conversation[-1]["content"]}  # for --dashboard-show-text
        return await self._generate(request, body, [prompt], chat=True)

    async def snapshot(self) -> JSONResponse:
        return JSONResponse(self.dashboard.latest or {})

    async def snapshot_events(self, request: Request) -> StreamingResponse:
        """Server-sent events: each new snapshot, checked every snapshot_interval seconds."""
        async def events():
            version = -1
            while not await request.is_disconnected():
                if self.dashboard.version != version and self.dashboard.latest is not None:
                    version, latest = self.dashboard.version, self.dashboard.latest
                    yield f"data: {json.dumps(latest, separators=(',', ':'))}\n\n"
                await asyncio.sleep(self.config.snapshot_interval)
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    # ---- a request, checked -------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise APIError(401, "Incorrect or missing API key: send the header "
                           "'Authorization: Bearer <key>' with the key the server was started with")

    async def _body(self, request: Request, model):
        """The body as a checked request: size, JSON, fields, model name."""
        self._authorize(request)
        limit, length = self.config.max_body_bytes, request.headers.get("content-length", "")
        too_large = APIError(413, f"the request body is larger than this server's limit of {limit} bytes")
        if length.isdigit() and int(length) > limit:
            raise too_large
        raw = bytearray()
        async for chunk in request.stream():  # a body without Content-Length is counted as it comes
            raw += chunk
            if len(raw) > limit:
                raise too_large
        try:
            parsed = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise APIError(400, f"the request body is not valid JSON: {error}") from None
        body = protocol.parse(model, parsed)
        if body.model is not None and body.model != self.config.model_name:
            raise APIError(404, f"The model `{body.model}` does not exist. This server serves "
                           f"`{self.config.model_name}` (GET /v1/models lists it).", "model")
        if body.n > self.max_num_seqs:
            raise APIError(400, f"n={body.n} is more than this server's max_num_seqs={self.max_num_seqs}", "n")
        return body

    def _prompt(self, prompt, field: str) -> dict:
        """{"prompt_token_ids", "prompt"} for the engine, after the context-length check."""
        ids, text = (self.tokenizer.encode(prompt), prompt) if isinstance(prompt, str) else (prompt, None)
        if len(ids) >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                           f"However, your {field} has {len(ids)} tokens (and one token must be "
                           f"generated). Please shorten your {field}.", field)
        return {"prompt_token_ids": ids, "prompt": text}

    def _params(self, body, prompts: list[dict], chat: bool):
        longest = max(len(p["prompt_token_ids"]) for p in prompts)
        room = self.max_model_len - longest
        try:  # vLLM's defaults: 16 tokens for completions, the rest of the context for chat
            params = body.sampling_params(default_max_tokens=min(16, room) if not chat else room)
        except ValueError as error:
            field = str(error).split()[0]
            raise APIError(400, str(error), field if field in SAMPLING_FIELDS else None) from None
        if longest + params.max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                           f"However, you requested {longest + params.max_tokens} tokens ({longest} in "
                           f"the prompt, {params.max_tokens} in the completion). Please reduce the "
                           "length of the prompt or of the completion (max_tokens).", "max_tokens")
        return params

    # ---- a request, run ------------------------------------------------------------------------
    async def _generate(self, request: Request, body, prompts: list[dict], chat: bool) -> Response:
        params = self._params(body, prompts, chat)
        if self.loop.error:
            raise APIError(503, self.loop.error)
        if self.loop.num_unfinished + len(prompts) > self.max_num_seqs + self.config.max_waiting:
            raise APIError(503, f"the server is full ({self.loop.num_unfinished} requests unfinished); "
                           "retry in a moment")
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(self.ids)}-{secrets.token_hex(3)}"
        run = Run(self.loop, request, [f"{response_id}-{i}" for i in range(len(prompts))], prompts, params)
        await run.start()  # raises APIError if the engine refused a prompt
        kind = "chat.completion" if chat else "text_completion"
        prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
        if body.stream:
            chunks = run.chunks(response_id, f"{kind}.chunk" if chat else kind, self.config.model_name,
                                chat, prompt_tokens if body.include_usage else None)
            return StreamingResponse(chunks, media_type="text/event-stream")
        outputs = await run.outputs()
        choice = protocol.chat_choice if chat else protocol.completion_choice
        choices = [choice(i * params.n + c.index, c.text, c.finish_reason)
                   for i, output in enumerate(outputs) for c in output.outputs]
        completion_tokens = sum(len(c.token_ids) for output in outputs for c in output.outputs)
        return JSONResponse(protocol.envelope(response_id, kind, self.config.model_name, choices)
                            | {"usage": protocol.usage(prompt_tokens, completion_tokens)})


class Run:
    """The engine requests of one HTTP request (one per prompt) and their shared update queue.
    Whatever ends it early (a disconnect, a cancelled handler) aborts what is unfinished."""

    def __init__(self, loop: EngineLoop, request: Request, request_ids: list[str], prompts: list, params):
        self.loop, self.request, self.params = loop, request, params
        self.ids, self.prompts = request_ids, prompts
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        self.unfinished = set(request_ids)
        self.early: list[Update] = []  # text that came while waiting for every acceptance
        self.watcher: asyncio.Task | None = None

    async def start(self) -> None:
        """Hand the prompts to the loop; return once each is accepted, or raise the first refusal
        (the others are aborted: nothing of a refused request stays in the engine)."""
        self.watcher = asyncio.create_task(self._watch_disconnect())
        for request_id, prompt in zip(self.ids, self.prompts):
            self.loop.add_request(request_id, prompt, self.params, self.updates)
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
                yield update
            while self.unfinished:
                update = await self.updates.get()
                if update.output is not None or update.error is not None:
                    self.unfinished.discard(update.request_id)
                yield update
        finally:
            self.close()

    async def outputs(self) -> list:
        outputs = {}
        async for update in self.updates_until_done():
            if update.error is not None:
                raise APIError(503, update.error)
            if update.output is not None:
                outputs[update.request_id] = update.output
        return [outputs[request_id] for request_id in self.ids]

    async def chunks(self, response_id: str, kind: str, model: str, chat: bool, prompt_tokens: int | None):
        """Server-sent events: a chunk per piece of new text, a last chunk per choice with its
        finish_reason, the usage when asked (stream_options.include_usage), then [DONE]."""
        created, n = int(time.time()), self.params.n
        prompt_of = {request_id: i for i, request_id in enumerate(self.ids)}
        started, completion_tokens = set(), 0

        def event(choices: list, **extra) -> str:
            body = protocol.envelope(response_id, kind, model, choices, created) | extra
            return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

        def choice(index: int, text: str, finish_reason: str | None) -> dict:
            if not chat:
                return protocol.completion_choice(index, text, finish_reason)
            delta = {"content": text} if text or finish_reason is None else {}
            if index not in started:
                started.add(index)
                delta = {"role": "assistant", "content": text}
            return protocol.chat_delta(index, delta, finish_reason)

        async for update in self.updates_until_done():
            if update.error is not None:
                yield f"data: {json.dumps(APIError(503, update.error).body())}\n\n"
                break
            base = prompt_of[update.request_id] * n
            if update.text:
                yield event([choice(base + i, text, None) for i, text in sorted(update.text.items())])
            if update.output is not None:
                yield event([choice(base + c.index, "", c.finish_reason) for c in update.output.outputs])
                completion_tokens += sum(len(c.token_ids) for c in update.output.outputs)
        if prompt_tokens is not None:
            yield event([], usage=protocol.usage(prompt_tokens, completion_tokens))
        yield "data: [DONE]\n\n"

    async def _watch_disconnect(self) -> None:
        """The request's body is read: the next ASGI message is the client going away."""
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.close()

    def close(self) -> None:
        for request_id in self.unfinished:
            self.loop.abort(request_id)
        self.unfinished.clear()
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
