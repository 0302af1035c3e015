"""The question sets of `ember bench rag`: documents written into a folder, and queries that each
name the one file that answers them.

- `pydoc`: Python's own reference, as it ships with every CPython (`pydoc_data.topics`: the ~80
  help topics of `help("assert")`, each a section of the language reference). Each topic is one
  document. Its question is built mechanically, not written by a person: a sentence from the middle
  of the topic's prose (grammar rules and indented code left out) that occurs in no other topic,
  reduced to its key words (stop words dropped, at most KEY_WORDS words, in their order). So a query
  reads like "convenient way insert debugging assertions program": the words of one passage, not a
  paraphrase; both BM25 and the embedder see the same words.
- `pydoc-asked`: the same topics asked as a person asks, written by one: 30 questions in their own
  words ("How do I leave a loop before it has gone through every item?" for `break`), where the
  embedder's sense of meaning has to find what BM25's words alone may not.
- `kit`: tests/docs_kit.py in a source checkout: five questions a person wrote, with facts no model
  knows, in PDF, DOCX, PPTX, Markdown and code files beside distractors on nearby topics.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

KEY_WORDS = 8
KIT = Path(__file__).resolve().parents[2] / "tests" / "docs_kit.py"
STOP = frozenset("""a about above after again against all also an and any are as at be because been before being
below between both but by can could did do does doing done down during each either else even every few for from
further had has have having he her here hers him his how however i if in into is it its itself just let may might
more most must my no nor not now of off on once one only or other our out over own same shall she should so some
such than that the their them then there these they this those through thus to too under until up upon us use used
uses using very was we were what when where whether which while who whom why will with within without would yet you
your""".split())
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Question:
    text: str
    filename: str  # the file that answers it


@dataclass(frozen=True)
class RagSet:
    name: str
    folder: Path
    questions: list[Question]


def prose_sentences(text: str) -> list[str]:
    """The topic's sentences of running text: no title underlines, grammar rules or indented code."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if not lines or lines[0].startswith((" ", "\t")) or any(set(x.strip()) <= set("*=-") for x in lines):
            continue
        flat = " ".join(x.strip() for x in lines)
        if "::=" in flat or ">>>" in flat:
            continue
        out += [s for s in _SENTENCE.split(flat) if 8 <= len(s.split()) <= 40]
    return out


def key_words(sentence: str, n: int = KEY_WORDS) -> str:
    words = [w.lower() for w in _WORD.findall(sentence)]
    return " ".join(list(dict.fromkeys(w for w in words if w not in STOP and len(w) > 2))[:n])


def pydoc_set(folder: Path, limit: int | None = None) -> RagSet:
    """The topics (all, or the `limit` shortest: a quick run) as files, and one question per topic
    that has a sentence of its own."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(topics) if limit is None else sorted(sorted(topics, key=lambda k: len(topics[k]))[:limit])
    flat = {k: " ".join(v.split()) for k, v in topics.items()}
    questions = []
    for name in names:
        (folder / f"{name}.txt").write_text(topics[name], encoding="utf-8")
        cands = prose_sentences(topics[name])
        mid = len(cands) // 2
        for s in sorted(cands, key=lambda c: abs(cands.index(c) - mid)):  # the middle one first, then outward
            if not any(s in flat[k] for k in flat if k != name) and len(key_words(s).split()) >= 4:
                questions.append(Question(key_words(s), f"{name}.txt"))
                break
    return RagSet("pydoc", folder, questions)


ASKED = [  # (question, the topic that answers it)
    ("How can I add a debugging check that stops the program when a condition does not hold?", "assert"),
    ("How do I leave a loop before it has gone through every item?", "break"),
    ("How do I skip the rest of this pass through a loop and go on with the next one?", "continue"),
    ("How do I remove a variable's name binding or delete an item from a container?", "del"),
    ("How can a function rebind a variable that lives at module level?", "global"),
    ("How can an inner function rebind a variable of the function around it?", "nonlocal"),
    ("How do I write a small anonymous function inside an expression?", "lambda"),
    ("Which statement does nothing at all, for places where syntax needs one?", "pass"),
    ("How do I signal an error from my own code?", "raise"),
    ("How does a function hand a value back to whoever called it?", "return"),
    ("How do I catch an error and always run clean-up code afterwards?", "try"),
    ("How do I repeat code for as long as a condition stays true?", "while"),
    ("How does a generator function give back values one at a time?", "yield"),
    ("How do I take every second element between two positions of a sequence?", "slicings"),
    ("Which values count as false when tested in a condition?", "truth"),
    ("How does a chain such as a < b < c get evaluated?", "comparisons"),
    ("How do I write a number with an exponent, like ten to the power six?", "floating"),
    ("How do I write a complex number literal with an imaginary part?", "imaginary"),
    ("How do I step through my program line by line to find a bug?", "debugger"),
    ("How do I remove spaces from both ends of a text?", "string-methods"),
    ("How do I look up a dictionary key and get a fallback value when it is missing?", "typesmapping"),
    ("How do I add an item at the end of a list?", "typesseq-mutable"),
    ("How do I define a coroutine function?", "async"),
    ("How do I pause a coroutine until another awaitable has finished?", "await"),
    ("What does the double star operator compute?", "power"),
    ("How do I move the bits of an integer to the left?", "shifting"),
    ("How do I pad a number with zeros or fix its decimal places when formatting text?", "formatstrings"),
    ("What happens to a name when it is bound, and how is it found again in nested scopes?", "naming"),
    ("Which special methods make an object usable in a with statement?", "context-managers"),
    ("What does the main program use to bring in code from another file?", "import"),
]


def asked_set(pydoc: RagSet) -> RagSet:
    """The written questions whose topic is in the pydoc set's folder (all, or the quick run's)."""
    return RagSet("pydoc-asked", pydoc.folder, [Question(q, f"{t}.txt") for q, t in ASKED
                                                 if (pydoc.folder / f"{t}.txt").is_file()])


def kit_set(folder: Path) -> RagSet | None:
    """tests/docs_kit.py's corpus and questions; None outside a source checkout (or without the
    libraries that write its PDF, DOCX and PPTX)."""
    if not KIT.is_file():
        return None
    spec = importlib.util.spec_from_file_location("ember_docs_kit", KIT)
    kit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = kit  # its dataclasses look their module up
    try:
        spec.loader.exec_module(kit)
        kit.write_corpus(folder)
    except ImportError:
        return None
    return RagSet("kit", folder, [Question(q.text, q.filename) for q in kit.QUESTIONS])
