"""EngineThread: typed commands in, one status written by the engine thread alone, and a model it
drops is closed at once (its runner's memory freed, not left to the garbage collector)."""
from __future__ import annotations

import json
import queue
import threading

import pytest

from counting_runner import make_engine
from engine.sampling_params import SamplingParams
from engine.model_files.errors import ModelFileError
from engine.service.engine_thread import EngineThread
from engine.service.handle import EngineState
from engine.service.loading import check_model_file
from engine.service.served_model import LoadedModel, ModelSpec


class Factory:
    """Builds engines over the counting runner; `gate` holds a load until the test opens it."""

    def __init__(self) -> None:
        self.engines = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, spec: ModelSpec, **_kw) -> LoadedModel:
        self.gate.wait(10)
        if spec.path == "missing":
            raise FileNotFoundError("no such model file")
        self.engines.append(make_engine())
        return LoadedModel(spec, self.engines[-1], "test", "cpu", {"reason": "a test"})


def outputs(sink: queue.Queue) -> list:
    got = []
    while not (got and (isinstance(got[-1], Exception) or got[-1].finished)):
        got.append(sink.get(timeout=10))
    return got


def test_status_commands_and_close_on_drop():
    factory = Factory()
    t = EngineThread(factory)
    assert t.state is EngineState.UNLOADED and json.dumps(t.state) == '"unloaded"'
    fut = t.load(ModelSpec("a", "a.gguf"))
    # posted, not yet taken (the thread is not even running): reads as loading at once
    assert t.state == "loading" and t.loading.id == "a" and t.model is None
    t.start()
    try:
        assert fut.result(10).spec.id == "a"
        wait_for(lambda: t.state is EngineState.READY)
        assert t.model.engine is factory.engines[0] and t.loading is None
        sink: queue.Queue = queue.Queue()
        t.submit_sink([5], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), "r1",
                      factory.engines[0], sink.put)
        assert outputs(sink)[-1].output_token_ids == [6, 7, 8]

        # a second model loads beside the first: nothing is dropped for it
        assert t.load(ModelSpec("b", "b.gguf")).result(10).spec.id == "b"
        wait_for(lambda: len(t.models) == 2)
        assert not factory.engines[0].runner.closed and {m.spec.id for m in t.models} == {"a", "b"}

        with pytest.raises(FileNotFoundError):  # a failed load: both models serve on
            t.load(ModelSpec("c", "missing")).result(10)
        wait_for(lambda: "loading c failed" in t.message)
        assert t.state is EngineState.READY and t.message.endswith("are still loaded")
        assert len(factory.engines) == 2 and not any(e.runner.closed for e in factory.engines)

        t.unload("a").result(10)  # one model, by id: the other stays
        wait_for(lambda: len(t.models) == 1)
        assert factory.engines[0].runner.closed and t.model.spec.id == "b"
        t.unload().result(10)  # none named: all of them
        wait_for(lambda: t.state is EngineState.UNLOADED)
        assert factory.engines[1].runner.closed
        with pytest.raises(FileNotFoundError):  # with none loaded, the failure is the state
            t.load(ModelSpec("c", "missing")).result(10)
        wait_for(lambda: t.state is EngineState.ERROR)
        assert "loading c failed" in t.message and t.model is None
    finally:
        t.stop()
    assert not t._thread.is_alive()


def wait_for(cond, timeout: float = 10.0) -> None:
    """The status is published by the loop after each command: wait for it (no timing asserted)."""
    import time
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the engine thread never got there"
        time.sleep(0.01)


def test_a_damaged_file_is_refused_before_the_serving_model_is_dropped(tiny_model_factory, tmp_path):
    good = tiny_model_factory()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    factory = Factory()
    t = EngineThread(factory, check=check_model_file)
    t.start()
    try:
        t.load(ModelSpec("good", str(good))).result(10)
        with pytest.raises(ModelFileError, match="truncated"):
            t.load(ModelSpec("bad", str(bad))).result(10)
        # never unloaded: the same engine serves throughout, and the status says so
        wait_for(lambda: "loading bad failed" in t.message)
        assert t.state is EngineState.READY and t.model.spec.id == "good" and len(factory.engines) == 1
        assert not factory.engines[0].runner.closed
        assert "loading bad failed" in t.message and t.message.endswith("good is still loaded")
        sink: queue.Queue = queue.Queue()
        t.submit_sink([5], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), "r",
                      factory.engines[0], sink.put)
        assert outputs(sink)[-1].output_token_ids == [6, 7]

        t.unload().result(10)
        with pytest.raises(ModelFileError):  # with none loaded, the refusal is the state
            t.load(ModelSpec("bad", str(bad))).result(10)
        wait_for(lambda: t.state is EngineState.ERROR)
        assert t.state is EngineState.ERROR and "loading bad failed" in t.message
    finally:
        t.stop()
