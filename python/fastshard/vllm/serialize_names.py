"""Names the driver and vLLM's workers agree on (importable without torch)."""

WORKER_EXTENSION = "fastshard.vllm.serialize.FastshardWorkerExtension"
SAVE_METHOD = "fastshard_save_rank"
