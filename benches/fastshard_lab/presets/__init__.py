"""The presets of ``python -m fastshard_lab`` (``--preset NAME``), one module each;
``fastshard_lab.command`` lists them."""
