"""Prefill/decode separation under the real Dynamo frontend (stories260K, real NIXL agents between the worker
processes): the decode tier's greedy outputs equal the aggregated worker's, the imported prompt tokens are
reported as cached, the router keeps sending a prompt's prefill to the prefill worker holding it, and faults
leave nothing pinned — a decode worker killed mid-transfer, a prefill worker killed before its KV was read (the
decode worker prefills the prompt itself and counts the fallback). Conditional disaggregation: a prompt whose
uncached part is at most --max-local-prefill-tokens skips the prefill worker's engine and is prefilled on the
decode worker (same output, counted apart from fallbacks)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import openai
import pytest

from llmkiln.host.kv_transfer import PULL_DELAY_ENV
from llmkiln.host.kv_transfer_options import KvTransferOptions

from .conftest import MODEL, client

pytestmark = pytest.mark.slow
pytest.importorskip("nixl_cu12")

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. "
PROMPTS = [
    "Hi",  # shorter than a block: nothing to move
    STORY,
    STORY * 3 + "One day",
    "Tom had a red ball. " * 20,
]


def wait_until(what, timeout_s: float = 60.0, every_s: float = 0.05):
    """Poll `what()` until it is truthy (a bound on waiting, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def complete(launcher, prompt: str, max_tokens: int = 24):
    r = client(launcher).completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return r.choices[0].text, r.usage


@pytest.fixture(scope="module")
def aggregated(launch, stories_engine):
    return launch(stories_engine, workers=1)


@pytest.fixture(scope="module")
def expected(aggregated) -> dict[str, str]:
    return {p: complete(aggregated, p)[0] for p in PROMPTS}


@pytest.fixture(scope="module")
def pd(launch, stories_engine):
    """Two prefill workers (0, 1) and one decode worker (2); every prompt through the prefill tier (no local
    prefills: these tests are about the transfer)."""
    return launch(
        stories_engine, prefill_workers=2, decode_workers=1, kv=KvTransferOptions(max_local_prefill_tokens=0)
    )


def test_roles_and_registration(pd):
    assert [pd.spec.worker_role(i) for i in range(3)] == ["prefill", "prefill", "decode"]
    for i in range(3):
        assert pd.worker_metrics(i)["kv_transfer_registrations"] == 1  # fp32: one array, registered once
    assert "--role prefill" in " ".join(pd.workers[0].command)  # Dynamo's mode is set through WorkerConfig


def test_greedy_outputs_equal_aggregated_and_imported_tokens_are_cached(pd, expected):
    for prompt in PROMPTS:
        text, usage = complete(pd, prompt)
        assert text == expected[prompt], prompt
        cached = usage.prompt_tokens_details.cached_tokens
        whole = (usage.prompt_tokens - 1) // 16 * 16  # the blocks a prefill can hand over
        assert cached >= whole, (prompt, usage)
    # chat goes the same way
    chat = client(pd).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": STORY * 2}], max_tokens=16, temperature=0
    )
    assert chat.usage.prompt_tokens_details.cached_tokens >= 16
    decode = pd.worker_metrics(2)
    assert decode["kv_transfer_imports_total"] >= len(PROMPTS)  # every prompt with a whole block, plus chat
    assert decode["kv_transfer_import_bytes_total"] > 0
    assert decode["kv_transfer_fallbacks_total"] == 0
    for i in (0, 1):  # every export was released by the decode worker's READ
        wait_until(lambda i=i: pd.worker_metrics(i)["kv_transfer_exports_open"] == 0, 10)
        m = pd.worker_metrics(i)
        assert m["kv_transfer_export_blocks"] == 0 and m["kv_blocks_pinned"] == 0
        assert m["kv_transfer_exports_expired_total"] == 0
    assert decode["kv_blocks_pinned"] == 0


