"""The vision projector ("mmproj") GGUF: the second file of a vision model, never a model alone.

llama.cpp's converter writes a vision model as two GGUFs: the language model, and its projector
(general.architecture "clip": an image encoder plus the projection into the LM's embeddings),
which libmtmd loads beside the LM. A projector cannot chat, so a file that is one is refused as a
model in words that say what to do with it, and `--mmproj` must name one.

A pair is checked before anything is copied or loaded: the projector's output width
(`clip.vision.projection_dim`, which llama.cpp's converter writes as the LM's width) must be the
LM's `embedding_length`, else mtmd would refuse it deep inside a load. Projectors that place an
image at fewer positions than tokens (M-RoPE) run for Qwen2-VL and Qwen2.5-VL, whose positions
the llama.cpp runner shifts (engine/backends/llamacpp_vision.py); the other M-RoPE projectors
(Qwen3-VL's deepstack, Qwen2.5-Omni, GLM-4V) are refused as not supported yet, untested here.
"""
from __future__ import annotations

from pathlib import Path

from engine.model_files.errors import ModelFileError
from engine.model_files.gguf_file import GGUFFile, GGUFFormatError
from engine.model_files.meta import read_meta

PROJECTOR_ARCHITECTURE = "clip"  # general.architecture of every mmproj file (vision and audio)
PROJECTOR_REFUSAL = ("a vision projector (an mmproj file), not a model that chats: load the language model "
                     "it belongs to and give this file as its --mmproj")
# clip.projector_type of the M-RoPE projectors the runner does not run yet (llama.cpp's tools/mtmd/clip-impl.h);
# Qwen2-VL's and Qwen2.5-VL's ("qwen2vl_merger", "qwen2.5vl_merger", LM "qwen2vl") it runs
MROPE_PROJECTORS = frozenset({"qwen3vl_merger", "qwen2.5o", "glm4v"})
MROPE_ARCHITECTURES = frozenset({"qwen3vl", "qwen3vlmoe"})  # general.architecture of their LMs
MROPE_LMS = frozenset({"qwen2vl"})  # the M-RoPE LMs whose images run (rope.dimension_sections)
MROPE_REFUSAL = ("uses M-RoPE of a kind not supported yet (Qwen3-VL, Qwen2.5-Omni, GLM-4V; Qwen2-VL and "
                 "Qwen2.5-VL are): images with these models do not run; the language model alone runs for text")


def is_projector(arch: str) -> bool:
    return arch == PROJECTOR_ARCHITECTURE


def mrope_refusal(model_id: str, architecture: str) -> str | None:
    """Why a vision model of this LM architecture cannot be downloaded with its projector (M-RoPE), or None."""
    return f"{model_id} {MROPE_REFUSAL}" if architecture in MROPE_ARCHITECTURES else None


def mrope_refusal_of(mmproj: str | Path) -> str:
    """Why mtmd's M-RoPE projector `mmproj` cannot run here (its type is not one whose positions the
    runner shifts), or "" when it can."""
    kind = _fields(Path(mmproj), "clip.projector_type")[0]
    if kind in ("qwen2vl_merger", "qwen2.5vl_merger"):
        return ""
    return f"{mmproj}: its projector type {kind!r} {MROPE_REFUSAL}"


def _fields(path: Path, *keys: str) -> list:
    try:
        with GGUFFile(path) as header:
            arch = header.get("general.architecture")
            return [header.get(k.format(arch=arch)) for k in keys]
    except (GGUFFormatError, OSError) as e:
        raise ModelFileError(f"{path}: corrupt or truncated GGUF: {e}") from e


def check_projector(path: str | Path, model: str | Path | None = None) -> Path:
    """`path` as a Path when it is a projector GGUF (for the LM `model`, when given: the same
    width, not M-RoPE); else ModelFileError naming it and what is wrong."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFileError(f"--mmproj {path}: no such file")
    arch = read_meta(path).architecture or "?"
    if not is_projector(arch):
        raise ModelFileError(f"--mmproj {path}: a {arch!r} model, not a projector (general.architecture "
                             f"{PROJECTOR_ARCHITECTURE!r}, the mmproj file of a vision model)")
    kind, width = _fields(path, "clip.projector_type", "clip.vision.projection_dim")
    if kind in MROPE_PROJECTORS:
        raise ModelFileError(f"--mmproj {path}: its projector type {kind!r} {MROPE_REFUSAL}")
    if model is None or Path(model).is_dir():
        return path
    lm_arch, lm_width, sections = _fields(Path(model), "general.architecture", "{arch}.embedding_length",
                                          "{arch}.rope.dimension_sections")
    if sections and lm_arch not in MROPE_LMS:
        raise ModelFileError(f"--mmproj {path}: the model {Path(model).name} {MROPE_REFUSAL}")
    if isinstance(width, int) and isinstance(lm_width, int) and width != lm_width:
        raise ModelFileError(f"--mmproj {path}: the projector of another model: it gives {width}-wide embeddings, "
                             f"{Path(model).name} takes {lm_width} (use the mmproj file published with it)")
    return path
