"""The Runner contract (engine/runner.py): a runner that is neither torch nor llama.cpp drives
LLMEngine unchanged, and the rule for which rows get logits is the scheduler output's alone."""
from __future__ import annotations

from counting_runner import CountingRunner, make_engine
from engine.sampling_params import SamplingParams
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def test_a_third_runner_plugs_in_without_touching_the_step():
    prompts = [[1, 2, 3], [10] * 9, [50, 51]]
    roomy = make_engine()
    outs = roomy.generate(prompts, greedy(6))
    assert [o.output_token_ids for o in outs] == [[4, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16],
                                                  [52, 53, 54, 55, 56, 57]]
    assert outs[0].text == "<4><5><6><7><8><9>" and all(o.finish_reason == "length" for o in outs)
    # A pool of 6 blocks for three sequences that need up to 4 each: preemption by recompute,
    # the runner told of every victim, and the same tokens.
    runner = CountingRunner(num_blocks=6)
    tight = make_engine(runner, max_prefill_chunk=4)
    assert [o.output_token_ids for o in tight.generate(prompts, greedy(6))] == [o.output_token_ids for o in outs]
    assert tight.scheduler.num_preemptions > 0 and len(runner.released) > len(prompts)
    assert tight.block_manager.num_used_blocks == 0
    tight.close()
    assert runner.closed


def test_prompt_logprobs_come_from_the_runner_once_per_position():
    """Scored in chunks of 4, and scored again when a preempted sequence is recomputed (a pool of
    5 blocks for two that need 4 each): still [None, lp(t1|t0), ...], each position once."""
    prompts = [list(range(20, 30)), list(range(40, 50))]
    engine = make_engine(CountingRunner(num_blocks=5), max_prefill_chunk=4)
    outs = engine.generate(prompts, greedy(6, prompt_logprobs=0))  # the first outgrows its blocks
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert out.prompt_logprobs[0] is None
        assert [(lp.token_id, lp.logprob) for lp in out.prompt_logprobs[1:]] == [
            (t, -float(p)) for p, t in enumerate(prompt) if p]


def test_which_rows_get_logits_is_decided_once_in_the_scheduler_output():
    def seq(n_tokens: int, computed: int, scores_prompt: bool = False) -> Sequence:
        s = Sequence(list(range(1, n_tokens + 1)), SamplingParams(prompt_logprobs=0 if scores_prompt else None))
        s.num_computed_tokens = computed
        return s

    decode, chunk, scoring_chunk, scoring_last = seq(9, 8), seq(20, 0), seq(20, 4, True), seq(12, 8, True)
    out = SchedulerOutput([decode, chunk, scoring_chunk, scoring_last], [1, 8, 4, 4], num_decodes=1)
    assert out.is_sampled == [True, False, False, True]
    assert out.num_logits == [1, 0, 4, 4]
    # flattened new tokens: decode 0 | chunk 1-8 | scoring chunk 9-12 | scoring last 13-16
    assert out.logit_rows() == [0, 9, 10, 11, 12, 13, 14, 15, 16]
    assert out.sampled_seqs() == [decode, scoring_last]
    decode.num_computed_tokens += 1  # postprocess moves counters on; the decision stays
    assert out.is_sampled[0] and out.num_logits[0] == 1
