"""Sending the responses of one request safely, and recognising the gRPC front's in-band cancels.

`ResponseStream` wraps a python-backend response sender (same `send(response=None, flags=0)` signature): exactly
one FINAL response per request — a send after the final one is dropped (counted, never reaching Triton), and
`finish()` sends the final flag if nothing did. The serving core calls `finish()` on every exit path, so no request
is left without its final response (Triton would hold its stream open) and none gets two.

In-band cancels (llmkiln.serve.grpc_front): Triton 2.51 crashes when gRPC streams are cancelled with requests in
flight, so the front never cancels a stream upstream; it sends a request with the parameters `llmkiln_cancel`
(the upstream id of the request to cancel) and `llmkiln_cancel_key` (a per-server secret from the environment,
`LLMKILN_CANCEL_KEY`) instead. `cancel_target` tells such a request from an ordinary one; `CancelBook` remembers
the cancels whose request is not running yet (still being tokenized) so it is cancelled as soon as it is submitted.
"""

from __future__ import annotations

import hmac
import json
import os
from collections import OrderedDict

from llmkiln.serve.triton_pb import ResponseSender

CANCEL_PARAM = "llmkiln_cancel"  # value: the upstream id of the request to cancel
CANCEL_KEY_PARAM = "llmkiln_cancel_key"  # value: the server's cancel key
CANCEL_KEY_ENV = "LLMKILN_CANCEL_KEY"  # how the key reaches the model (tritonserver's environment)
EARLY_CANCELS_KEPT = 4096


class ResponseStream:
    """One request's response sender: at most one FINAL response, nothing after it."""

    def __init__(self, sender: ResponseSender, final_flag: int) -> None:
        self.sender = sender
        self.final_flag = final_flag
        self.finished = False
        self.dropped = 0  # sends refused because the final response had gone out

    def send(self, response: object | None = None, flags: int = 0) -> None:
        if self.finished:
            self.dropped += 1
            return
        if flags & self.final_flag:
            self.finished = True
        if response is None:
            self.sender.send(flags=flags)
        else:
            self.sender.send(response, flags=flags)

    def finish(self) -> None:
        """The final flag, unless a final response went out already."""
        if not self.finished:
            self.send(flags=self.final_flag)


class InvalidCancel(Exception):
    """A request carrying the cancel parameter without this server's key."""


def cancel_target(request: object, key: str | None = None) -> str | None:
    """The request id an in-band cancel names, or None for an ordinary request (raises InvalidCancel)."""
    get = getattr(request, "parameters", None)
    if get is None:
        return None
    try:
        params = json.loads(get() or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(params, dict) or CANCEL_PARAM not in params:
        return None
    key = os.environ.get(CANCEL_KEY_ENV) if key is None else key
    sent = params.get(CANCEL_KEY_PARAM)
    if not key or not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), key.encode()):
        raise InvalidCancel("llmkiln: bad request: the 'llmkiln_cancel' parameter is reserved")
    return str(params[CANCEL_PARAM])


class CancelBook:
    """Cancels that arrived before their request was submitted (bounded: the oldest are forgotten)."""

    def __init__(self, keep: int = EARLY_CANCELS_KEPT) -> None:
        self.keep = keep
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        while len(self._ids) > self.keep:
            self._ids.popitem(last=False)

    def take(self, request_id: str | None) -> bool:
        """Whether request_id was cancelled early (and forget it)."""
        if not request_id or request_id not in self._ids:
            return False
        del self._ids[request_id]
        return True
