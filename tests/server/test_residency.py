"""Which models stay loaded (engine/service/residency.py, model_set.py), on the engine thread with
the counting runner: held models are never unloaded, the least recently used idle one goes first,
a load that cannot fit waits its turn, and an idle model leaves when its keep-alive runs out."""
from __future__ import annotations

import queue
import time

import pytest

from counting_runner import make_engine
from engine.sampling_params import SamplingParams
from engine.service.engine_thread import EngineThread
from engine.service.model_set import DoesNotFit, QueueFull
from engine.service.residency import Resident, ResidencyConfig, evictions
from engine.service.served_model import LoadedModel, ModelSpec

GB = 1 << 30


class Factory:
    """Engines over the counting runner; a spec's path names its size in GiB ("3" is 3 GiB)."""

    def __init__(self) -> None:
        self.engines: dict[str, object] = {}
        self.caps: dict[str, int | None] = {}

    def __call__(self, spec: ModelSpec, kv_cache_max_bytes: int | None = None) -> LoadedModel:
        self.engines[spec.id], self.caps[spec.id] = make_engine(), kv_cache_max_bytes
        return LoadedModel(spec, self.engines[spec.id], "test", "cpu")


def thread(**cfg) -> tuple[EngineThread, Factory]:
    factory = Factory()
    t = EngineThread(factory, residency=ResidencyConfig(**cfg), estimate=lambda s: int(float(s.path) * GB))
    t.start()
    return t, factory


def spec(mid: str, gib: float = 1) -> ModelSpec:
    return ModelSpec(mid, str(gib))


