"""Stubs for the Rust extension module ``fastshard._native``.

The native module owns IO, parsing and planning; it never sees torch. Payload
bytes cross only as buffers the caller owns (writable for loads, readable for
saves), so no tensor data is copied through Python objects.
"""

from collections.abc import Sequence
from os import PathLike
from typing import Any, Literal, final

from typing_extensions import Buffer, TypedDict, Unpack

# The source options are typed once, in fastshard._options; their names here
# at run time (SOURCE_OPTIONS, from rust/py/options.rs) are tested equal to it.
from fastshard._options import SourceOptions as _SourceOptions

__all__ = [
    "SOURCE_OPTIONS",
    "STAGE_ALIGN",
    "Location",
    "Mapping",
    "Progress",
    "Reader",
    "Slab",
    "Staging",
    "delete_object",
    "dtype_itemsize",
    "read_object",
    "write_file",
    "write_object",
]

# Names with a leading underscore exist for annotations only (not at run time).
_PathPart = str | int

# (name, path, tensor_type, dtype, shape, header_offset, data_offset, data_length)
#   name: display name (plain name, or path components joined with ".")
#   path: None for plain names, else the components of a 0x1E JSON path name
#   tensor_type: 0 = param, 1 = buffer, 2 = state dict entry
#   dtype: torch dtype name without the "torch." prefix, e.g. "bfloat16"
_EntryTuple = tuple[str, list[_PathPart] | None, int, str, list[int], int, int, int]

# (kind, secret, opslimit, memlimit): kind "key" (secret = the raw 32 bytes)
# or "passphrase" (Argon2id; opslimit/memlimit are the costs used when writing,
# reads take the file's). Built by fastshard.EncryptionKey.native().
_EncryptionTuple = tuple[Literal["key", "passphrase"], bytes, int, int]

class _LoadKnobs(TypedDict, total=False):
    """The keywords of ``Reader.load`` and ``Reader.stage``."""

    verify_hash: bool
    concurrency: int | None
    throughput_target_gbps: float | None
    part_size_bytes: int | None
    max_host_bytes: int | None
    encryption: _EncryptionTuple | None
    progress: Progress | None

# (name_or_path, tensor_type, module_idx, dtype, shape, is_meta)
_SpecTuple = tuple[str | Sequence[_PathPart], int, int, str, Sequence[int], bool]

# Names of the source options (keys of _SourceOptions), as the native layer accepts them.
SOURCE_OPTIONS: list[str]
# Staged pieces start at multiples of this many bytes in their slab.
STAGE_ALIGN: int

@final
class Location:
    """A URI parsed once: its kind, parts, and a form safe to show.

    ``uri``: a local path (str or os.PathLike), ``file://path``,
    ``s3://bucket/key`` (a key that is empty or ends in "/" names a prefix)
    or an ``http(s)://`` URL. Only http(s) URLs have a query string; in a
    path or an S3 key "?" is an ordinary character. An unknown scheme raises
    UnsupportedError, ``s3://`` without a bucket InvalidArgumentError.
    Every native entry point that takes a URI also takes a Location.
    ``str()`` is ``display``; ``repr()`` is ``Location('<display>')``.
    """

    def __new__(cls, uri: str | PathLike[str] | Location) -> Location: ...
    @property
    def kind(self) -> Literal["file", "s3", "gs", "http"]: ...
    @property
    def display(self) -> str:
        """Safe to show: no user info, fragment or query string (a query
        shows as "?…")."""
    @property
    def path(self) -> str | None:
        """The local file system path (plain path or ``file://``)."""
    @property
    def bucket(self) -> str | None: ...
    @property
    def key(self) -> str | None:
        """The S3 key: "" or ending in "/" for a prefix."""
    @property
    def head(self) -> str:
        """What a per-rank template may rewrite: the whole URI, or an
        http(s) URL without its "?query"."""
    @property
    def query(self) -> str:
        """An http(s) URL's "?query" as given (a secret for presigned URLs),
        else ""."""
    @property
    def is_dir(self) -> bool:
        """The head ends with "/", or a local path is a directory now."""
    def sibling(self, name: str) -> Location:
        """``name`` in the same directory (head up to its last "/"),
        without this location's query string."""
    def child(self, name: str) -> Location:
        """``name`` inside this directory or prefix (a "/" added when the
        head lacks one); a URL keeps its query string."""
    def renamed(self, name: str) -> Location:
        """``name`` in place of the last path component; a URL keeps its
        query string."""
    @staticmethod
    def parsed_from_python() -> int:
        """For tests: how many URIs native calls have parsed from a str or
        path argument since the module loaded (a Location argument is not
        parsed again, nor one derived by child, sibling or renamed)."""

