"""The engine of chapters 2-8, in the shape of vLLM's first engine (V0): block tables and slot
mappings (chapter 2), a copy-on-write BlockManager (3) and its prefix cache (4), a
continuous-batching scheduler (5) and the paged engine that serves the tiny model (8)."""
