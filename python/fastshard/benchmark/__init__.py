"""``fastshard bench URI [URI ...]``: how fast the user's own objects load
with fastshard and, where installed, the loaders people compare it with.

  command.py    the CLI: which loaders apply, rounds in alternating order,
                one row per loader (GB/s, seconds, client CPU seconds,
                whether its tensors agree with fastshard's), the plot
  loaders.py    fastshard, tensorizer, Run:ai Model Streamer, safetensors
                and the raw client, each loading every URI
  raw.py        the raw client: ranged GETs from threads into one buffer,
                or a plain read of a local file

No servers, no builds: it measures what the user points it at. The
benchmark lab that starts its own servers (SeaweedFS, nginx, the shaping
proxies) lives in a fastshard checkout's benches/, outside the wheel.
"""