def test_prefills_are_routed_by_kv_overlap(pd):
    prompts = [f"{head} went to the sea to find a big shell. " * 8 for head in ("Ben", "Sue")]
    before = [pd.worker_metrics(i)["prefix_cache_hit_tokens_total"] for i in (0, 1)]
    rounds = 3
    usages = []
    for _ in range(rounds):
        for p in prompts:
            usages.append(complete(pd, p, max_tokens=4)[1])
    after = [pd.worker_metrics(i)["prefix_cache_hit_tokens_total"] for i in (0, 1)]
    hits = sum(a - b for a, b in zip(after, before, strict=True))
    # after its first prefill, each prompt's prefills go to the prefill worker that holds it: whole hits
    whole = sum((u.prompt_tokens - 1) // 16 * 16 for u in usages[len(prompts) :])
    assert hits >= whole


@pytest.fixture(scope="module")
def faulty_pd(launch, stories_engine):
    """One prefill (0) and one decode worker (1); every pull pauses 3 s after connecting (a window to kill a
    side in), exports expire after 2 s, no migration (the test sees the request's fate)."""
    return launch(
        stories_engine,
        prefill_workers=1,
        decode_workers=1,
        kv=KvTransferOptions(export_timeout_s=2.0, max_local_prefill_tokens=0),
        migration_limit=0,
        extra_env={PULL_DELAY_ENV: "3"},
    )


def _in_background(launcher, prompt: str) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = complete(launcher, prompt)
        except openai.APIError as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_client_leaving_mid_transfer_leaves_nothing_pinned(faulty_pd):
    """The client gives up while the decode worker pulls (a 3 s pause): the pull's reservation is given back
    on the decode worker, the export released on the prefill worker (the READ's notification or its timeout)."""
    impatient = openai.OpenAI(base_url=faulty_pd.url, api_key="unused", max_retries=0, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model=MODEL, prompt=STORY * 2 + "Then", max_tokens=8)
    for i in (0, 1):
        wait_until(lambda i=i: faulty_pd.worker_metrics(i)["kv_blocks_pinned"] == 0, 20)
    wait_until(lambda: faulty_pd.worker_metrics(0)["kv_transfer_exports_open"] == 0, 20)
    wait_until(lambda: faulty_pd.worker_metrics(1)["kv_transfer_pulls_active"] == 0, 20)
    assert faulty_pd.worker_metrics(1)["kv_blocks_pinned"] == 0


def test_decode_killed_mid_transfer_leaves_nothing_pinned(faulty_pd):
    t, _ = _in_background(faulty_pd, STORY * 2)
    wait_until(lambda: faulty_pd.worker_metrics(1)["kv_transfer_pulls_active"] == 1)
    assert faulty_pd.worker_metrics(0)["kv_transfer_exports_open"] == 1
    assert faulty_pd.worker_metrics(0)["kv_transfer_export_blocks"] > 0
    faulty_pd.workers[1].signal(signal.SIGKILL)  # the decode worker, inside its pull
    wait_until(lambda: not faulty_pd.workers[1].alive(), 10)
    wait_until(lambda: faulty_pd.worker_metrics(0)["kv_transfer_exports_open"] == 0, 20)
    m = faulty_pd.worker_metrics(0)
    assert m["kv_transfer_export_blocks"] == 0 and m["kv_blocks_pinned"] == 0
    assert m["kv_transfer_exports_expired_total"] >= 1
    t.join(60)
    before = decode_instances(faulty_pd)
    faulty_pd.supervise_once()  # restart the decode worker for the next test
    faulty_pd.wait_ready(180)
    # the frontend drops the killed instance from discovery a few seconds later: wait for only the new one
    wait_until(lambda: len(now := decode_instances(faulty_pd)) == 1 and not now & before, 60)


def decode_instances(launcher) -> set:
    """Instance ids of the decode tier's generate endpoint (component backend) in the frontend's /health."""
    health = json.loads(
        urllib.request.urlopen(launcher.url.removesuffix("/v1") + "/health", timeout=5).read()
    )
    return {
        str(i.get("instance_id"))
        for i in health.get("instances", [])
        if i.get("endpoint") == "generate" and i.get("component") == "backend"
    }


def test_prefill_killed_before_the_read_falls_back_to_local_prefill(faulty_pd, expected):
    prompt = PROMPTS[2]
    t, out = _in_background(faulty_pd, prompt)
    wait_until(lambda: faulty_pd.worker_metrics(1)["kv_transfer_pulls_active"] == 1)  # the prefill is over
    faulty_pd.workers[0].signal(signal.SIGKILL)  # the prefill worker, while the decode worker connects
    t.join(90)
    assert "result" in out, out
    text, usage = out["result"]
    assert text == expected[prompt]
    # prefilled on the decode worker: nothing imported; at most a slot-resident start shared with an earlier
    # prompt (BOS + a few words, less than one block) is reused
    assert usage.prompt_tokens_details.cached_tokens < 16
    m = faulty_pd.worker_metrics(1)
    assert m["kv_transfer_fallbacks_total"] == 1 and m["kv_transfer_imports_total"] == 0
    assert m["kv_blocks_pinned"] == 0


LOCAL_LIMIT = 64  # between PROMPTS[1] (31 tokens) and PROMPTS[2]


@pytest.fixture(scope="module")
def cond_pd(launch, stories_engine):
    """One prefill (0) and one decode worker (1); prompts with at most LOCAL_LIMIT uncached tokens skip the prefill
    tier. With --decode-first (the decode worker on every core, the prefill compute at idle priority): the same
    outputs are expected of it."""
    return launch(
        stories_engine,
        prefill_workers=1,
        decode_workers=1,
        kv=KvTransferOptions(max_local_prefill_tokens=LOCAL_LIMIT),
        decode_first=True,
    )


def _thread_policies(pid: int) -> list[int]:
    import os

    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.append(os.sched_getscheduler(int(tid)))
        except OSError:  # a thread that ended meanwhile
            pass
    return out


def _counts(launcher) -> dict[str, float]:
    pre, dec = launcher.worker_metrics(0), launcher.worker_metrics(1)
    return {
        "pre_prompt_tokens": pre["prompt_tokens_total"],
        "handoffs": pre["kv_transfer_local_handoffs_total"],
        "exports": pre["kv_transfer_exports_total"],
        "local": dec["kv_transfer_local_prefills_total"],
        "local_tokens": dec["kv_transfer_local_prefill_tokens_total"],
        "imports": dec["kv_transfer_imports_total"],
        "fallbacks": dec["kv_transfer_fallbacks_total"],
    }


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def test_short_prompts_skip_the_prefill_tier(cond_pd, expected):
    """A short prompt never reaches the prefill worker's engine (its prompt tokens do not move, nothing is
    exported); the decode worker prefills it — output identical to the aggregated worker's — and counts it as a
    local prefill, not as a fallback."""
    for prompt in PROMPTS[:2]:
        before = _counts(cond_pd)
        text, usage = complete(cond_pd, prompt)
        assert text == expected[prompt], prompt
        assert usage.prompt_tokens <= LOCAL_LIMIT
        d = _delta(_counts(cond_pd), before)
        assert d["pre_prompt_tokens"] == 0 and d["exports"] == 0 and d["handoffs"] == 1, (prompt, d)
        assert d["local"] == 1 and d["imports"] == 0 and d["fallbacks"] == 0, (prompt, d)
        computed = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
        assert d["local_tokens"] == computed > 0
    # streamed and chat requests take the same way
    before = _counts(cond_pd)
    stream = client(cond_pd).completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected[PROMPTS[1]]
    chat = client(cond_pd).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.prompt_tokens <= LOCAL_LIMIT
    d = _delta(_counts(cond_pd), before)
    assert d["handoffs"] == 2 and d["local"] == 2 and d["pre_prompt_tokens"] == 0 and d["fallbacks"] == 0


def test_long_prompts_go_through_the_prefill_tier_and_cached_repeats_skip_it(cond_pd, expected):
    """A prompt longer than the limit is prefilled on the prefill worker and its KV moved; a repeat (its uncached
    part on the prefill worker is now a partial block) is handed back, and the decode worker serves its prefix
    from the blocks it imported the first time."""
    prompt = PROMPTS[3]
    before = _counts(cond_pd)
    text, usage = complete(cond_pd, prompt)
    assert text == expected[prompt] and usage.prompt_tokens > LOCAL_LIMIT
    d = _delta(_counts(cond_pd), before)
    assert d["imports"] == 1 and d["exports"] == 1 and d["handoffs"] == 0 and d["local"] == 0, d
    whole = (usage.prompt_tokens - 1) // 16 * 16
    assert usage.prompt_tokens_details.cached_tokens >= whole
    before = _counts(cond_pd)
    text, usage = complete(cond_pd, prompt)
    assert text == expected[prompt]
    d = _delta(_counts(cond_pd), before)
    assert d["handoffs"] == 1 and d["local"] == 1 and d["imports"] == 0 and d["fallbacks"] == 0, d
    assert usage.prompt_tokens_details.cached_tokens >= whole  # the decode worker's own store
    assert d["local_tokens"] <= LOCAL_LIMIT
    wait_until(lambda: cond_pd.worker_metrics(0)["kv_transfer_exports_open"] == 0, 10)
    assert (
        cond_pd.worker_metrics(0)["kv_blocks_pinned"] == 0
        and cond_pd.worker_metrics(1)["kv_blocks_pinned"] == 0
    )


def test_decode_first_runs_the_prefill_compute_at_idle_priority(cond_pd, expected):
    """--decode-first: exactly one thread of the prefill worker (its engine's scheduler thread) runs SCHED_IDLE,
    none of the decode worker's; the decode worker got every core; outputs through both tiers are unchanged."""
    import os

    from llmkiln.dynamo.cluster import available_cores

    assert _thread_policies(cond_pd.workers[0].pid).count(os.SCHED_IDLE) == 1
    assert os.SCHED_IDLE not in _thread_policies(cond_pd.workers[1].pid)
    cmd = cond_pd.workers[1].command
    assert cmd[cmd.index("--threads") + 1] == str(available_cores()) and "--no-spin" in cmd
    for prompt in (PROMPTS[1], PROMPTS[2]):  # one prefilled locally, one through the prefill tier
        assert complete(cond_pd, prompt)[0] == expected[prompt]


class Load:
    """Clients sending short completions in a loop through the launch, each answer's status recorded, with the
    launcher supervised as serve_forever does (every 0.5 s)."""

    def __init__(self, launcher, clients: int = 3, max_tokens: int = 8) -> None:
        self.launcher = launcher
        self.max_tokens = max_tokens
        self.done = threading.Event()
        self.supervised = threading.Event()
        self.results: list[tuple[int, str | None, float]] = []  # status, Retry-After, seconds
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._supervise)]
        self.threads += [threading.Thread(target=self._load, args=(i,)) for i in range(clients)]

    def _supervise(self) -> None:
        while not self.supervised.wait(0.5):
            self.launcher.supervise_once()

    def _load(self, i: int) -> None:
        import requests

        n = 0
        while not self.done.is_set():
            n += 1
            body = {"model": MODEL, "prompt": f"{STORY} {i} {n}", "max_tokens": self.max_tokens}
            t0 = time.monotonic()
            r = requests.post(f"{self.launcher.url}/completions", json=body, timeout=120)
            with self.lock:
                self.results.append((r.status_code, r.headers.get("Retry-After"), time.monotonic() - t0))

    def ok(self) -> int:
        return sum(1 for s, _, _ in self.results if s == 200)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # the clients first, supervision last: a process the supervising thread restarted dies with that thread
        # (reaper.die_with_parent), and a request still in flight needs it
        self.done.set()
        for t in self.threads[1:]:
            t.join(130)
        self.supervised.set()
        self.threads[0].join(30)


