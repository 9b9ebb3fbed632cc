"""Names that vLLM's driver, its workers, the serializer and the loader agree
on (importable without torch or vLLM)."""

WORKER_EXTENSION = "fastshard.vllm.serialize.FastshardWorkerExtension"
SAVE_METHOD = "fastshard_save_rank"

# A meta tensor vLLM's tensorize_vllm_model adds to every per-rank file (and
# fastshard's serializer too): the file holds a vLLM module's parameters.
MARKER = "vllm_tensorized_marker"
# fastshard's serializer adds this one as well: the parameters are as
# load_weights leaves them, before post-load processing (CPU GEMM repacking,
# quantisation) rewrote them, so the loader runs that processing in full.
# Files without it (vLLM's own) hold processed weights.
CHECKPOINT_MARKER = "fastshard_checkpoint_form_marker"
