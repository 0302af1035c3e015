"""A request that ended leaves nothing behind: finished, aborted or disconnected, on both backends.

A desktop engine serves for days, so one object kept per request is memory that grows without
end (`ember bench soak` measures the growth; this pins its causes). In-process, on the real
engine thread and the bundled model: after a finished and an aborted request no Sequence,
_Request, RequestOutput or sink (the handler's queue) is reachable from the engine thread, and
nothing keeps the request's Sequence alive at all (a weak reference to it dies). Over real HTTP
(a real `ember serve`): after finished, streamed, aborted-by-disconnect and logprob requests the
server's own heap count (EMBER_DEBUG_HEAP's status field) shows none of them alive. And the
per-step rate meter keeps only its window. Nothing here is timed: a request is long enough to be
left mid-stream by its length, measured on this CPU.
"""
from __future__ import annotations

import gc
import queue
import threading
import types
import weakref

import httpx
import pytest
from server_util import long_max_tokens, start_engine

from engine.config import EngineConfig
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.service.engine_thread import EngineThread
from engine.service.served_model import LoadedModel, ModelSpec
from engine.service.metrics import RateMeter

BACKENDS = ("torch", "llama.cpp")
PER_REQUEST = ("Sequence", "_Request", "RequestOutput", "IncrementalDetokenizer", "StopStringMatcher", "Job",
               "ChatChoice", "TokenLogprobs")


def reachable(root, kinds: tuple[type, ...]) -> list:
    """Objects of `kinds` reachable from `root` through attributes, containers and closures (not
    through classes, modules or a function's globals, which reach the whole program)."""
    seen, stack, found = set(), [root], []
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, str, bytes, int, float)):
            continue
        seen.add(id(o))
        if isinstance(o, kinds):
            found.append(o)
        if isinstance(o, types.FunctionType):
            stack.extend(_contents(c) for c in o.__closure__ or ())
        else:
            stack.extend(gc.get_referents(o))
    return found


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


class Sink:
    """A handler's queue, as serving.Job's sink feeds it; its class is what the walk looks for."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.first = threading.Event()

    def __call__(self, item) -> None:
        if getattr(item, "new_token_ids", None):
            self.first.set()
        self.q.put(item)

    def final(self, timeout: float = 600) -> RequestOutput:
        while True:
            item = self.q.get(timeout=timeout)
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                return item


def live_sequence(request_id: str):
    """A weak reference to the engine's Sequence for `request_id` (while it runs)."""
    seqs = [o for o in gc.get_objects() if type(o) is Sequence and o.request_id == request_id]
    assert len(seqs) == 1, seqs
    return weakref.ref(seqs[0])


@pytest.fixture(scope="module", params=BACKENDS)
def engine_thread(request, bundled_model_path):
    from engine.backends import load_engine

    config = EngineConfig(model_path=str(bundled_model_path), num_threads=1, num_kv_blocks=256, max_model_len=2048)
    engine, decision = load_engine(config, request.param, "cpu")
    spec = ModelSpec("bundled", str(bundled_model_path))
    thread = EngineThread(lambda _spec, **_kw: LoadedModel(spec, engine, decision.backend, decision.device))
    thread.start()
    thread.load(spec).result(timeout=600)
    del engine
    yield thread
    thread.stop()


def _assert_nothing_left(thread: EngineThread, refs: list) -> None:
    # wait for the loop to go idle: its last step has handed every output over
    for _ in range(1000):
        if thread.num_requests == 0 and not thread.model.engine.has_unfinished():
            break
        threading.Event().wait(0.01)
    engine = thread.model.engine
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    found = reachable(thread, (Sequence, RequestOutput, Sink))
    assert not found, f"still reachable from the engine thread: {found[:5]}"
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"Sequences still alive: {alive} (referrers: {[type(x) for x in gc.get_referrers(*alive)]})"


