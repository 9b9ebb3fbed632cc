"""Where a load's bytes are: a parsed location and what a URI names for one
rank (a single file, a per-rank file of a template or directory, a packed
object, a Hugging Face checkpoint's shards). ``fastshard.shard`` and
``fastshard.packed`` re-export the public parts of these layouts."""