def _prefill_index(launcher) -> int:
    return next(i for i in range(launcher.spec.workers) if launcher.spec.worker_role(i) == "prefill")


def _decode_fallbacks(launcher) -> float:
    dec = next(i for i in range(launcher.spec.workers) if launcher.spec.worker_role(i) == "decode")
    return launcher.worker_metrics(dec).get("kv_transfer_fallbacks_total", 0.0)


def _lose_the_prefill_tier(launch, stories_engine, how: signal.Signals) -> None:
    """The only prefill worker killed (SIGKILL) or hung (SIGSTOP) under load: the launcher activates the prefill
    stand-in, the decode worker prefills every prompt itself (counted as fallbacks), no request gets an error
    or a 503 (the front holds the few that meet the gap), the restarted prefill worker takes the tier back and
    the stand-in stops."""
    from dataclasses import replace

    launcher = launch(stories_engine, prefill_workers=1, decode_workers=1,
                      kv=KvTransferOptions(max_local_prefill_tokens=0))  # fmt: skip
    launcher.spec = replace(launcher.spec, stall_timeout_s=3.0)
    assert launcher.standin is not None and launcher.standin.alive()  # ready, not registered
    with Load(launcher) as load:
        wait_until(lambda: load.ok() >= 6, timeout_s=120)
        proc = launcher.workers[_prefill_index(launcher)]
        assert proc.pid is not None
        before = _decode_fallbacks(launcher)
        lost = time.monotonic()
        os.killpg(proc.pid, how)
        wait_until(lambda: launcher.standin_active_since is not None, timeout_s=60)
        covered_after = launcher.standin_active_since - lost
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=60)  # served while the tier is down
        wait_until(lambda: proc.restarts == 1 and proc.alive(), timeout_s=60)
        wait_until(lambda: launcher.standin_active_since is None, timeout_s=180)  # the tier is back
        back = time.monotonic() - lost
        assert _decode_fallbacks(launcher) > before  # counted on /metrics
        ok = load.ok()
        wait_until(
            lambda: load.ok() >= ok + 3, timeout_s=120
        )  # (one in flight as the stand-in left may count)
        fell_back = _decode_fallbacks(launcher)
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=120)
        assert _decode_fallbacks(launcher) == fell_back  # the restarted prefill worker prefills again
        # the fresh stand-in waits again, unregistered (checked before the supervising thread ends: the stand-in
        # it started dies with it, by the parent-death signal)
        assert launcher.standin is not None and launcher.standin.alive()
        registered = launcher._registered("prefill")
        assert registered is not None and len(registered) == 1
    statuses = [s for s, _, _ in load.results]
    assert all(s == 200 for s in statuses), [r for r in load.results if r[0] != 200]
    assert any("the prefill stand-in hands every prompt" in m for m in launcher.tier_log), launcher.tier_log
    assert any("the prefill stand-in left" in m for m in launcher.tier_log), launcher.tier_log
    print(f"{how.name}: stand-in active {covered_after:.2f} s after the loss, the tier back after {back:.1f} s; "
          f"{len(statuses)} requests, slowest {max(t for _, _, t in load.results):.2f} s")  # fmt: skip


