"""Async streaming client for an OpenAI-compatible endpoint (Dynamo's frontend, `kiln serve --dynamo`).

Each request is one streaming POST to `/chat/completions` (the workload's system prompt as a system message,
the rest as the user message) or `/completions` (the whole prompt), greedy, with
`stream_options.include_usage` so the last chunk carries the usage: completion tokens and
`prompt_tokens_details.cached_tokens` (prompt tokens served from the worker's prefix cache). TTFT is the first
chunk that carries content; every content chunk is a token arrival (a chunk may carry more than one token: the
usage's count wins for TPOT). Loopback only; a per-request timeout turns a hung stream into an error.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import BenchRequest
from llmkiln.errors import BadInput, KilnError

Api = Literal["chat", "completions"]


def check_openai_url(url: str) -> str:
    """'http://127.0.0.1:8000/v1' (trailing slash dropped); loopback hosts only (BadInput otherwise)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--url {url!r}: expected the OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    host = parts.hostname
    if host != "localhost":
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
        if not loop:
            raise BadInput(f"--url {url!r}: only loopback hosts (127.0.0.1, ::1, localhost) are benchmarked")
    return url.rstrip("/")


def request_body(model: str, req: BenchRequest, api: Api) -> dict[str, Any]:
    """The JSON body of one greedy streaming request."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        system, user = req.split_system()
        messages = [{"role": "system", "content": system}] if system else []
        body["messages"] = [*messages, {"role": "user", "content": user}]
    else:
        body["prompt"] = req.prompt
    return body


async def run_one(
    client: httpx.AsyncClient, url: str, model: str, req: BenchRequest, api: Api, timeout_s: float
) -> RequestRecord:
    """Send `req` and record every content chunk's arrival; errors are recorded, never raised."""
    rec = RequestRecord(index=req.index, group=req.group, send_ns=0, num_prompt_tokens=req.num_prompt_tokens)
    path = "/chat/completions" if api == "chat" else "/completions"
    usage: dict[str, Any] | None = None
    finish: str | None = None
    rec.send_ns = time.perf_counter_ns()
    rec.send_wall_ns = time.time_ns()  # lines up with server-side stamps (a step profile)
    try:
        async with client.stream(
            "POST", url + path, json=request_body(model, req, api), timeout=timeout_s
        ) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {r.status_code}: {body[:300]}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    rec.end_ns = time.perf_counter_ns()
                    break
                chunk = json.loads(data)
                err = chunk.get("error")
                if isinstance(err, dict):  # an error after the stream began (e.g. a prompt too long)
                    rec.error = f"HTTP {err.get('code', '?')} in the stream: {str(err.get('message'))[:300]}"
                    continue
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
                    if text:
                        rec.token_ns.append(time.perf_counter_ns())
                    finish = choice.get("finish_reason") or finish
    except (httpx.HTTPError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    if rec.end_ns is None:
        rec.error = "stream ended without [DONE]"
    rec.num_output_tokens = len(rec.token_ns)
    if usage is not None:
        rec.num_output_tokens = int(usage.get("completion_tokens") or rec.num_output_tokens)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            rec.num_cached_tokens = int(details["cached_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.server["prompt_tokens"] = int(usage["prompt_tokens"])
    if finish is None and rec.error is None:
        rec.error = "no finish_reason in the stream"
    return rec


async def wait_ready(client: httpx.AsyncClient, url: str, model: str, timeout_s: float) -> None:
    """Wait until /models lists `model`, or raise KilnError."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = await client.get(url + "/models", timeout=5)
            ids = [m.get("id") for m in r.json().get("data", [])]
            if model in ids:
                return
            last = f"models served: {ids}"
        except (httpx.HTTPError, ValueError) as exc:
            last = str(exc)
        await asyncio.sleep(0.5)
    raise KilnError(f"OpenAI endpoint {url}: model {model!r} not ready after {timeout_s:.0f}s ({last})")
