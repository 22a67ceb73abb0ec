"""Language models as they are run: prefill and decode, the KV cache, tokens per second."""
