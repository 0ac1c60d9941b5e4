"""The HTTP side of `kvgraft serve`: a Starlette app speaking the OpenAI API (no hand-written HTTP).

Handlers parse and check a request (app/serve/openai_api.py), tokenize it (the model is safe to read
from any thread), refuse a prompt that does not fit with a 400, queue a `ServeJob` for the engine thread
(a full queue: 429 with Retry-After), and relay what the engine thread sends: one JSON response, or
server-sent events ending with `data: [DONE]`. Every error is an OpenAI error object, never a
traceback. A client that goes away mid-request cancels its job: the engine stops at the next token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvgraft.app.core.jobs import Cancelled, Errored, Event, QueueFull, Returned, Started
from kvgraft.app.core.model_registry import known_for_path
from kvgraft.app.proof.chat_format import ChatFormatError
from kvgraft.app.serve import messages_api, openai_shapes, prompt, responses_api, tools
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve.metrics import Metrics
from kvgraft.app.serve.openai_api import ApiError, CompletionRequest
from kvgraft.app.serve.openai_shapes import engine_error as _engine_error
from kvgraft.app.serve.worker import EngineWorker, ServeJob

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
KEEP_ALIVE_S = 5.0  # a stream sends ": keep-alive" this often while nothing else goes out (a long prefill)


@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    time_limit_s: float = 600.0
    retry_after_s: int = 2
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (none: CORS off)
    keep_alive_s: float = KEEP_ALIVE_S
    # told of every request answered without a job (the model list, and what was refused before one
    # ran): {"method", "path", "status", "message"}; called on the HTTP thread (the window's server log)
    on_answered: Callable[[dict], None] | None = None


def error_response(exc: ApiError) -> JSONResponse:
    headers = {"x-should-retry": "false"} if exc.status < 500 and exc.status != 429 else {}
    return JSONResponse(exc.body(), status_code=exc.status, headers={**headers, **exc.headers})


@dataclass(frozen=True)
class Surface:
    """One API's shapes over the one request core: its request parsed into a `CompletionRequest`, the
    answer whole or streamed, its errors."""

    name: str
    parse: Callable
    whole: Callable  # (server, req, done, prep) -> dict
    stream: Callable  # (server, req, job, events) -> async iterator of SSE events
    error: Callable = error_response


CHAT = Surface("chat", lambda b: api.parse_request(b, True), openai_shapes.whole_body, openai_shapes.stream_events)
COMPLETIONS = Surface(
    "completions", lambda b: api.parse_request(b, False), openai_shapes.whole_body, openai_shapes.stream_events
)
MESSAGES = Surface("messages", messages_api.parse, messages_api.whole, messages_api.stream, messages_api.error)


class Server:
    def __init__(self, worker: EngineWorker, config: ServerConfig) -> None:
        self.worker = worker
        self.config = config
        self.metrics = Metrics(worker)
        self.started = int(time.time())
        self.responses = Surface("responses", responses_api.parser(self), responses_api.whole, responses_api.stream)

    # -- plumbing ------------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.encode(), key.encode()):
            raise ApiError(
                401,
                "a valid API key is needed (Authorization: Bearer ...)",
                "authentication_error",
                code="invalid_api_key",
            )

    def _ready(self) -> None:
        if self.worker.load_error is not None:
            raise ApiError(
                503,
                f"the model could not be loaded: {self.worker.load_error}",
                "server_error",
                code="model_load_failed",
            )
        if not self.worker.ready.is_set():
            raise ApiError(503, "the model is loading", "unavailable_error", code="loading")

    async def _body(self, request: Request):
        cap = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            raise ApiError(413, f"the request body is larger than {cap} bytes", code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise ApiError(413, f"the request body is larger than {cap} bytes", code="request_too_large")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as exc:
            raise api.bad(None, f"the request body is not valid JSON: {exc}", "invalid_json") from None

    @property
    def model_id(self) -> str:
        """The name a user passes to `--model`: a known model's (app/core/model_registry.py), else the file's."""
        path = Path(self.worker.service.engine.model.info.path)
        known = known_for_path(path)
        return known.name if known is not None else path.stem

    # -- endpoints -----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        self._ready()
        return JSONResponse({"status": "ok"})

    def _model_card(self) -> dict:
        info = self.worker.service.engine.model.info
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.started,
            "owned_by": "kvgraft",
            "meta": {"sha256": info.sha256, "n_ctx": self.worker.service.engine.config.n_ctx},
        }

    def _answered(self, request: Request, status: int, message: str | None = None) -> None:
        if self.config.on_answered is not None:
            self.config.on_answered(
                {"method": request.method, "path": request.url.path, "status": status, "message": message}
            )

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
            self._ready()
        except ApiError as exc:
            self._answered(request, exc.status, exc.message)
            return error_response(exc)
        self._answered(request, 200)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        try:
            self._authorize(request)
            self._ready()
            name = request.path_params["model_id"]
            if name not in (self.model_id, Path(self.worker.service.engine.model.info.path).stem):
                message = f"no model {name[:80]!r}: this server runs {self.model_id!r}"
                raise ApiError(404, message, param="model", code="model_not_found")
        except ApiError as exc:
            self._answered(request, exc.status, exc.message)
            return error_response(exc)
        self._answered(request, 200)
        return JSONResponse(self._model_card())

    async def metrics_text(self, request: Request) -> Response:
        self._authorize(request)
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, COMPLETIONS)

    async def messages(self, request: Request) -> Response:
        return await self._complete(request, MESSAGES)

    async def responses_(self, request: Request) -> Response:
        return await self._complete(request, self.responses)

    async def _complete(self, request: Request, surface: "Surface") -> Response:
        """The one request core behind every surface: parse (the surface's shapes), tokenize, queue,
        relay the engine's events in the surface's shapes."""
        endpoint, job = surface.name, None
        try:
            self._authorize(request)
            self._ready()
            req = surface.parse(await self._body(request))
            job, events = await self._job(req)
            job.path = request.url.path
            try:
                self.worker.submit(job)
            except QueueFull as exc:
                job = None
                raise ApiError(
                    429,
                    f"too many requests: {exc}",
                    "rate_limit_error",
                    code="queue_full",
                    headers={"Retry-After": str(self.config.retry_after_s)},
                ) from None
            if req.stream:  # the headers and the role chunk go out now, keep-alives while the prompt is read
                self.metrics.request(endpoint, 200)
                return EventSourceResponse(
                    surface.stream(self, req, job, events),
                    ping=self.config.keep_alive_s,
                    ping_message_factory=lambda: ServerSentEvent(comment="keep-alive"),
                )
            first = await self._next(request, job, events)
            if isinstance(first, (Errored, Cancelled)):
                raise _engine_error(first)
        except ApiError as exc:
            self.metrics.request(endpoint, exc.status)
            if job is None:  # refused before a job ran (a job's own end is logged where it ran)
                self._answered(request, exc.status, exc.message)
            return surface.error(exc)
        self.metrics.request(endpoint, 200)
        return await self._whole(request, surface, req, job, events, first.value)

    async def _prompt(self, req: CompletionRequest) -> tuple:
        try:  # off the event loop: a long prompt must not stall the other clients' streams
            return await run_in_threadpool(prompt.build, self.worker.service.engine.model, req)
        except ChatFormatError as exc:
            raise api.bad("messages", str(exc)) from None

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's `/v1/messages/count_tokens`: the prompt tokens the same `/v1/messages` request
        is answered from (its usage's input_tokens plus cache_read_input_tokens)."""
        return await self._rendered(request, MESSAGES, {"max_tokens": 1}, lambda t: {"input_tokens": len(t)})

    async def apply_template(self, request: Request) -> Response:
        """llama-server's `/apply-template`: the prompt a chat request is answered from, as text, and here
        its tokens too (to compare renderings token for token)."""

        def shape(tokens: list[int]) -> dict:
            model = self.worker.service.engine.model  # after _ready: the model is loaded
            text = b"".join(model.token_bytes(t, special=True) for t in tokens).decode("utf-8", errors="replace")
            return {"prompt": text, "tokens": tokens}

        return await self._rendered(request, CHAT, {"model": "any"}, shape)

    async def _rendered(self, request: Request, surface: Surface, defaults: dict, shape: Callable) -> Response:
        """The prompt tokens a body of `surface` (its missing fields from `defaults`) is answered from, in
        `shape`; nothing is decoded."""
        try:
            self._authorize(request)
            self._ready()
            body = await self._body(request)
            req = surface.parse({**defaults, **body} if isinstance(body, dict) else body)
            tokens = (await self._prompt(req))[0]
        except ApiError as exc:
            self._answered(request, exc.status, exc.message)
            return surface.error(exc)
        self._answered(request, 200)
        return JSONResponse(shape(tokens))

    async def _job(self, req: CompletionRequest) -> tuple[ServeJob, asyncio.Queue]:
        model = self.worker.service.engine.model
        tokens, boundaries, stops, pins = await self._prompt(req)
        spec = req.tools
        n_ctx = self.worker.service.engine.config.n_ctx
        if len(tokens) >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {len(tokens)} tokens; this server's context holds {n_ctx} (prompt and reply together)",
                param="messages" if req.chat else "prompt",
                code="context_length_exceeded",
            )
        grammar = None
        if spec.constrained:
            room = n_ctx - len(tokens)
            grammar = await run_in_threadpool(prompt.grammar, model, spec)
            await run_in_threadpool(prompt.fits, grammar, room if req.max_tokens is None else min(req.max_tokens, room))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event: Event) -> None:
            if not isinstance(event, Started):  # a request's events start with its prompt read (or its failure)
                loop.call_soon_threadsafe(events.put_nowait, event)

        job = ServeJob(
            tokens=tokens,
            max_tokens=req.max_tokens,
            emit=emit,
            stops=stops,
            sampling=req.sampling,
            top_logprobs=req.top_logprobs,
            strip=req.chat and req.prefill is None,
            grammar=grammar,
            pins=pins,
            deadline=time.monotonic() + self.config.time_limit_s,
            # the ends of a chat's messages (the last one's too), or a completion's last blank line
            boundaries=(*boundaries, len(tokens)) if req.chat else tuple(boundaries),
            # a conversation: its reply's state is worth storing (a stored response will be gone on from)
            continues=req.chat
            and (any(m["role"] == "assistant" for m in req.messages) or bool(req.extra.get("store"))),
            tools=spec,
            answered=tools.answered_calls(req.messages, spec) if req.chat else frozenset(),
        )
        return job, events

    async def _next(self, request: Request, job: ServeJob, events: asyncio.Queue) -> Event:
        """The next event of `job`; a client that disconnects meanwhile cancels it."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel.set()
                    raise ApiError(499, "the client went away", code="client_closed") from None

    async def _whole(self, request, surface, req: CompletionRequest, job: ServeJob, events, prep) -> Response:
        while True:
            ev = await self._next(request, job, events)
            if isinstance(ev, Returned):
                break
            if isinstance(ev, (Errored, Cancelled)):
                return surface.error(_engine_error(ev))
        self.metrics.decoded(ev.value["completion_tokens"])
        return JSONResponse(surface.whole(self, req, ev.value, prep))


def build_app(server: Server) -> Starlette:
    async def not_found(request: Request, exc: HTTPException) -> Response:
        return error_response(
            ApiError(
                exc.status_code,
                f"{request.method} {request.url.path}: {exc.detail}",
                code="not_found" if exc.status_code == 404 else "method_not_allowed",
            )
        )

    async def internal(request: Request, exc: Exception) -> Response:
        log.exception("an unexpected error answering %s", request.url.path)
        return error_response(
            ApiError(500, f"internal error ({type(exc).__name__})", "server_error", code="internal_error")
        )

    routes = [
        Route("/health", server.health),
        Route("/v1/models", server.models),
        Route("/v1/models/{model_id:path}", server.model),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/messages", server.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", server.count_tokens, methods=["POST"]),
        Route("/v1/responses", server.responses_, methods=["POST"]),
        Route("/apply-template", server.apply_template, methods=["POST"]),
        Route("/metrics", server.metrics_text),
    ]
    middleware = []
    if server.config.cors_origins:  # off unless asked for: a browser page on another origin may call the API
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(server.config.cors_origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["*"],
                max_age=600,
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HTTPException: not_found,
            Exception: internal,
            ApiError: lambda request, exc: error_response(exc),
        },
    )
