"""The decoder (Llama, Qwen2, Qwen3), its configuration, weight loaders and tokenizer."""
