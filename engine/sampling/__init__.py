"""The runners' output stage: from a step's logits rows to tokens.

`StepSampler` (step_sampler.py) is where every logits-producing runner ends its step: it applies
the constraints (constrained.py: logit_bias, grammar masks), draws through the batched `Sampler`
(sampler.py) and verifies drafts (verify.py: the maths of speculative sampling).
"""
