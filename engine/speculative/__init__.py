"""Speculative decoding: drafters propose tokens, one target pass verifies them for the whole batch.

`Speculator` (torch-free) decides after every step how many drafts each decoding sequence gets
next (goodput.py: from measured step costs and acceptance), asks its `Drafter` for them and puts
them on `seq.spec_token_ids`; the scheduler schedules them after the sequence's last token, the
runner's sampler verifies them (engine/sampling/verify.py) and the scheduler keeps the accepted prefix.
Drafters: `NgramDrafter` (prompt lookup, ngram.py) and `DraftModelDrafter` (draft_model.py).
"""
