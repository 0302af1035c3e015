"""Anthropic's Messages API (/v1/messages): request shapes and routes, for the programs that speak it."""
