"""The presets of ``fastshard bench`` (``--preset NAME``), one module each;
``fastshard.bench.command`` lists them."""