@pytest.mark.slow  # the bundled model
def test_finished_and_aborted_requests_leave_nothing(engine_thread):
    engine = engine_thread.model.engine
    refs = []
    finished, stopped = Sink(), Sink()
    engine_thread.submit_sink(engine.tokenizer.encode("The fox"), SamplingParams(max_tokens=8, seed=1, logprobs=2),
                              "done-1", engine, finished)
    engine_thread.submit_sink(engine.tokenizer.encode("Once upon a time"),
                              SamplingParams(max_tokens=16, stop=["."], temperature=0.8, seed=2), "done-2", engine,
                              stopped)
    assert finished.final().finish_reason == "length"
    assert stopped.final().finish_reason in ("stop", "length")
    # a request aborted while it runs: long enough that it cannot end first (the pool's length)
    long = Sink()
    engine_thread.submit_sink(engine.tokenizer.encode("Tell me a long story."),
                              SamplingParams(max_tokens=1500, ignore_eos=True, seed=3), "abort-1", engine, long)
    assert long.first.wait(600)
    refs.append(live_sequence("abort-1"))
    assert refs[0]() in reachable(engine_thread, (Sequence,))  # the walk does reach a live request
    engine_thread.abort("abort-1")
    assert long.final().finish_reason == "abort"
    del finished, stopped, long
    _assert_nothing_left(engine_thread, refs)
    ours = {"done-1", "done-2", "abort-1"}
    assert not [o for o in gc.get_objects() if type(o) is Sequence and o.request_id in ours]
    if engine_thread.trimmer.enabled:  # idle now: the loop hands glibc's free pages back once
        for _ in range(6000):
            if engine_thread.trimmer.count:
                break
            threading.Event().wait(0.01)
        assert engine_thread.trimmer.count >= 1


# ---- over HTTP: the server process counts its own live objects --------------------------------
@pytest.fixture(scope="module", params=BACKENDS)
def server(request, bundled_model_path, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EMBER_DEBUG_HEAP", "1")  # the child inherits it: /v1/engine/status gains `heap`
    try:
        proc = start_engine(bundled_model_path, tmp_path_factory.mktemp("leaks"), "--max-model-len", "2048",
                            "--num-kv-blocks", "256", backend=request.param)
    finally:
        mp.undo()
    yield proc
    proc.stop()


def _status(proc) -> dict:
    return httpx.get(proc.base_url + "/v1/engine/status", headers=proc.headers, timeout=120).json()


def _aborts(proc) -> float:
    text = httpx.get(proc.base_url + "/metrics", headers=proc.headers, timeout=30).text
    return float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith("ember_request_aborts_total")))


def _settled(proc) -> dict:
    for _ in range(600):
        s = _status(proc)
        if not s["num_requests"] and not s["num_running"] and not s["kv"]["blocks_used"]:
            return s
        threading.Event().wait(0.1)
    return s


@pytest.mark.slow  # a server process per backend
def test_disconnected_and_finished_requests_leave_nothing_in_the_server(server):
    url, h = server.base_url, server.headers
    chat = {"messages": [{"role": "user", "content": "Tell me about the fox."}], "max_tokens": 8}
    r = httpx.post(url + "/v1/chat/completions", headers=h, json={**chat, "logprobs": True, "top_logprobs": 2},
                   timeout=300)
    assert r.status_code == 200
    with httpx.stream("POST", url + "/v1/chat/completions", headers=h, timeout=300,
                      json={**chat, "stream": True, "stop": ["."]}) as r:
        assert r.status_code == 200 and any(ln == "data: [DONE]" for ln in r.iter_lines())
    r = httpx.post(url + "/v1/completions", headers=h, json={"prompt": "The fox", "max_tokens": 8, "logprobs": 2},
                   timeout=300)
    assert r.status_code == 200
    before = _aborts(server)
    n = long_max_tokens(url, server.api_key, seconds=30)
    with httpx.stream("POST", url + "/v1/chat/completions", headers=h, timeout=300,
                      json={**chat, "max_tokens": n, "ignore_eos": True, "stream": True}) as r:
        chunks = 0
        for line in r.iter_lines():  # hang up after a few chunks, while the reply runs on
            chunks += line.startswith("data: ")
            if chunks >= 3:
                break
    s = _settled(server)
    assert _aborts(server) > before, "the hang-up was not seen as a disconnect"
    assert s["num_requests"] == 0 and s["num_running"] == 0 and s["kv"]["blocks_used"] == 0
    live = {k: v for k, v in s["heap"]["objects"].items() if k in PER_REQUEST and v}
    assert not live, f"objects of ended requests still alive in the server: {live}"


def test_the_rate_meter_keeps_only_its_window_when_nobody_reads_it():
    """One event per engine step: a headless server that nobody polls must not keep them all."""
    meter = RateMeter(window=5.0)
    for i in range(100_000):  # 1,000 s of steps, 10 ms apart
        meter.add(1, now=i * 0.01)
    assert len(meter._events) <= 5.0 / 0.01 + 1
    assert meter.rate(now=1000.0) == pytest.approx(100.0, rel=0.01)
