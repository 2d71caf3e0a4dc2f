"""The KV hand-off of a prefill host to a decode host, moved by NIXL (DRAM to DRAM over UCX, one CPU host or two).

    kv = KvTransfer(engine, WorkerRole.PREFILL, host.metrics)      # one NIXL agent per host
    h = engine.submit(prompt_ids, sampling, handoff=KvHandoff(export_prefix=True))
    params = kv.open_export(h.exported.result())  # prefill: the blocks pinned at its end; a KvHandle
    res, stats = kv.pull(params, prompt_ids)   # decode: reserve room, READ the blocks into it, tell the peer
    engine.submit(prompt_ids, sampling, handoff=KvHandoff(kv_import=res))   # published right before admission
    kv.close()

The host's KV connector (host.kv_connector) decides when each of these happens; this module only moves blocks.

Memory: each host registers its engine's block memory (runtime.block_memory: the OpenVINO runner's pools — the
blocks the engine computes in and reads from, so nothing is staged —, or onnxruntime's prefix store: values, and
scales for int8/fp8) with its agent once, at start; the arrays never move, so the agent metadata (a few hundred bytes: the UCX address and the registrations'
keys) is the same for every request and travels in `disaggregated_params`, base64. A block moves as stored
(fp32/fp16/int8/fp8 values, then its float32 scales), never as JSON: the handle carries the agent's name and
metadata, the export id, the store layout, and the exported block ids with each array's base address and block
stride, from which the decode side computes the remote descriptors.

Life of an export (prefill side): the blocks are pinned on the scheduler thread (a request submitted with
`handoff.export_prefix` gets them pinned right after its last step) and `open_export` opens an export; it is released — the blocks unpinned — when the decode side's READ completes (its NIXL
notification `release:<id>` arrives with the data), when the decode side says it gave up (`failed:<id>`), or after
`export_timeout_s` (a decode worker that died mid-transfer never says anything). The release notifications are
polled by one thread every POLL_S. The decode side reserves its blocks (EngineKv.reserve_import, pinned, not
visible), reads, and hands the reservation to `submit`; if the read fails or times out it gives the blocks back,
tells the peer, and the caller prefills the prompt itself (counted as a fallback).

Short prompts (`local_handoff`, prefill side): a prompt whose uncached part is at most `max_local_prefill_tokens`
is not prefilled here at all: the prefill role answers at once with a `LocalPrefill` hand-off (no KV, no pin),
and the decode side prefills it itself — conditional disaggregation, decided where Dynamo 1.6.1's
frontend always sends a prompt first (docs/serve.md, "Short prompts skip the prefill tier").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmkiln.errors import BadInput, KilnError
from llmkiln.host.disaggregated_params import KvHandle, LocalPrefill
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.metrics import HostMetrics
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.block_memory import array_spans
from llmkiln.runtime.kv_blocks import Reservation
from llmkiln.runtime.protocol import KvEngine

POLL_S = 0.005  # how often the prefill side looks for release notifications and expired exports
XFER_POLL_S = 0.0002  # how often a pull checks its transfer's state
ENGINE_CALL_S = 30.0  # the longest a scheduler-thread call may take (a long step runs first)
PULL_DELAY_ENV = "LLMKILN_TEST_KV_PULL_DELAY_S"  # tests: pause a pull after connecting, before the READ


class TransferFailed(KilnError):
    """A pull did not bring the blocks (bad handle, another layout, the peer gone, a timeout)."""


class HostLog(Protocol):
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


@dataclass
class Export:
    export_id: str
    block_ids: list[int]
    created: float  # time.monotonic()


@dataclass(frozen=True)
class PullStats:
    """One pull: blocks the handle offered, blocks read (the rest were stored here already), bytes, seconds in
    all (reserve on the scheduler thread + read + hand-back) and of the NIXL read alone."""

    offered_blocks: int
    read_blocks: int
    nbytes: int
    seconds: float
    tokens: int
    read_seconds: float = 0.0


def _nixl() -> Any:
    from nixl_cu12 import _api  # heavy external package: imported where it is needed

    return _api


class KvTransfer:
    """A host's NIXL agent and its exports or pulls (see the module docstring)."""

    def __init__(
        self,
        engine: KvEngine,
        role: WorkerRole,
        metrics: HostMetrics,
        options: KvTransferOptions | None = None,
        log: HostLog | None = None,
    ) -> None:
        if role is WorkerRole.AGGREGATED:
            raise ValueError("an aggregated host moves no KV")
        store, data = engine.block_store, engine.kv.block_memory
        if store is None or data is None:
            raise BadInput(
                f"the {role.value} role moves prompt KV through the prefix store: this engine has none "
                "(kv_cache.prefix_reuse is off, or its store is empty)"
            )
        self.engine = engine
        self.role = role
        self.metrics = metrics
        opts = options if options is not None else KvTransferOptions()  # checked where it was made
        self.export_timeout_s = opts.export_timeout_s
        self.pull_timeout_s = opts.pull_timeout_s
        self.max_local_prefill_tokens = opts.max_local_prefill_tokens
        self.log: HostLog = log if log is not None else logging.getLogger("llmkiln.host.kv_transfer")
        self.data = data
        self.tokens_per_block = store.tokens_per_block
        api = _nixl()
        self.name = f"llmkiln-{role.value}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._agent_lock = threading.Lock()
        # No NIXL progress thread: it busy-polls UCX (measured: ~90% of a core per idle worker, which made a
        # 2-core prefill worker's prefill ~3x slower); progress is driven by this host's own calls instead (the
        # decode side polls its transfer, the prefill side its notifications every POLL_S)
        config = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        self.agent = api.nixl_agent(self.name, config)
        self._registration = self.agent.register_memory([(a, n, 0, "") for a, n in data.regions()], "DRAM")
        self.metrics.set("kv_registrations", len(data.regions()))
        self.metadata = self.agent.get_agent_metadata()
        self._arrays = data.arrays()
        self._lock = threading.Lock()
        self._exports: dict[str, Export] = {}
        self._releasing: dict[str, Export] = {}  # released, their unpin not done yet
        self._peers: dict[str, bytes] = {}
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        if role is WorkerRole.PREFILL:
            self._poller = threading.Thread(target=self._poll, name="llmkiln-kv-exports", daemon=True)
            self._poller.start()

    # ------------------------------------------------------------------ prefill side
    def local_handoff(self, token_ids: Sequence[int]) -> LocalPrefill | None:
        """The hand-off of a prompt whose uncached part (here: the prompt less the prefix this host's store holds,
        `EngineKv.cached_prefix_estimate`, read without the scheduler thread) is at most
        `max_local_prefill_tokens`: JSON telling the decode worker to prefill it itself — the request never waits
        at this engine —; None (0: off) when this host should prefill it and export its KV. Counted."""
        limit = self.max_local_prefill_tokens
        n = len(token_ids)
        if limit <= 0:
            return None
        uncached = n if n <= limit else n - self.engine.kv.cached_prefix_estimate(token_ids)
        if uncached > limit:
            return None
        self.metrics.add("kv_local_handoffs")
        return LocalPrefill(n, uncached, limit)

    def open_export(self, block_ids: Sequence[int]) -> KvHandle | None:
        """Export blocks pinned for it (a request's `exported`): where they are; None (and nothing pinned) when
        there are none."""
        ids = [int(b) for b in block_ids]
        if not ids:
            return None
        export = Export(uuid.uuid4().hex, list(ids), time.monotonic())
        with self._lock:
            if self._closed.is_set():
                self.engine.kv.release_blocks(ids)
                return None
            self._exports[export.export_id] = export
        self.metrics.add("kv_exports")
        self._publish_open()
        return KvHandle(
            self.name, self.metadata, export.export_id, self.data.layout(), tuple(self._arrays), tuple(ids)
        )

    def release(self, export_id: str, why: str, wait: bool = False) -> bool:
        """Unpin an export's blocks (the decode side read them, gave up, or the export expired). The unpin is a
        scheduler-thread call: the poller does not wait for it (wait=True does); the gauges follow once done."""
        with self._lock:
            export = self._exports.pop(export_id, None)
            if export is not None:
                self._releasing[export_id] = export
        if export is None:
            return False
        if why == "timeout":
            self.metrics.add("kv_exports_expired")
            self.log.warning(
                f"llmkiln: KV export {export_id} ({len(export.block_ids)} blocks) released after "
                f"{self.export_timeout_s:g} s without word from the decode side"
            )

        def done(_fut: object = None) -> None:
            with self._lock:
                self._releasing.pop(export_id, None)
            self._publish_open()

        fut = self.engine.kv.release_blocks(
            export.block_ids
        )  # EngineClosed in it: the pins went with the engine
        fut.add_done_callback(done)
        if wait:
            try:
                fut.result(ENGINE_CALL_S)
            except (KilnError, TimeoutError):
                pass
        return True

    @property
    def num_open_exports(self) -> int:
        """Exports not released yet (an export being released counts until its blocks are unpinned)."""
        with self._lock:
            return len(self._exports) + len(self._releasing)

    @property
    def num_export_blocks(self) -> int:
        with self._lock:
            return sum(len(e.block_ids) for e in (*self._exports.values(), *self._releasing.values()))

    def _publish_open(self) -> None:
        n, blocks = self.num_open_exports, self.num_export_blocks
        self.metrics.set("kv_exports_open", n)
        self.metrics.set("kv_export_blocks", blocks)

    def _poll(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                with self._agent_lock:
                    notifs = self.agent.get_new_notifs()
            except Exception as exc:  # keep expiring exports even if the agent misbehaves
                self.log.warning(f"llmkiln: NIXL notifications: {exc}")
                notifs = {}
            for messages in notifs.values():
                for raw in messages:
                    what, _, export_id = bytes(raw).decode("ascii", "replace").partition(":")
                    if what in ("release", "failed"):
                        self.release(export_id, "imported" if what == "release" else "failed")
            now = time.monotonic()
            with self._lock:
                old = [e.export_id for e in self._exports.values() if now - e.created > self.export_timeout_s]
            for export_id in old:
                self.release(export_id, "timeout")

    # ------------------------------------------------------------------ decode side
    def pull(self, params: KvHandle, token_ids: Sequence[int]) -> tuple[Reservation, PullStats]:
        """Read an export's blocks into this host's blocks: a reservation to submit with
        (`KvHandoff(kv_import=...)`). TransferFailed when it cannot (the reservation is given back, the peer told)."""
        t0 = time.perf_counter()
        peer_name, export_id, metadata = params.agent, params.export_id, params.metadata
        remote_ids, arrays = list(params.block_ids), list(params.arrays)
        if dict(params.layout) != self.data.layout():
            self._tell(peer_name, metadata, f"failed:{export_id}")
            raise TransferFailed(
                f"the prefill worker's blocks have another layout: {dict(params.layout)} (here {self.data.layout()})"
            )
        if [s for _, s in arrays] != [s for _, s in self._arrays]:
            self._tell(peer_name, metadata, f"failed:{export_id}")
            raise TransferFailed("the prefill worker's blocks have another size")
        try:
            res = self.engine.kv.reserve_import(token_ids, len(remote_ids)).result(ENGINE_CALL_S)
        except KilnError as exc:
            self._tell(peer_name, metadata, f"failed:{export_id}")
            raise TransferFailed(f"no room for the blocks: {exc}") from None
        fill = [i for i in res.fill if i < len(remote_ids)]
        self.metrics.add("kv_pulls_active", 1)
        try:
            nbytes, read_s = self._read(peer_name, metadata, export_id, res, fill, remote_ids, arrays)
        except Exception as exc:
            self.engine.kv.end_import(res, filled=False)
            self._tell(peer_name, metadata, f"failed:{export_id}")
            self._forget_peer(peer_name)
            raise TransferFailed(f"the KV read from {peer_name} failed: {exc}") from None
        finally:
            self.metrics.add("kv_pulls_active", -1)
        seconds = time.perf_counter() - t0
        tokens = len(res.block_ids) * self.tokens_per_block
        stats = PullStats(len(remote_ids), len(fill), nbytes, seconds, tokens, read_s)
        self.metrics.add("kv_imports")
        self.metrics.add("kv_import_blocks", len(fill))
        self.metrics.add("kv_import_bytes", nbytes)
        self.metrics.add("kv_import_seconds", seconds)
        self.metrics.add("kv_import_read_seconds", read_s)
        return res, stats

    def _read(
        self,
        peer_name: str,
        metadata: bytes,
        export_id: str,
        res: Reservation,
        fill: list[int],
        remote_ids: list[int],
        arrays: list[tuple[int, int]],
    ) -> tuple[int, float]:
        peer = self._peer(peer_name, metadata)
        delay = float(os.environ.get(PULL_DELAY_ENV) or 0)
        if delay:
            time.sleep(delay)
        if not fill:  # every block is stored here already: nothing to read, release the export
            self._notify(peer, f"release:{export_id}")
            return 0, 0.0
        local = self.data.spans([res.block_ids[i] for i in fill])
        remote = array_spans(arrays, [remote_ids[i] for i in fill])
        nbytes = sum(n for _, n in local)
        t0 = time.perf_counter()
        with self._agent_lock:
            local_d = self.agent.get_xfer_descs([(a, n, 0) for a, n in local], "DRAM")
            remote_d = self.agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM")
            handle = self.agent.initialize_xfer(
                "READ", local_d, remote_d, peer, f"release:{export_id}".encode("ascii")
            )
            state = self.agent.transfer(handle)
        deadline = time.monotonic() + self.pull_timeout_s
        try:
            while state not in ("DONE", "ERR"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no completion within {self.pull_timeout_s:g} s")
                time.sleep(XFER_POLL_S)
                with self._agent_lock:
                    state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                raise OSError(f"transfer state {state}")
            read_s = time.perf_counter() - t0
        finally:
            with self._agent_lock:
                try:
                    self.agent.release_xfer_handle(handle)
                except Exception:  # a transfer still posted cannot be released: the agent keeps it
                    pass
        return nbytes, read_s

    def _peer(self, name: str, metadata: bytes) -> str:
        with self._agent_lock:
            if self._peers.get(name) != metadata:
                added = self.agent.add_remote_agent(metadata)
                added = added.decode() if isinstance(added, bytes) else str(added)
                if added != name:
                    raise OSError(f"the handle names agent {name!r}, its metadata {added!r}")
                self._peers[name] = metadata
        return name

    def _forget_peer(self, name: str) -> None:
        with self._agent_lock:
            if self._peers.pop(name, None) is not None:
                try:
                    self.agent.remove_remote_agent(name)
                except Exception:
                    pass

    def _notify(self, peer: str, message: str) -> None:
        with self._agent_lock:
            self.agent.send_notif(peer, message.encode("ascii"))

    def _tell(self, name: str, metadata: bytes, message: str) -> None:
        """Best effort: the prefill side expires the export anyway."""
        try:
            self._notify(self._peer(name, metadata), message)
        except Exception as exc:
            self.log.warning(f"llmkiln: could not tell {name} {message!r}: {exc}")

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Release every export, stop the poller, deregister the store. Safe twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        with self._lock:
            open_ids = list(self._exports)
        for export_id in open_ids:
            self.release(export_id, "shutdown", wait=True)
        with self._agent_lock:
            try:
                self.agent.deregister_memory(self._registration)
            except Exception as exc:
                self.log.warning(f"llmkiln: NIXL deregistration: {exc}")
        self.metrics.set("kv_registrations", 0)
