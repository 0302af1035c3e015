"""Model files into a running model: GGUF and Hugging Face checkpoints to ModelConfig and weights
(load.py picks by path), their tokenizers, and chat templates rendered in a jinja2 sandbox."""