@final
class Slab:
    """A Rust-owned, page-aligned, zero-initialised host buffer of ``nbytes``
    bytes, exported through the writable buffer protocol (``torch.frombuffer``
    views it; the CUDA path pins it with ``cudaHostRegister``). Views keep
    the slab alive. Allocation failure raises StorageError. (The protocol is
    the C-level one; Python 3.11 has no ``__buffer__`` method to declare.)"""

    def __new__(cls, nbytes: int) -> Slab: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...

@final
class Staging:
    """A staged load running (``Reader.stage``): reads fill the slabs
    several batches ahead of the copies; tensors are checked, decrypted and
    hashed as their bytes land. Batch ``b`` lies in slab ``b % slabs``
    once ``next`` returns it, until ``release(b)``. Closing (or leaving the
    ``with`` block) cancels what is still being read and waits for it."""

    @property
    def batches(self) -> int: ...
    @property
    def slabs(self) -> int: ...
    @property
    def zeros(self) -> list[int]:
        """Items whose destination must be all zeros (meta tensors)."""
    def next(self) -> int | None:
        """The next final batch, or None after the last. Waits without the
        GIL; a read's or a check's failure raises here, typed, naming the
        URI, tensor and range; Ctrl-C cancels and raises KeyboardInterrupt.
        A read may span two batches: batch ``b`` needs every batch up to
        ``b + 1 - slabs`` released first."""
    def ops(
        self, batch: int
    ) -> tuple[
        list[tuple[int, int, int, int]], list[tuple[int, int, int, int, int, int, int, bool]]
    ]:
        """Batch ``batch``'s copies out of its slab: plain bytes as
        ``(target, src, dst, len)`` (``len`` bytes from slab byte ``src``
        to target byte ``dst``), and copies through an item's view as
        ``(item, src, dst, width, height, src_pitch, dst_pitch, last)``:
        ``height`` rows of ``width`` bytes from ``src`` every ``src_pitch``
        to the item's loaded bytes (file dtype, row-major) from ``dst``
        every ``dst_pitch``; ``last`` marks the item's final copy."""
    def bind_host(
        self,
        regions: Sequence[tuple[int, int]],
        targets: Sequence[int | None],
        items: Sequence[tuple[int, int, str, str] | None],
    ) -> None:
        """Host memory ``take`` copies into: ``regions`` as ``(address,
        bytes)`` (unchecked: the caller keeps each valid, writable and
        untouched by anyone else until the load is closed), byte target
        ``t``'s region ``targets[t]``, and item ``k``'s place ``items[k]``
        ``(region, base, stored dtype, dtype)``: a contiguous destination
        from byte ``base`` of its region. An item whose cast the native
        side cannot make (types other than float64/32/16 and bfloat16)
        stays unbound."""
    def take(
        self, batch: int
    ) -> tuple[
        list[tuple[int, int, int, int]], list[tuple[int, int, int, int, int, int, int, bool]]
    ]:
        """Copies batch ``batch``'s ops into the bound host memory (without
        the GIL, over the cores; checked against the slab and the regions
        first) and returns the rest, as ``ops`` gives them."""
    def release(self, batch: int) -> None:
        """Batch ``batch``'s copies have completed: its slab may be
        refilled. Batches are released in order."""
    def finish(self) -> dict[str, Any]:
        """After the last batch: the load's stats, as ``Reader.load``'s."""
    def close(self) -> None: ...
    def __enter__(self) -> Staging: ...
    def __exit__(self, _exc_type: object, _exc: object, _tb: object) -> None: ...

@final
class Mapping:
    """A whole local tensor file mapped copy-on-write (``MAP_PRIVATE``),
    made by ``Reader.map``; exported through the writable buffer protocol,
    so ``torch.frombuffer`` views it. Writes through a view change this
    process's copy of the page, never the file. Every view (every tensor
    made from it) holds a reference to it: the file stays mapped while one
    lives, and is unmapped when the last one is collected."""

    @property
    def nbytes(self) -> int: ...
    @property
    def uri(self) -> str: ...
    def copy_into(
        self,
        regions: Sequence[tuple[int, int]],
        items: Sequence[tuple[int, int, str, str] | None],
        ops: Sequence[tuple[int, int, int]],
        *,
        progress: Progress | None = None,
    ) -> None:
        """Copies tensors out of the mapping into host memory, casting
        between float types, without the GIL and over the cores: ``ops[i] =
        (item, offset, nbytes)`` takes the bytes stored at ``offset`` into
        item ``item``, bound as ``Staging.bind_host`` binds them; ``progress``
        counts them once copied. Checked against the mapping and the regions
        first. Private to
        ``fastshard._engine.mapcast``, which keeps the destinations alive."""
    def __len__(self) -> int: ...

