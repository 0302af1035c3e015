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
from engine.service.handle import EngineState, EngineUnavailable
from engine.service.loading import check_model_file
from engine.service.served_model import LoadedModel, ModelSpec


class Factory:
    """Builds engines over the counting runner; `gate` holds a load until the test opens it."""

    def __init__(self) -> None:
        self.engines = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, spec: ModelSpec) -> LoadedModel:
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
        assert t.state is EngineState.READY and t.model.engine is factory.engines[0] and t.loading is None
        sink: queue.Queue = queue.Queue()
        t.submit_sink([5], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), "r1",
                      factory.engines[0], sink.put)
        assert outputs(sink)[-1].output_token_ids == [6, 7, 8]

        factory.gate.clear()  # hold the next load: the old model is dropped and closed first
        fut = t.load(ModelSpec("b", "b.gguf"))
        assert t.state == "loading" and t.loading.id == "b" and t.model is None
        stale: queue.Queue = queue.Queue()
        t.submit_sink([5], SamplingParams(max_tokens=2), "r2", factory.engines[0], stale.put)
        factory.gate.set()
        assert fut.result(10).spec.id == "b" and factory.engines[0].runner.closed
        assert isinstance(outputs(stale)[-1], EngineUnavailable)  # for a's engine: ask again

        with pytest.raises(FileNotFoundError):  # a failed load: the model that served is loaded again
            t.load(ModelSpec("c", "missing")).result(10)
        assert t.state is EngineState.READY and "loading c failed" in t.message and "b is loaded again" in t.message
        assert factory.engines[1].runner.closed and t.model.spec.id == "b" and t.model.engine is factory.engines[2]

        t.unload().result(10)
        assert t.state is EngineState.UNLOADED and t.message == "no model loaded"
        with pytest.raises(FileNotFoundError):  # with none before it, the failure is the state
            t.load(ModelSpec("c", "missing")).result(10)
        assert t.state is EngineState.ERROR and "loading c failed" in t.message and t.model is None
    finally:
        t.stop()
    assert not t._thread.is_alive()


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
        assert t.state is EngineState.ERROR and "loading bad failed" in t.message
    finally:
        t.stop()
