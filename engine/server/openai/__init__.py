"""OpenAI's API: request shapes and reply bodies, and the chat, completions, responses and embeddings
routes. Its chat request is also the shape Ollama's and Anthropic's requests are translated to."""