def test_a_killed_prefill_worker_falls_back_to_prefill_on_the_decode_worker(launch, stories_engine):
    _lose_the_prefill_tier(launch, stories_engine, signal.SIGKILL)


def test_a_hung_prefill_worker_falls_back_to_prefill_on_the_decode_worker(launch, stories_engine):
    _lose_the_prefill_tier(launch, stories_engine, signal.SIGSTOP)


def test_a_killed_decode_worker_costs_no_request_a_500(launch, stories_engine):
    """kill -9 of the only decode worker under load: no worker of the decode tier exists until it restarts, so
    requests in the gap get 503 + Retry-After (or succeed after the front's retry), never 500; the restarted
    worker serves again."""
    launcher = launch(stories_engine, prefill_workers=1, decode_workers=1,
                      kv=KvTransferOptions(max_local_prefill_tokens=0))  # fmt: skip
    with Load(launcher) as load:
        wait_until(lambda: load.ok() >= 6, timeout_s=120)
        dec = next(i for i in range(launcher.spec.workers) if launcher.spec.worker_role(i) == "decode")
        proc = launcher.workers[dec]
        assert proc.pid is not None
        os.killpg(proc.pid, signal.SIGKILL)
        wait_until(lambda: proc.restarts == 1 and proc.alive(), timeout_s=60)
        wait_until(lambda: launcher.ready_instances() == 2, timeout_s=180)
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=120)  # serves again
    assert launcher.standin_active_since is None  # the prefill tier was never down
    odd = [r for r in load.results if not (r[0] == 200 or (r[0] == 503 and r[1] == "1"))]
    assert not odd, odd