def wait_until(cond, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < end, "the engine thread never got there"
        time.sleep(0.005)
    return got


def resident_ids(t: EngineThread) -> set[str]:
    return {m.spec.id for m in t.models if m.state == "ready"}


def test_evictions_pick_idle_models_least_recently_used_first():
    cfg = ResidencyConfig(budget_bytes=10 * GB, max_models=3)
    engines = {m: make_engine() for m in "abc"}
    rs = {m: Resident(LoadedModel(spec(m), engines[m], "t", "cpu"), 3 * GB, last_used=i)
          for i, m in enumerate("abc")}
    assert evictions({"a": rs["a"]}, 3 * GB, cfg) == []  # fits
    assert evictions(rs, 3 * GB, cfg) == ["a"]  # 9 + 3 > 10 and 3 models: a, the oldest
    rs["a"].holds = 1  # a request holds a: b goes instead
    assert evictions(rs, 3 * GB, cfg) == ["b"]
    assert evictions(rs, 7 * GB, cfg) == ["b", "c"]
    rs["b"].holds = rs["c"].holds = 1
    assert evictions(rs, 3 * GB, cfg) is None  # every model in the way is busy: wait
    assert cfg.kv_cap_bytes(2 * GB) > 0 and ResidencyConfig(budget_bytes=GB).kv_cap_bytes(2 * GB) == 1


def test_a_model_with_only_background_work_is_idle_and_goes_first():
    """A warm (background work) neither keeps its model loaded nor makes another model's request
    wait: found in the GUI, where a chat opened on a model held it while two replies ran, and a
    third chat waited for memory behind the warm."""
    cfg = ResidencyConfig(budget_bytes=4 * GB, max_models=2)
    engines = {m: make_engine() for m in "ab"}
    rs = {m: Resident(LoadedModel(spec(m), engines[m], "t", "cpu"), 2 * GB, last_used=i) for i, m in enumerate("ab")}
    engines["a"].add_request([5, 6, 7], SamplingParams(max_tokens=1, temperature=0, background=True), request_id="warm")
    assert engines["a"].has_unfinished() and not rs["a"].busy
    assert evictions(rs, 2 * GB, cfg) == ["a"]
    engines["b"].add_request([5], SamplingParams(max_tokens=4, temperature=0), request_id="reply")
    assert rs["b"].busy and evictions(rs, 2 * GB, cfg) == ["a"]
    engines["a"].add_request([5], SamplingParams(max_tokens=4, temperature=0), request_id="reply")
    assert rs["a"].busy and evictions(rs, 2 * GB, cfg) is None  # a request on each: the next waits


def test_a_held_model_is_never_unloaded_and_the_next_waits_its_turn():
    t, factory = thread(budget_bytes=4 * GB, max_models=2)
    try:
        a = t.acquire(spec("a", 3)).result(10)  # held, as a request holds it until its reply ends
        b = t.acquire(spec("b", 3))
        c = t.acquire(spec("c", 3))
        q = wait_until(lambda: t.status.queue if len(t.status.queue) == 2 else None)
        assert [(x.model, x.position) for x in q] == [("b", 1), ("c", 2)] and not b.done()
        sink: queue.Queue = queue.Queue()  # a's request runs on; the waiting loads never cut it
        t.submit_sink([5], SamplingParams(max_tokens=3, ignore_eos=True, temperature=0), "r", a.engine, sink.put)
        assert [sink.get(10).finished for _ in range(3)][-1]
        t.release("a")  # its reply ended: a goes, b comes; c waits for b
        assert b.result(10).spec.id == "b" and not c.done()
        assert factory.engines["a"].runner.closed and resident_ids(t) == {"b"}
        c.cancel()  # a request that stops waiting gives up its place
        t.release("b")
        wait_until(lambda: t.status.queue == ())
        assert resident_ids(t) == {"b"} and "c" not in factory.engines
    finally:
        t.stop()


def test_refusals_in_words_leave_every_model_serving():
    t, factory = thread(budget_bytes=4 * GB, max_models=2, max_queue=1)
    try:
        t.load(spec("a", 1)).result(10)
        with pytest.raises(DoesNotFit, match="more than the whole memory budget"):
            t.acquire(spec("huge", 5)).result(10)
        held = t.acquire(spec("b", 3)).result(10)  # a is idle: b fits beside it (4 GiB)
        assert resident_ids(t) == {"a", "b"} and held.spec.id == "b"
        t.acquire(spec("a", 1)).result(10)  # both held now
        waiting = t.acquire(spec("c", 2))
        with pytest.raises(QueueFull):  # one request waits already: the next is told to come back
            t.acquire(spec("d", 2)).result(10)
        waiting.cancel()
        assert not any(e.runner.closed for e in factory.engines.values())
    finally:
        t.stop()


def test_an_idle_model_leaves_when_its_keep_alive_runs_out():
    t, factory = thread(budget_bytes=8 * GB, keep_alive_s=60.0)
    try:
        t.acquire(spec("a"), keep_alive_s=0.2).result(10)  # a request's own keep_alive wins
        t.load(spec("b")).result(10)  # an explicit load stays until unloaded
        t.release("a")
        wait_until(lambda: resident_ids(t) == {"b"})
        assert factory.engines["a"].runner.closed
        m = next(m for m in t.models if m.spec.id == "b")
        assert m.expires_at is None
        t.acquire(spec("b"), keep_alive_s=0).result(10)
        t.release("b")  # keep_alive 0: unloaded once idle
        wait_until(lambda: not t.models)
        assert factory.caps["b"] and factory.caps["b"] <= 1 << 30  # its KV pool capped at its share
    finally:
        t.stop()


def test_unloading_a_busy_model_waits_for_its_reply():
    t, factory = thread(budget_bytes=8 * GB)
    try:
        a = t.acquire(spec("a")).result(10)
        sink: queue.Queue = queue.Queue()
        t.submit_sink([5], SamplingParams(max_tokens=50, ignore_eos=True, temperature=0), "r", a.engine, sink.put)
        t.unload("a").result(10)
        assert "a" in resident_ids(t) and not factory.engines["a"].runner.closed  # held: it stays
        t.release("a")
        outs = []
        while not (outs and outs[-1].finished):
            outs.append(sink.get(10))
        assert len(outs[-1].output_token_ids) == 50  # the reply was never cut
        wait_until(lambda: not t.models)
        assert factory.engines["a"].runner.closed
    finally:
        t.stop()


def test_busy_models_share_the_engine_thread_by_time():
    from engine.service.model_set import ModelSet

    models = ModelSet(ResidencyConfig(), lambda s: 0, lambda s, cap: None, lambda r, why: None)
    for mid in "ab":
        engine = make_engine()
        engine.add_request([5], SamplingParams(max_tokens=100, ignore_eos=True))
        models.residents[mid] = Resident(LoadedModel(spec(mid), engine, "t", "cpu"), GB, last_used=0)
    a, b = models.residents["a"], models.residents["b"]
    steps = []
    for _ in range(8):  # a's steps cost 1 s, b's 3 s: a gets three steps for each of b's
        r = models.next_to_step()
        steps.append(r.loaded.spec.id)
        r.engine_time += 1.0 if r is a else 3.0
    assert steps.count("a") == 6 and steps.count("b") == 2
    c_engine = make_engine()  # a model busy again after idling gets no burst for its idle past
    models.residents["c"] = c = Resident(LoadedModel(spec("c"), c_engine, "t", "cpu"), GB, last_used=0)
    c_engine.add_request([5], SamplingParams(max_tokens=100, ignore_eos=True))
    assert models.next_to_step() is c and c.engine_time >= 5.0  # level with the others, not 0
