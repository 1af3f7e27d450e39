"""The demo's aiohttp application: /health, /props, a websocket (/ws and /v1/realtime), the API routes, and
what every response carries (the X-Demo-Model header, --echo, JSON errors, --log-requests)."""

import os
import time

from aiohttp import WSMsgType, web
from aiohttp.typedefs import Handler

from llmswap.demo import anthropic_api, openai_api, sleep_api, slots_api
from llmswap.demo.console import say
from llmswap.demo.context import Demo
from llmswap.demo.received import received
from llmswap.demo.replies import BadRequest, error_body
from llmswap.demo.text import DEFAULT_MAX_TOKENS

MODEL_HEADER = "X-Demo-Model"
# Audio and images arrive as uploads; aiohttp's 1 MiB default would turn a modest test file into a 413.
MAX_BODY_SIZE = 64 * 2**20


def build_app(demo: Demo) -> web.Application:
    @web.middleware
    async def serve(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            got = await received(request)
        except web.HTTPException as exc:
            body = error_body(request.path, exc.status, f"could not read the request body: {exc.reason}")
            return web.json_response(body, status=exc.status)
        except ValueError as exc:
            body = error_body(request.path, 400, f"could not read the request body: {exc}")
            return web.json_response(body, status=400)
        demo.state.requests += 1
        if demo.sleep is not None and got.method == "POST" and got.path.startswith("/v1/"):
            await demo.sleep.awake.wait()  # asleep: held until the next wake, as vLLM's paused scheduler does
        if demo.options.log_requests and got.path != "/health":  # llmswap probes it while loading
            say(f"request {got.method} {got.path} model={got.model or '-'}")
        try:
            return await handler(request)
        except BadRequest as exc:
            return demo.reply(got, error_body(got.path, 400, f"demo {demo.name}: {exc}"), status=400)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status == 404:
                message = f"demo {demo.name}: no route for {got.method} {got.path}"
            elif exc.status == 405:
                message = f"demo {demo.name}: {got.method} is not allowed on {got.path}"
            else:
                message = f"demo {demo.name}: {exc.reason}"
            reply = demo.reply(got, error_body(got.path, exc.status, message), status=exc.status)
            if "Allow" in exc.headers:
                reply.headers["Allow"] = exc.headers["Allow"]
            return reply

    async def identify(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[MODEL_HEADER] = demo.name

    async def health(request: web.Request) -> web.StreamResponse:
        got = await received(request)
        if not demo.state.healthy:
            return demo.reply(got, {"status": "loading"}, status=503)
        if not demo.state.first_health_reported:
            demo.state.first_health_reported = True
            say(f"first healthy response at monotonic={time.monotonic()!r}")
        return demo.reply(got, {"status": "ok"})

    async def props(request: web.Request) -> web.StreamResponse:
        got = await received(request)
        state = demo.state
        return demo.reply(
            got,
            {
                "model_alias": demo.name,
                "model_path": f"demo/{demo.name}",
                "total_slots": 1,
                "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": DEFAULT_MAX_TOKENS}},
                "build_info": "llmswap-demo",
                "demo": {
                    "model_name": demo.name,
                    "pid": os.getpid(),
                    "healthy": state.healthy,
                    "requests": state.requests,
                    "generations_in_progress": state.generations_in_progress,
                    "tokens_generated": state.tokens_generated,
                    "socket_close_codes": state.socket_close_codes,
                    "sleeping": demo.sleep is not None and demo.sleep.sleeping,
                },
            },
        )

    async def socket(request: web.Request) -> web.StreamResponse:
        """A websocket, for proxy tests: a hello naming the model, then text echoed with the model's name
        in front and binary echoed reversed; `close <code>` makes the demo close with that code."""
        got = await received(request)
        ws = web.WebSocketResponse(protocols=("demo.v1",))
        await ws.prepare(request)
        await ws.send_json({
            "event": "hello", "model": demo.name, "query": got.query, "protocol": ws.ws_protocol,
            "headers": {name: value for name, value in got.headers.items() if name.lower().startswith("x-")},
        })
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                command, _, argument = message.data.partition(" ")
                if command == "close" and argument.isdigit():
                    await ws.close(code=int(argument))
                    return ws
                await ws.send_str(f"{demo.name}: {message.data}")
            elif message.type is WSMsgType.BINARY:
                await ws.send_bytes(message.data[::-1])
        if ws.close_code is not None:
            demo.state.socket_close_codes.append(ws.close_code)
        return ws

    app = web.Application(middlewares=[serve], client_max_size=MAX_BODY_SIZE)
    app.on_response_prepare.append(identify)
    app.add_routes([web.get("/health", health), web.get("/props", props), web.get("/ws", socket),
                    web.get("/v1/realtime", socket)])
    if demo.sleep is not None:
        app.add_routes(sleep_api.routes(demo.sleep))
    if demo.options.slot_save_path is not None:
        app.add_routes(slots_api.routes(demo, demo.options.slot_save_path))
    app.add_routes(openai_api.routes(demo))
    app.add_routes(anthropic_api.routes(demo))
    return app
