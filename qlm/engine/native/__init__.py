"""The native engine: Llama checkpoints served with torch, paged KV and continuous batching
(README.md)."""