@final
class Progress:
    """Bytes landed in destinations so far, added by the native loads it is
    passed to as their reads complete; read from any thread."""

    def __new__(cls) -> Progress: ...
    @property
    def value(self) -> int: ...

@final
class Reader:
    """An opened tensor file (tensorizer or safetensors, told apart by its
    first bytes): header and index fetched and validated.

    ``uri``: a local path or ``file://`` URL, ``s3://bucket/key``, or an
    ``http(s)://`` URL (presigned URLs work; the server must honour Range;
    query strings never appear in errors). Every read after the first is
    pinned to the object's ETag (If-Match), or to Last-Modified for HTTP
    servers without ETags, so a changed object raises ObjectChangedError.
    Errors: NotFoundError, AuthError (names the credential source, never
    the secret), ThrottledError, ObjectChangedError, StorageError,
    FormatError, UnsupportedError (a newer format version or feature: not
    a FormatError); messages name the URI and byte range.
    """

    uri: str
    location: Location  # where it was opened (a set's: the location naming the set)
    file_size: int
    version: int | None  # tensorizer data version; None for safetensors
    format: str  # "tensorizer" or "safetensors", detected from the bytes
    metadata: list[tuple[str, str]]  # safetensors' __metadata__ (sorted); [] for tensorizer
    encrypted: bool
    # The smallest piece ``stage`` cuts this file's tensors in: 2 MiB (a
    # cipher chunk) for an encrypted file, else 4 KiB; slabs hold two.
    stage_unit: int
    discovery_bytes: int  # read by the constructor (header and index)
    def __new__(
        cls,
        uri: str | Location,
        *,
        members: Sequence[str | Location] | None = None,
        **opts: Unpack[_SourceOptions],
    ) -> Reader:
        """``members``: files opened as one set (a checkpoint's shards: their
        headers read concurrently, tensor names unique across them, one plan
        per load over all); ``uri`` then names the set in messages."""

    def members(self) -> list[tuple[str, int, int]]:
        """``(uri, file_size, tensor_count)`` of each file, in the order
        their tensors appear in ``entries()``."""

    def entries(self) -> list[_EntryTuple]: ...
    def map(self, indices: Sequence[int], *, verify_hash: bool = False) -> Mapping:
        """The whole file mapped copy-on-write, once each of the tensors
        ``indices`` has been checked over the mapped pages: its record
        header and data lie inside the file and the header agrees with the
        index (FormatError otherwise), and with ``verify_hash`` its CRC32
        and SHA-256 match (IntegrityError; tensors hashed in parallel, the
        GIL released). Tensor ``i``'s bytes are at its ``data_offset``.
        UnsupportedError for a remote object or an encrypted file;
        ObjectChangedError when the file's size is not the one it had
        when this Reader opened it (the Reader's open file is mapped, so a
        file renamed over the path since is not)."""
    def load(
        self,
        indices: Sequence[int],
        buffers: Sequence[Buffer],
        *,
        slices: Sequence[tuple[int, Sequence[tuple[int, int]]] | None] | None = None,
        **knobs: Unpack[_LoadKnobs],
    ) -> dict[str, Any]:
        """Fill ``buffers[i]`` with the bytes of tensor ``indices[i]``, or
        with its slice ``slices[i] = (dim, [(start, length), ...])`` (the
        ranges along ``dim`` laid end to end; no record header is read, so
        ``verify_hash`` is refused). ``max_host_bytes`` bounds the headers
        and gap scratch the load holds at once.

        Each buffer must be writable, C-contiguous and exactly the tensor's
        byte size (meta tensors are zero-filled). Releases the GIL while it
        waits; Ctrl-C cancels and raises KeyboardInterrupt. On any error no
        buffer should be trusted. ``concurrency`` (reads in flight) and
        ``part_size_bytes`` (bytes per ranged read) default per source: S3
        and HTTP start with 64 reads and double them while throughput rises,
        up to 512 (``throughput_target_gbps`` sets the start and where to
        stop), in parts of up to 16 MiB (a small load gets smaller parts,
        one per starting read, at least 1 MiB) that are joined into larger
        reads while a read's first byte takes longer than its bytes (neither
        set); local files use one read per core (at least 8) of 8 MiB.
        Returns stats of this load (discovery not included):
        bytes_fetched, bytes_wanted, requests (ranged reads sent, retries
        included), retries, seconds, concurrency (the most in flight),
        peak_host_bytes, bytes_from_cache (read from the node's cache, not
        the store: not in bytes_fetched).

        ``encryption`` is required for encrypted files (``encrypted``) and
        refused for others (InvalidArgumentError), as are slices of them.
        Tensors are decrypted in place as their 2 MiB chunks land,
        chunk-parallel, and hashed in file order as they land (the hashes
        cover the plaintext). A wrong key or a modified byte fails the
        chunk's MAC: IntegrityError naming the tensor and the chunk's byte
        range; every buffer of the load is zeroed.
        """

    def stage(
        self,
        indices: Sequence[int],
        slices: Sequence[tuple[int, Sequence[tuple[int, int]]] | None],
        targets: Sequence[tuple[int, int, bool] | None],
        slabs: Sequence[Slab],
        slab_bytes: int,
        **knobs: Unpack[_LoadKnobs],
    ) -> Staging:
        """Start a staged load of tensors ``indices`` (their ``slices`` as
        in ``load``; slices of an encrypted file too) into ``slabs``: at
        least two ``Slab``s (any writable buffers) of ``slab_bytes`` or more (at least 2
        MiB, a multiple of 512), kept exported until the staging closes.
        ``targets[i]``: ``(target, base, padded)`` when item ``i`` is
        copied out as plain bytes into target ``target`` from byte ``base``
        (contiguous memory of the file's dtype; items may share a target;
        ``padded``: the target's bytes between its items are padding a
        copy may run over, as where they were carved at 512 bytes), None
        when it is copied through its own view. Options as in ``load``;
        ``max_host_bytes`` bounds the record headers and gap scratch
        beside the slabs. Refuses what ``load`` refuses, before reading."""

