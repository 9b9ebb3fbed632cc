"""The load engine: the native reader's loads, the one dispatch of planned
jobs, the staging ring and its slabs, CUDA copies, mapped files and casts.
Reached from reader.py, module.py and vllm/ through ``fastshard._core``."""
