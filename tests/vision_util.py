"""What the image tests over HTTP share: the tiny vision model's chat template, pictures as PNG
bytes and data: URIs, and the request and log-probability helpers (tests/server/test_openai_images.py,
test_image_urls.py)."""
from __future__ import annotations

import base64
import io

from PIL import Image as PILImage

from vlm_factory import random_pixels

GEMMA_TEMPLATE = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                  "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
                  "{% endif %}")


def data_uri(seed: int, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    PILImage.fromarray(random_pixels(seed)).save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def ask(client, *parts: dict, **kw):
    content = [{"type": "text", "text": "What is in this picture?"}, *parts]
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=2, temperature=0, logprobs=True, top_logprobs=5, **kw)


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def lps(r) -> list:
    return [[(t.token, t.logprob) for t in c.top_logprobs] for c in r.choices[0].logprobs.content]


def png_bytes(seed: int) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(random_pixels(seed)).save(buf, format="PNG")
    return buf.getvalue()


def responses_input(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"}, *parts]}]
