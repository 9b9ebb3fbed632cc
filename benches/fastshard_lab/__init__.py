"""fastshard's benchmark lab: ``python -m fastshard_lab [--preset NAME]``.

A development package (benches/pyproject.toml), installed editable by the
checkout's requirements, never shipped in fastshard's wheel; it imports
fastshard, and fastshard never imports it. The servers it starts are shared
with the tests (tests/servers.py). benches/README.md says how to run it.

One library, layered so no module imports one above it:
  command.py    the CLI: ``--preset NAME`` picks a module of presets/, which
                adds its options (parser.py), names what it requires, and runs
  presets/      default (every loader on every source), local, remote, tp,
                trust, network, network-model, ready, staging, cast,
                safetensors, matrix (stores x proxies)
  measure.py    each load in a fresh child (child.py), in alternating rounds;
                the rank harness (N children released by one barrier)
  loaders.py    the one loader set: fastshard, tensorizer, safetensors, Run:ai
                Model Streamer, torch.load; raw.py: each source's raw ceiling
  workload.py   seeded state dicts, the objects they are written as,
                tensor-parallel shares, and the one digest (SHA-256)
  sources.py    files, SeaweedFS and nginx on loopback, a user's own object
  servers.py, web.py, procs.py, shaper.py, pyshaper.py, served.py
                the servers (also used by the tests), the shaping proxies
                (Rust, and a second one in Python), a ``vllm serve`` process
  report.py, plots.py, machine.py, deps.py, params.py
                records, tables, PNGs; what the machine is; what is installed
  record.py, runs.py
                ``--record``: a run into docs/benchmarks/<date>-<preset>/ (page,
                JSON, plots), ``--render`` of such a folder, and the list of
                runs, docs/benchmarks/runs.md (``--index``, run by make docs)
"""
