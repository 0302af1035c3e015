"""The engine process's HTTP server: the FastAPI app (app.py), one subpackage per wire protocol
(openai/, ollama/, anthropic/), and what they share (the chat pipeline, auth, errors, SSE, reasoning, tools)."""
