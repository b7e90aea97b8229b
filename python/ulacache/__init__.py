"""UlaCache from Python: stable logical addresses over device and host KV pools.

The classes are thin bindings of the C++ library (include/ula/*.h): numpy arrays and CPU
torch tensors (any object with ``__dlpack__``) are viewed, never copied or cast (a wrong
dtype, shape or layout raises InvalidArgumentError; engine memory takes any dtype as bytes;
a CUDA tensor raises UnsupportedError: the planners read and write their arrays on the host),
the GIL is released in every call that plans or moves bytes, and every refused call raises
a ``ulacache.Error`` subclass carrying the library's ``code`` and ``message`` after
changing nothing.

    import numpy as np, ulacache
    space = ulacache.AddressSpace(ulacache.AddressSpaceConfig(stable_new_entries=True,
        num_groups=1, entry_bytes=64, device_bytes_per_rank=64 * 64, host_bytes_per_rank=64 * 256))
    space.add_request(7)
    addrs = space.allocate(7, 100)                       # uint32 logical addresses
    space.advance_round()                                # end of the prefill step
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=32)
    sel = np.full((1, 1, 32), -1, np.int32); sel[0, 0, :20] = addrs[80:]
    idx = np.empty_like(sel)
    requests = np.array([7], np.int64)                   # the request of each batch row
    planner.step(0, 0, sel, idx, requests)               # idx: FlashMLA sparse-decode indices
    assert (idx[0, 0, 20:] == -1).all()
"""


class Error(Exception):
    """A refused UlaCache call. ``code`` is the library's error code name, ``message`` its text."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class InvalidArgumentError(Error):
    """A malformed argument: wrong dtype, shape, layout, size, or config field."""


class NotFoundError(Error):
    """An unknown or freed address, block, request or fence (a stale address)."""


class AlreadyExistsError(Error):
    """A double registration."""


class OutOfRangeError(Error):
    """An index past the end of a structure (rank, group)."""


class ResourceExhaustedError(Error):
    """The request does not fit in the memory that is left."""


class FailedPreconditionError(Error):
    """The structure's state does not allow the call (e.g. a plan is pending)."""


class UnsupportedError(Error):
    """The backend or mode cannot do this (e.g. bytes on the counting backend)."""


class InternalError(Error):
    """A broken invariant."""


class IoError(Error):
    """A file or process failure."""


_BY_CODE = {
    "invalid argument": InvalidArgumentError,
    "not found": NotFoundError,
    "already exists": AlreadyExistsError,
    "out of range": OutOfRangeError,
    "resource exhausted": ResourceExhaustedError,
    "failed precondition": FailedPreconditionError,
    "unsupported": UnsupportedError,
    "internal": InternalError,
    "io": IoError,
}


def error_class(code: str) -> type:
    """The Error subclass of a library error code name (used by the extension)."""
    return _BY_CODE.get(code, Error)


def _explain_import_failure(error: ImportError) -> ImportError:
    """An ImportError that names why the extension did not load and what it was built for."""
    import sys
    from . import _build_info
    built = f"{_build_info.PYTHON_EXECUTABLE} (Python {_build_info.PYTHON_VERSION})"
    running = f"{sys.executable} (Python {sys.version.split()[0]})"
    try:
        import numpy  # noqa: F401
    except ImportError:
        return ImportError(f"ulacache needs numpy, which this interpreter ({running}) cannot import; "
                           f"the extension was built for {built}: install numpy for it (Debian: python3-numpy) "
                           f"or run that interpreter")
    if tuple(sys.version_info[:2]) != tuple(int(x) for x in _build_info.PYTHON_VERSION.split(".")[:2]):
        return ImportError(f"ulacache's extension was built for {built}, not for this interpreter "
                           f"({running}): run that interpreter or rebuild with -DPython3_EXECUTABLE={sys.executable}")
    return ImportError(f"ulacache's extension failed to load under {running} (built for {built}): {error}")


try:
    from ._ulacache import *  # noqa: E402,F401,F403
    from ._ulacache import DESCRIPTOR_DTYPE, COPY, SWAP, EVICT, EVICT_LANDED, DEVICE, HOST  # noqa: E402,F401
except ImportError as _error:
    raise _explain_import_failure(_error) from _error


DESCRIPTOR_FIELDS = ("src_offset", "dst_offset", "src_slot", "dst_slot", "bytes", "addr", "src_rank", "dst_rank",
                     "group", "src_tier", "dst_tier", "op", "num_layers", "evict_slot")


def descriptor_columns(n, fields=DESCRIPTOR_FIELDS):
    """Copy descriptors as a structure of arrays: {field: numpy array [n]}, the byte offsets
    int64 and every other field int32, for ``StepPlanner.plan(descriptors=...)`` (it
    writes the first ``num_descriptors`` entries of each column) and the executors. Wrap the
    columns with ``torch.from_numpy`` for a torch copy kernel: the plan writes through them."""
    import numpy as np
    unknown = [f for f in fields if f not in DESCRIPTOR_FIELDS]
    if unknown:
        raise ValueError(f"not descriptor fields: {unknown} (fields: {', '.join(DESCRIPTOR_FIELDS)})")
    return {f: np.zeros(n, np.int64 if f.endswith("_offset") else np.int32) for f in fields}


def newest_entry(pages):
    """(block, offset) of the newest live entry in a KindPages (``AddressSpace.kind_pages_of``),
    or None when the request holds no entry of the kind: where the engine writes the entry its
    newest token made. The window: the token just allocated. c4 / c128 (append kinds): the
    entry the newest token completed when ``pages.filling_tokens == 0``, otherwise the last
    complete one (the newest tokens are still in the compressor state). A per_request state:
    its one block, offset 0 (its row is ``filling_tokens``, the position in the block still
    filling). The row in a kind's strided view ``[blocks][entries_per_block][row]`` is
    ``block * pages.entries_per_block + offset``."""
    if pages.entries == 0:
        return None
    i = pages.first_offset + pages.entries - 1
    return int(pages.blocks[i // pages.entries_per_block]), i % pages.entries_per_block


def kind_block_table(space, requests, kind, width=None):
    """The block table of one kind for a batch (vLLM's per-group ``block_table``, SGLang's
    per-pool page table rows): int32 [len(requests), width], row b the block ids of request
    ``requests[b]`` from ``space.kind_pages_of``, -1 past its blocks; width defaults to the
    longest row. A ring's first live entry sits at ``kind_pages_of(...).first_offset`` of
    column 0. Raises what ``kind_pages_of`` raises, and InvalidArgumentError when a row does
    not fit ``width``."""
    import numpy as np
    rows = [space.kind_pages_of(int(r), kind).blocks for r in requests]
    longest = max((len(b) for b in rows), default=0)
    if width is None:
        width = longest
    elif longest > width:
        raise InvalidArgumentError("invalid argument",
                                   f"kind_block_table: a request holds {longest} blocks of kind {kind}, more than width {width}")
    table = np.full((len(rows), width), -1, np.int32)
    for b, blocks in enumerate(rows):
        table[b, :len(blocks)] = blocks
    return table
