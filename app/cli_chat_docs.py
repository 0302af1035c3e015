"""`ember chat --docs COLLECTION`: each question is searched in the collection (hybrid, top 5), the
passages go into that turn as numbered sources (engine.docs.sources.with_sources), and after the
reply the sources it cites are printed with their file and location.

Only the turn being answered carries its sources: the history keeps the question as the user typed
it, so five passages a turn do not fill the context after a few questions (a later question is
searched again for its own).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

TOP_K = 5


@dataclass
class DocsChat:
    store: object  # engine.docs.store.DocStore
    store_id: str
    embed: object  # app.docs_local.LocalEmbedder

    def turn(self, history: list[dict]) -> tuple[list[dict], list]:
        """The history to render, its last user message with the sources; the hits."""
        from engine.docs.retrieve import search
        from engine.docs.sources import with_sources

        question = history[-1]["content"]
        vector = self.embed([question])[0] if self.store.store(self.store_id).dim else None
        hits = search(self.store, [self.store_id], question, vector, top_k=TOP_K, mode="hybrid")
        return [*history[:-1], {**history[-1], "content": with_sources(question, hits)}], hits

    def print_sources(self, answer: str, hits: list, out=None) -> None:
        from engine.docs.sources import cited_sources, label

        out = out or sys.stdout
        cited = cited_sources(answer, len(hits))
        if not hits:
            print("(no passage of the collection matched this question)", file=out)
        elif not cited:
            print(f"(the reply cites none of the {len(hits)} sources it was given)", file=out)
        else:
            print("Sources:", file=out)
            for n in cited:
                print(f"  [{n}] {label(hits[n - 1])}", file=out)

    def close(self) -> None:
        self.embed.close()
        self.store.close()


def open_docs_chat(args) -> DocsChat:
    """The collection `args.docs` and the embedder that built it; SystemExit in words when either is missing."""
    from app.docs_local import LocalEmbedder, collection, embedding_model, open_store
    from app.settings import Settings

    settings = Settings.load()
    store = open_store(settings)
    target = collection(store, args.docs)
    if target is None:
        store.close()
        raise SystemExit(f"error: --docs {args.docs}: no such collection (`ember docs list` shows them; "
                         "`ember docs add NAME FILES` makes one)")
    model = embedding_model(settings, args.embedding_model, target.embed_model, prefer_collection=True)
    return DocsChat(store, target.id, LocalEmbedder(model, args.threads))


def add_docs_args(p) -> None:
    p.add_argument("--docs", metavar="COLLECTION", help="answer from a collection of documents (`ember docs add`): "
                                                        "each question brings its top passages, cited as [1]")
    p.add_argument("--embedding-model", metavar="ID", help="the embedder of --docs (default: the one that "
                                                           "indexed the collection)")
