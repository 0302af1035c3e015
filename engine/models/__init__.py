"""The one dense decoder every family runs (llama.py, LlamaForCausalLM) and ModelConfig
(config.py), which carries a file's dimensions and its Family (engine/model_files/families.py)."""
