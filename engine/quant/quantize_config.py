"""What `ember quantize` is asked to do, as one typed object checked once: the method, the
checkpoint layout and the calibration (engine/quant/pipeline.py carries it out)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from engine.model_files.quant_config import CheckpointFormat, QuantSpec


class Method(enum.StrEnum):
    RTN = "rtn"
    GPTQ = "gptq"
    AWQ = "awq"


@dataclass(frozen=True)
class QuantizeConfig:
    """Everything `ember quantize` takes, checked once (`check`)."""

    method: Method = Method.GPTQ
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    static_groups: bool = False  # with desc_act: groups fixed in column order, so no permutation at run time
    format: CheckpointFormat = CheckpointFormat.GPTQ
    calibration: Path | None = None  # a UTF-8 text file; None: the standard library's (calibration.py)
    self_calibration: bool = True  # without a file: mix in the model's own replies (self_calibration.py)
    num_samples: int = 32
    seq_len: int = 256
    # GPTQ's dampening as a fraction of mean(diag H) (damp_percent; the paper and AutoGPTQ: 0.01).
    # H + damp I is a ridge on a Hessian estimated from 8k calibration tokens for up to ~5k inputs:
    # the larger it is, the less error GPTQ pushes into the directions its calibration barely saw
    # (damp -> infinity is round-to-nearest). At 0.01 GPTQ lost to RTN on held-out multilingual
    # text; at 0.2 it beats RTN on both texts of `ember bench quant`, on both test models.
    damp: float = 0.2
    # GPTQ: each group's range from the clip search of GPTQ's quant.py (rtn.search_group_params)
    # rather than its min and max; opt-in. `ember bench quant`, out-of-domain corpus ppl, g128 / g32:
    # bundled SmolLM2-135M: RTN 22.73 / 19.70, GPTQ min/max 22.39 / 19.68, with the search 21.84 / 18.62;
    # Qwen2.5-Coder-0.5B: RTN 14.53 / 14.45, min/max 14.32 / 14.25, with the search 14.56 / 14.26 (loses
    # to RTN at g128). The search weighs each weight alike; GPTQ's loss weighs them by the Hessian.
    mse_scales: bool = False
    awq_clip: bool = False  # AWQ's clip search (AutoAWQ's apply_clip): opt-in, see the docstring

    @property
    def spec(self) -> QuantSpec:
        return QuantSpec(self.format, self.bits, self.group_size, self.sym, self.desc_act)

    def check(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"--bits {self.bits}: Ember's kernels take 4 and 8")
        if self.group_size not in (32, 64, 128, -1):
            raise ValueError(f"--group-size {self.group_size}: one of 32, 64, 128, -1")
        if self.format is CheckpointFormat.AWQ and (self.bits != 4 or self.desc_act or self.sym):
            raise ValueError("the AWQ GEMM format holds 4-bit, asymmetric weights without act-order "
                             "(use --asym, no --desc-act, or another --format)")
        if self.desc_act and self.method is not Method.GPTQ:
            raise ValueError("--desc-act is GPTQ's act-order; it has no meaning for RTN or AWQ")
        if self.awq_clip and self.method is not Method.AWQ:
            raise ValueError("--awq-clip is AWQ's clip search; it has no meaning for RTN or GPTQ")
        if self.num_samples < 1 or self.seq_len < 16:
            raise ValueError("calibration needs at least one sample of at least 16 tokens")
