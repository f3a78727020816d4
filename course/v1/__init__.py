"""The engine of chapters 9 on, in the shape of vLLM V1 (``vllm/v1/``): one scheduling step
with a token budget (chapter 9), a KV cache coordinator with one manager per KV-cache group
(full attention in chapter 9, sliding window in 10), a KV connector to a CPU tier and a
second engine (11), and speculative decoding's lookahead slots and rollback (12)."""
