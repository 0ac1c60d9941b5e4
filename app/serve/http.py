"""The HTTP side of `kvgraft serve`: a Starlette app speaking the OpenAI API (no hand-written HTTP).

Handlers parse and check a request (app/serve/openai_api.py), tokenize it (the model is safe to read
from any thread), refuse a prompt that does not fit with a 400, queue a `Job` for the engine thread
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

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvgraft.app.proof.chat_format import ChatFormat, ChatFormatError, paragraph_boundary
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve.metrics import Metrics
from kvgraft.app.serve.openai_api import ApiError, CompletionRequest
from kvgraft.app.serve.worker import EngineWorker, Job, QueueFull

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    time_limit_s: float = 600.0
    retry_after_s: int = 2


def error_response(exc: ApiError) -> JSONResponse:
    headers = {"x-should-retry": "false"} if exc.status < 500 and exc.status != 429 else {}
    return JSONResponse(exc.body(), status_code=exc.status, headers={**headers, **exc.headers})


class Server:
    def __init__(self, worker: EngineWorker, config: ServerConfig) -> None:
        self.worker = worker
        self.config = config
        self.metrics = Metrics(worker)
        self.started = int(time.time())

    # -- plumbing ------------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
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
        return Path(self.worker.service.engine.model.info.path).stem

    # -- endpoints -----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        self._ready()
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        self._ready()
        info = self.worker.service.engine.model.info
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_id,
                        "object": "model",
                        "created": self.started,
                        "owned_by": "kvgraft",
                        "meta": {"sha256": info.sha256, "n_ctx": self.worker.service.engine.config.n_ctx},
                    }
                ],
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        self._authorize(request)
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        try:
            self._authorize(request)
            self._ready()
            req = api.parse_request(await self._body(request), chat)
            job, events = await self._job(req)
            try:
                self.worker.submit(job)
            except QueueFull as exc:
                raise ApiError(
                    429,
                    f"too many requests: {exc}",
                    "rate_limit_error",
                    code="queue_full",
                    headers={"Retry-After": str(self.config.retry_after_s)},
                ) from None
            first = await self._next(request, job, events)
            if first[0] == "error":
                raise _engine_error(first)
        except ApiError as exc:
            self.metrics.request(endpoint, exc.status)
            return error_response(exc)
        prep = first[1]
        self.metrics.request(endpoint, 200)
        if req.stream:
            return EventSourceResponse(self._stream(request, req, job, events, prep), ping=15)
        return await self._whole(request, req, job, events, prep)

    async def _job(self, req: CompletionRequest) -> tuple[Job, asyncio.Queue]:
        model = self.worker.service.engine.model
        stops, boundaries = req.stop, []
        if req.chat:
            fmt = ChatFormat.for_model(model)
            try:  # off the event loop: a long prompt must not stall the other clients' streams
                tokens, boundaries = await run_in_threadpool(fmt.conversation_with_boundaries, model, req.messages)
            except ChatFormatError as exc:
                raise api.bad("messages", str(exc)) from None
            stops = tuple(dict.fromkeys(stops + fmt.stops))
        else:
            tokens = await run_in_threadpool(model.tokenize, req.prompt, True)
            boundaries = await run_in_threadpool(paragraph_boundary, model, req.prompt, tokens)
        n_ctx = self.worker.service.engine.config.n_ctx
        if len(tokens) >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {len(tokens)} tokens; this server's context holds {n_ctx} (prompt and reply together)",
                param="messages" if req.chat else "prompt",
                code="context_length_exceeded",
            )
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = Job(
            tokens=tokens,
            max_tokens=req.max_tokens,
            emit=emit,
            stops=stops,
            sampling=req.sampling,
            top_logprobs=req.top_logprobs,
            strip=req.chat,
            deadline=time.monotonic() + self.config.time_limit_s,
            # the ends of a chat's messages (the last one's too), or a completion's last blank line
            boundaries=(*boundaries, len(tokens)) if req.chat else tuple(boundaries),
            continues=req.chat and any(m["role"] == "assistant" for m in req.messages),
        )
        return job, events

    async def _next(self, request: Request, job: Job, events: asyncio.Queue) -> tuple:
        """The next event of `job`; a client that disconnects meanwhile cancels it."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel.set()
                    raise ApiError(499, "the client went away", code="client_closed") from None

    async def _whole(self, request, req: CompletionRequest, job: Job, events, prep) -> Response:
        while True:
            ev = await self._next(request, job, events)
            if ev[0] == "done":
                break
            if ev[0] == "error":
                return error_response(_engine_error(ev))
        done = ev[1]
        model = self.worker.service.engine.model
        reason = api.finish_reason(done["stop_reason"])
        if req.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": done["text"]},
                "logprobs": api.chat_logprobs(model, done["logprobs"]) if req.top_logprobs is not None else None,
                "finish_reason": reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": done["text"],
                "logprobs": api.completion_logprobs(model, done["logprobs"]) if req.top_logprobs is not None else None,
                "finish_reason": reason,
            }
            obj = "text_completion"
        body = {
            "id": api.new_id("chatcmpl" if req.chat else "cmpl"),
            "object": obj,
            "created": api.created(),
            "model": self.model_id,
            "choices": [choice],
            "usage": api.usage(prep.prompt_tokens, done["completion_tokens"], prep.cached_tokens),
            "timings": _timings(prep, done),
            "kvgraft": prep.as_dict(),
        }
        self.metrics.decoded(done["completion_tokens"])
        return JSONResponse(body)

    async def _stream(self, request, req: CompletionRequest, job: Job, events, prep):
        model = self.worker.service.engine.model
        ident, made = api.new_id("chatcmpl" if req.chat else "cmpl"), api.created()
        obj = "chat.completion.chunk" if req.chat else "text_completion"

        def chunk(delta: str | None, lps, reason=None, role=False) -> str:
            if req.chat:
                d = {"role": "assistant", "content": ""} if role else ({"content": delta} if delta is not None else {})
                lp = api.chat_logprobs(model, lps) if req.top_logprobs is not None and lps else None
                choice = {"index": 0, "delta": d, "logprobs": lp, "finish_reason": reason}
            else:
                lp = api.completion_logprobs(model, lps) if req.top_logprobs is not None and lps else None
                choice = {"index": 0, "text": delta or "", "logprobs": lp, "finish_reason": reason}
            return json.dumps(
                {"id": ident, "object": obj, "created": made, "model": self.model_id, "choices": [choice]}
            )

        try:
            if req.chat:
                yield {"data": chunk(None, [], role=True)}
            while True:
                ev = await events.get()
                if ev[0] == "text":
                    if ev[1] or ev[2]:
                        yield {"data": chunk(ev[1], ev[2])}
                elif ev[0] == "error":
                    yield {"data": json.dumps(_engine_error(ev).body())}
                    break
                elif ev[0] == "done":
                    done = ev[1]
                    self.metrics.decoded(done["completion_tokens"])
                    yield {"data": chunk(None, done["tail_logprobs"], api.finish_reason(done["stop_reason"]))}
                    if req.include_usage:
                        yield {
                            "data": json.dumps(
                                {
                                    "id": ident,
                                    "object": obj,
                                    "created": made,
                                    "model": self.model_id,
                                    "choices": [],
                                    "usage": api.usage(
                                        prep.prompt_tokens, done["completion_tokens"], prep.cached_tokens
                                    ),
                                    "timings": _timings(prep, done),
                                    "kvgraft": prep.as_dict(),
                                }
                            )
                        }
                    break
            yield {"data": "[DONE]"}
        finally:
            job.cancel.set()  # a client gone mid-stream: the engine stops at the next token


def _timings(prep, done: dict) -> dict:
    return {
        "prompt_n": prep.tokens_prefilled,
        "cache_n": prep.cached_tokens,
        "prompt_ms": prep.prefill_ms + prep.graft_ms,
        "predicted_n": done["completion_tokens"],
        "predicted_ms": done["decode_ms"],
    }


def _engine_error(ev: tuple) -> ApiError:
    _, code, message = ev
    if code == "context_length_exceeded":
        return ApiError(400, message, code=code)
    if code == "shutting_down":
        return ApiError(503, message, "unavailable_error", code=code)
    if code == "cancelled":
        return ApiError(408, "the request ran past its time limit", code="timeout")
    return ApiError(500, message, "server_error", code=code)


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
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/metrics", server.metrics_text),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={
            HTTPException: not_found,
            Exception: internal,
            ApiError: lambda request, exc: error_response(exc),
        },
    )