def test_a_killed_decode_worker_of_two_costs_no_request(launch, stories_engine):
    """kill -9 of one of two decode workers under load (4 clients, 48-token answers: requests are decoding on it):
    its streams move to the other decode worker (Dynamo's migration, --migration-limit) or are sent again by the
    front; every request is a 200, and the restarted worker serves again."""
    launcher = launch(stories_engine, prefill_workers=1, decode_workers=2,
                      kv=KvTransferOptions(max_local_prefill_tokens=0))  # fmt: skip
    with Load(launcher, clients=4, max_tokens=48) as load:
        wait_until(lambda: load.ok() >= 8, timeout_s=120)
        dec = next(i for i in range(launcher.spec.workers) if launcher.spec.worker_role(i) == "decode")
        proc = launcher.workers[dec]
        assert proc.pid is not None
        wait_until(lambda: launcher.worker_metrics(dec).get("requests_active", 0.0) >= 1, timeout_s=60)
        os.killpg(proc.pid, signal.SIGKILL)  # with requests decoding on it
        wait_until(lambda: proc.restarts == 1 and proc.alive(), timeout_s=60)
        wait_until(lambda: launcher.ready_instances() == 3, timeout_s=180)
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 8, timeout_s=120)
    assert all(r[0] == 200 for r in load.results), [r for r in load.results if r[0] != 200]


