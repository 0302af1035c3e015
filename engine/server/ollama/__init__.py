"""Ollama's native API (/api/*): request shapes, chat/generate/embed routes, and the model routes
(tags, show, ps, pull), for the programs that speak Ollama."""
