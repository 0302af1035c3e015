"""A draft model reads a sequence's whole prompt before its first draft; it only does so where the
reply has tokens enough left to repay it (engine/speculative/draft_model.py, CATCH_UP_PER_TOKEN),
and the probe that retries a sequence left at k = 0 respects that too. Bundled model, drafting for
itself (every draft it makes is accepted), on Ember's kernels."""
from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.kernel_library import kernels_installed
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculative.draft_model import CATCH_UP_ANY, CATCH_UP_PER_TOKEN
from engine.speculative.speculator import PROBE_EVERY

pytestmark = pytest.mark.skipif(not kernels_installed(), reason="Ember's CPU kernels are not built")


def _proposed(engine: LLMEngine) -> int:
    return engine.stats().spec.num_proposed


def test_a_long_prompt_with_a_short_reply_is_not_caught_up_but_a_short_one_is(bundled_model_path):
    path = str(bundled_model_path)
    engine = LLMEngine(EngineConfig(model_path=path, speculative=f"draft:{path}", num_kv_blocks=256))
    plain = LLMEngine(EngineConfig(model_path=path, num_kv_blocks=256))
    try:
        max_tokens = PROBE_EVERY + 8  # long enough for a probe, were probes to ignore the rule
        text = " ".join(f"item {i} costs {i * 7 % 13} coins;" for i in range(400))
        ids = engine.tokenizer.encode(text)[: max(CATCH_UP_PER_TOKEN * max_tokens, CATCH_UP_ANY) + 64]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        long_reply = engine.generate([ids], params)[0].output_token_ids
        assert _proposed(engine) == 0
        assert long_reply == plain.generate([ids], params)[0].output_token_ids
        short = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. The quick")
        engine.generate([short], params)
        assert _proposed(engine) > 0
    finally:
        engine.close()
        plain.close()
