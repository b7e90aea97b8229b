"""UlaCache from Python: stable logical addresses over device and host KV pools.

The classes are thin bindings of the C++ library (include/ula/*.h): numpy arrays are
viewed, never copied or cast (a wrong dtype, shape or layout raises InvalidArgumentError),
the GIL is released in every call that plans or moves bytes, and every refused call raises
a ``ulacache.Error`` subclass carrying the library's ``code`` and ``message`` after
changing nothing.

    import numpy as np, ulacache
    space = ulacache.AddressSpace(ulacache.AddressSpaceConfig(
        num_groups=1, entry_bytes=64, device_bytes_per_rank=64 * 64, host_bytes_per_rank=64 * 256))
    space.add_request(7)
    addrs = space.allocate(7, 100)                       # uint32 logical addresses
    space.advance_round()                                # end of the prefill step
    planner = ulacache.EngineStepPlanner(space, max_batch=1, max_q_len=1, max_top_k=32)
    sel = np.full((1, 1, 32), -1, np.int32); sel[0, 0, :20] = addrs[80:]
    idx = np.empty_like(sel)
    planner.step(0, 0, sel, idx)                         # idx: FlashMLA sparse-decode indices
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


from ._ulacache import *  # noqa: E402,F401,F403
from ._ulacache import DESCRIPTOR_DTYPE, COPY, SWAP, DEVICE, HOST  # noqa: E402,F401
