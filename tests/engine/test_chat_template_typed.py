"""Templates that read a message's content only as typed parts (SmolVLM2's, Idefics'): Ember hands
them each message's text as one text part, so the words (and an image's marker in them) are in the
prompt, not silently dropped as a plain string would be; other templates still get strings."""
from __future__ import annotations

from engine.images import MEDIA_MARKER
from engine.loaders.chat_template import CHATML_TEMPLATE, ChatTemplate
from smolvlm_factory import SMOLVLM2_TEMPLATE


def test_smolvlm2s_template_gets_the_words_and_the_image_marker():
    t = ChatTemplate(SMOLVLM2_TEMPLATE)
    assert t.typed_content
    chat = [{"role": "user", "content": f"What is {MEDIA_MARKER} this?"}, {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": [{"type": "text", "text": "And now?"}]}]
    assert t.render(chat) == (f"<|im_start|>User: What is {MEDIA_MARKER} this?<end_of_utterance>\n"
                              "Assistant: A cat.<end_of_utterance>\nUser: And now?<end_of_utterance>\nAssistant:")


def test_a_template_that_reads_strings_still_gets_strings():
    for source in (CHATML_TEMPLATE, "{% for m in messages %}{{ m.content | upper }}{% endfor %}"):
        t = ChatTemplate(source)
        assert not t.typed_content
        assert "HELLO" in t.render([{"role": "user", "content": "hello"}]).upper()
    # one that fails on a lone user turn is left as it was (its own error, on its own terms)
    assert not ChatTemplate("{{ raise_exception('needs a system turn') }}").typed_content