def write_file(
    path: str | Location,
    specs: Sequence[_SpecTuple],
    buffers: Sequence[Buffer],
    *,
    exact_index: bool = False,
    sha256: bool = False,
    encryption: _EncryptionTuple | None = None,
    align: int = 1,
    **opts: Unpack[_SourceOptions],
) -> int | tuple[int, str]:
    """Write a tensorizer file to a local path or ``s3://bucket/key``;
    returns its size, or with ``sha256=True`` (size, hex SHA-256 of the
    whole file), hashed on another thread from the bytes as they are
    written (nothing read back). ``buffers[i]`` holds tensor i's bytes
    (empty for meta tensors). Byte-identical to tensorizer 2.12.1 unless
    ``exact_index`` sizes the index exactly (needed past a few thousand
    tensors). A local file is written beside its name and renamed; an S3
    object is a streamed multipart upload (one PutObject when small)
    completed only at the end and aborted on failure, so readers never see
    half a file. ``encryption`` encrypts every tensor with data as
    tensorizer does (version 3+ with the encrypted flag, 2 MiB chunks,
    SHA-256 only on encrypted records); the buffers are not modified (a
    copy of one tensor at a time is sealed). ``align`` (a power of two up
    to 4096; not with ``encryption``) starts every tensor's data at a
    multiple of that many bytes, with zero slack at the end of its record
    header, which tensorizer's reader skips (and hashes); 1 is tensorizer's
    layout."""

def read_object(
    uri: str | Location, *, max_bytes: int = 16 << 20, **opts: Unpack[_SourceOptions]
) -> bytes | None:
    """The whole object at ``uri`` (local path, ``file://``, ``s3://``,
    ``gs://`` or ``http(s)://``), or None when it does not exist (NotFound; a missing
    bucket counts). An object over ``max_bytes`` raises InvalidArgumentError
    before it is read when the store says its size; other failures raise
    typed (AuthError naming the credential source, StorageError, ...).
    Small objects only (the shard manifest): tensor files go through Reader."""

def write_object(uri: str | Location, data: bytes, **opts: Unpack[_SourceOptions]) -> None:
    """Write ``data`` as the whole object at ``uri``: a local file written
    beside its name and renamed into place, or one S3 PutObject. Readers see
    the old object or the new one, never a part. ``http(s)://`` raises
    UnsupportedError."""

def delete_object(uri: str | Location, **opts: Unpack[_SourceOptions]) -> None:
    """Delete a local file or S3 object; one that does not exist is fine.
    ``http(s)://`` raises UnsupportedError."""

def dtype_itemsize(torch_name: str) -> int: ...
