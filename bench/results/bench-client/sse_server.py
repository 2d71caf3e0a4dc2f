"""A fake OpenAI completions server on 127.0.0.1:PORT: every request streams 64 small SSE chunks 2 ms apart.
python sse_server.py PORT"""

import asyncio
import json
import sys

from aiohttp import web

CHUNKS = 64
CHUNK = {
    "id": "cmpl-x",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}],
}
LAST = (
    b'data: {"id":"x","choices":[{"index":0,"text":"","finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":64}}\n\n'
)


async def handle(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(CHUNKS):
        await resp.write(b"data: " + json.dumps(CHUNK).encode() + b"\n\n")
        await asyncio.sleep(0.002)
    await resp.write(LAST)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


app = web.Application()
app.router.add_post("/v1/completions", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
