"""Text that looks like HTML is shown, never interpreted: a corpus of hostile messages round-trips
exactly through the real transcript widget (offscreen), a chat with one survives a real reply and a
switch of chats, and nothing a message names is fetched (a loopback server counts the requests)."""
from __future__ import annotations

import http.server
import threading

import pytest
from PySide6.QtGui import QGuiApplication

from ui.transcript import TranscriptView
from ui.transcript_markdown import verbatim
from ui.transcript_message import TranscriptMessage, from_history
from ui_support import ember, shared_engine  # noqa: F401

pytestmark = pytest.mark.timeout(300)

# Each shows exactly as written when rendered as Markdown without HTML (none uses Markdown's own
# emphasis or escapes, which a reader expects rendered).
HOSTILE = [
    "Why does <div><b>hello</div> render bold?",
    "a </think> b",
    "<think>plan</think> then answer",
    "<script>alert('x')</script> after the script",
    "<style>body { display: none }</style> after the style",
    '<a href="javascript:alert(1)">click</a> after the link',
    "<iframe src=x></iframe> after the frame",
    "<!-- a comment --> after the comment",
    "<table><tr><td>cell</td></tr></table> after the table",
    "template<typename T> class Foo<T*> { std::vector<std::map<int, T>> v; };",
    "fn first<'a, T: Clone>(xs: &'a [T]) -> Option<&'a T>",
    "#include <iostream> and #include <vector>",
    "if (a < b && c > d) { return x<y>z; }",
    "<|im_start|>user <|im_end|> <|eot_id|> special tokens",
    "List<Map<String, Integer>> in Java generics",
    "<br> <hr> <p> unclosed tags <b> everywhere",
    "snake_case_name and x_1_y intraword underscores",
]


def images(port: int) -> list[str]:
    return [f"<img src=http://127.0.0.1:{port}/raw.png> an HTML image",
            f"![a Markdown image](http://127.0.0.1:{port}/md.png) after it",
            f'<link rel="stylesheet" href="http://127.0.0.1:{port}/style.css"> a stylesheet']


@pytest.fixture
def counting_server():
    """A loopback HTTP server that counts every request it gets."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_hostile_text_round_trips_exactly(qtbot, role):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.set_messages([TranscriptMessage(role, text) for text in HOSTILE])
    lines = view.toPlainText().split("\n")
    for text in HOSTILE:
        assert text in lines, f"{text!r} was not shown as written"
    assert view.toPlainText().count("Copy") == len(HOSTILE)  # every message kept its actions


def test_nothing_a_message_names_is_fetched(qtbot, counting_server, tmp_path):
    port, hits = counting_server
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    texts = images(port) + [f"![local]({secret.as_uri()}) a local file"]
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show()
    view.set_messages([TranscriptMessage(role, t) for t in texts for role in ("user", "assistant")])
    qtbot.wait(500)  # a layout that fetched would have asked by now
    assert hits == []
    shown = view.toPlainText()
    assert "do not read" not in shown and "\ufffc" not in shown  # no image object, not even a broken one
    assert "[image: a Markdown image]" in shown and "an HTML image" in shown


def test_verbatim_shows_any_text_as_typed(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    texts = ["**not bold** _not italic_ `not code`", "# not a heading\n> not a quote\n- not a list",
             "    four spaces\n  and two", "1. not a list\n[not](a link) ![no](image)", "a\\b\\\\c &amp; &lt;"]
    for text in texts:
        view.document().setMarkdown(verbatim(text))
        assert view.toPlainText() == text


def test_a_chat_with_html_keeps_its_message_reply_and_buttons(qtbot, ember):
    question = HOSTILE[0]
    view = ember.window.new_chat()
    ember.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, "max_tokens": 12})
    with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
        view.send(question)
    assert done.args == [view.chat_id, "done"], view.transcript.messages[-1].error
    reply = view.transcript.messages[-1].content
    assert reply

    def shown_whole() -> bool:
        text = view.transcript.toPlainText()
        return question in text.split("\n") and text.count("Copy") == 2

    assert shown_whole(), view.transcript.toPlainText()
    other = ember.window.new_chat()  # away and back: the chat is rebuilt from the store
    assert ember.window.current_view() is other
    ember.window.chat_list.select(view.chat_id)
    qtbot.waitUntil(lambda: ember.window.current_view() is view, timeout=5000)
    assert shown_whole()
    view.transcript.set_messages(from_history(ember.chat_store.messages(view.chat_id), None))  # as after a restart
    assert shown_whole()
    view.actions.copy(0)
    assert QGuiApplication.clipboard().text() == question


def test_underscores_are_emphasis_not_an_underline_that_looks_like_a_link(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    view.set_messages([TranscriptMessage("assistant", "an _emphasised_ word")])
    fmt = view.document().find("emphasised").charFormat()
    assert fmt.fontItalic() and not fmt.fontUnderline()