def test_a_hung_stand_in_is_killed_and_replaced(launch, stories_engine):
    """Liveness of the stand-in itself: the prefill worker SIGKILLed and its restart held (SIGSTOP before it
    registers), so the stand-in covers; then the stand-in is stopped too. Past serve.stall_timeout_s the launcher
    kills it and activates a fresh one; requests go on (200, or 503 + Retry-After while none can take them — never
    a 500); once the prefill worker runs again (SIGCONT) it takes the tier back."""
    from dataclasses import replace

    launcher = launch(stories_engine, prefill_workers=1, decode_workers=1,
                      kv=KvTransferOptions(max_local_prefill_tokens=0))  # fmt: skip
    launcher.spec = replace(launcher.spec, stall_timeout_s=3.0)
    with Load(launcher) as load:
        wait_until(lambda: load.ok() >= 6, timeout_s=120)
        proc = launcher.workers[_prefill_index(launcher)]
        assert proc.pid is not None
        os.killpg(proc.pid, signal.SIGKILL)
        wait_until(lambda: proc.restarts == 1 and proc.alive(), timeout_s=60)
        assert proc.pid is not None
        os.killpg(proc.pid, signal.SIGSTOP)  # the restarted worker never registers while stopped
        wait_until(lambda: launcher.standin_active_since is not None, timeout_s=60)
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=60)  # covered
        first = launcher.standin
        assert first is not None and first.pid is not None
        wait_until(lambda: launcher._standin_live is not None, timeout_s=30)  # its status port answered once
        os.killpg(first.pid, signal.SIGSTOP)
        wait_until(lambda: launcher.standin is not first and launcher.standin_active_since is not None, 60)
        assert any("the prefill stand-in is stuck" in m for m in launcher.tier_log), launcher.tier_log
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=60)  # covered by the fresh stand-in
        os.killpg(proc.pid, signal.SIGCONT)
        wait_until(lambda: launcher.standin_active_since is None, timeout_s=120)  # the worker took it back
        ok = load.ok()
        wait_until(lambda: load.ok() >= ok + 6, timeout_s=60)
    odd = [r for r in load.results if not (r[0] == 200 or (r[0] == 503 and r[1] == "1"))]
    assert not odd, odd
    print(f"{len(load.results)} requests, {sum(1 for r in load.results if r[0] == 503)} × 503, slowest "
          f"{max(t for _, _, t in load.results):.2f} s; {launcher.tier_log}")  # fmt: skip
