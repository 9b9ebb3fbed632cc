"""Stubs for the Rust extension module ``fastshard._native``.

The native module owns IO, parsing and planning; it never sees torch. Payload
bytes cross only as buffers the caller owns (writable for loads, readable for
saves), so no tensor data is copied through Python objects.
"""

from collections.abc import Sequence

from typing_extensions import Buffer

PathPart = str | int

# (name, path, tensor_type, dtype, shape, header_offset, data_offset, data_length)
#   name: display name (plain name, or path components joined with ".")
#   path: None for plain names, else the components of a 0x1E JSON path name
#   tensor_type: 0 = param, 1 = buffer, 2 = state dict entry
#   dtype: torch dtype name without the "torch." prefix, e.g. "bfloat16"
EntryTuple = tuple[str, list[PathPart] | None, int, str, list[int], int, int, int]

# (name_or_path, tensor_type, module_idx, dtype, shape, is_meta)
SpecTuple = tuple[str | Sequence[PathPart], int, int, str, Sequence[int], bool]

class Reader:
    """An opened tensorizer file: header and index fetched and validated."""

    uri: str
    file_size: int
    version: int
    encrypted: bool
    def __init__(self, uri: str) -> None: ...
    def entries(self) -> list[EntryTuple]: ...
    def load(
        self,
        indices: Sequence[int],
        buffers: Sequence[Buffer],
        *,
        verify_hash: bool = False,
        concurrency: int | None = None,
        part_size_bytes: int | None = None,
    ) -> dict[str, float]:
        """Fill ``buffers[i]`` with the bytes of tensor ``indices[i]``.

        Each buffer must be writable, C-contiguous and exactly the tensor's
        byte size (meta tensors are zero-filled). Releases the GIL while it
        waits; Ctrl-C cancels and raises KeyboardInterrupt. On any error no
        buffer should be trusted. Returns stats: bytes_fetched, requests,
        retries, seconds, concurrency, peak_host_bytes.
        """

def write_file(
    path: str,
    specs: Sequence[SpecTuple],
    buffers: Sequence[Buffer],
    *,
    exact_index: bool = False,
) -> int:
    """Write a tensorizer file; returns its size. ``buffers[i]`` holds tensor
    i's bytes (empty for meta tensors). Byte-identical to tensorizer 2.12.1
    unless ``exact_index`` sizes the index exactly (needed past a few thousand
    tensors)."""

def dtype_itemsize(torch_name: str) -> int: ...
