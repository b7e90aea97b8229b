# Type stubs of the ulacache package (the bindings in python/src/*.cc; the C++ contracts
# in include/ula/*.h). Arrays are numpy arrays, or CPU tensors with __dlpack__ (torch), of
# exactly the dtype named; nothing is cast or copied. A CUDA tensor raises UnsupportedError
# (no CUDA backend is built).
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]
Tensor = Any  # a numpy array or an object with __dlpack__ (torch.Tensor on the CPU)
# Request ids of a step: uint64 or int64 (torch's req_pool_indices) [batch].
Requests = Union[U64, npt.NDArray[np.int64], Tensor]
# Engine-owned memory of a pool: [layers, slots, ...], or the layers' [slots, ...] tensors as
# a list (SGLang) or a dict in layer order (vLLM's register_kv_caches), equally spaced.
EngineMemory = Union[np.ndarray, Tensor, list, dict]

class Error(Exception):
    code: str
    message: str
    def __init__(self, code: str, message: str) -> None: ...

class InvalidArgumentError(Error): ...
class NotFoundError(Error): ...
class AlreadyExistsError(Error): ...
class OutOfRangeError(Error): ...
class ResourceExhaustedError(Error): ...
class FailedPreconditionError(Error): ...
class UnsupportedError(Error): ...
class InternalError(Error): ...
class IoError(Error): ...

def error_class(code: str) -> type: ...

# numpy dtype of one copy descriptor (48 bytes, ula::CopyDescriptor): src_offset, dst_offset
# (u8), src_slot, dst_slot, bytes, addr (u4), src_rank, dst_rank, group (u2), src_tier,
# dst_tier, op (u1), num_layers (u2: rows of `bytes` per descriptor, one per layer).
DESCRIPTOR_DTYPE: np.dtype
COPY: int
SWAP: int
DEVICE: int
HOST: int

class ModelConfig:
    name: str
    source: str
    num_layers: int
    mtp_layers: int
    layers_per_group: int
    attention_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    kv_entry_bytes_per_layer: int
    index_heads: int
    index_head_dim: int
    index_key_bytes_per_layer: int
    top_k: int
    num_groups: int
    group_entry_bytes: int
    is_float32: bool
    def group_layers(self, group: int) -> int: ...

class HardwareConfig:
    name: str
    device_memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float
    host_link_bandwidth_bytes_per_s: float
    host_memory_bytes_per_gpu: int
    gpus_per_node: int

def parse_model_config(json_text: str) -> ModelConfig: ...
def load_model_config(path: str) -> ModelConfig: ...
def load_hardware_config(path: str) -> HardwareConfig: ...

class Indexer:
    top_k: int
    def __init__(self, num_heads: int, head_dim: int, top_k: int) -> None: ...
    def select(self, query: F32, weights: F32, keys: F32) -> U32: ...

class StepStats:
    selections: int
    distinct: int
    hits: int
    misses: int
    into_free: int
    evictions: int
    bytes_moved: int

class AddressSpaceConfig:
    num_ranks: int
    num_groups: int
    entry_bytes: int
    device_bytes_per_rank: int
    host_bytes_per_rank: int
    device_slots_per_group: int
    host_slots_per_group: int
    page_tokens: int  # addresses in pages of page_tokens per request (64: FlashMLA's and SGLang's block)
    row_bytes: int  # one layer's row (656); 0: the entry is one row
    group_layers: list[int]  # layers of each group (any count); empty: entry_bytes / row_bytes each
    def __init__(self, num_ranks: int = 1, num_groups: int = 1, entry_bytes: int = 656,
                 device_bytes_per_rank: int = 0, host_bytes_per_rank: int = 0, policy: str = "pb_lru",
                 page_tokens: int = 64, row_bytes: int = 0, group_layers: list[int] = ...) -> None: ...
    def layers_of(self, group: int) -> int: ...
    def entry_bytes_of(self, group: int) -> int: ...
    def row(self) -> int: ...
    stable_new_entries: bool  # new entries on device, slot kept for the round (EngineStepPlanner turns it on)
    def validate(self) -> None: ...

class AddressSpace:
    config: AddressSpaceConfig
    num_live_addresses: int
    num_requests: int
    holds_bytes: bool
    def __init__(self, config: AddressSpaceConfig, backend: str = "cpu", faults: Optional[FaultPlan] = None) -> None: ...
    def fault_stats(self) -> FaultStats: ...
    def set_faults_armed(self, armed: bool) -> None: ...
    def add_request(self, request: int, rank: int = 0) -> None: ...
    def allocate(self, request: int, n_tokens: int) -> U32: ...
    def free(self, request: int) -> None: ...
    def write(self, addr: int, group: int, data: U8) -> None: ...
    def read(self, addr: int, group: int, out: U8) -> None: ...
    def lookup(self, addr: int, group: int) -> tuple[str, int, int]: ...
    def addresses_of(self, request: int) -> U32: ...
    def is_live(self, addr: int) -> bool: ...
    def advance_round(self) -> None: ...
    def num_used(self, rank: int, group: int, tier: str) -> int: ...
    def num_free(self, rank: int, group: int, tier: str) -> int: ...
    def device_pool(self, rank: int, group: int) -> U8: ...
    def device_layer(self, rank: int, group: int, layer: int) -> U8: ...
    def transfer_bytes(self) -> int: ...
    def check_invariants(self) -> None: ...

class FaultPlan:
    seed: int
    fail_every_nth: int
    fail_fraction: float
    partial: bool
    def __init__(self, seed: int = 1, fail_every_nth: int = 0, fail_fraction: float = 0.0, partial: bool = False,
                 copies: bool = True, swaps: bool = True, at_submit: bool = True, at_wait: bool = True) -> None: ...

class FaultStats:
    operations: int
    injected: int
    copies_failed: int
    swaps_failed: int
    waits_failed: int
    partial: int
    delayed: int
    fetches_failed: int
    moves_landed_before_failure: int

class StepPlanner:
    def __init__(self, space: AddressSpace) -> None: ...
    def step(self, rank: int, group: int, selections: U32, out_slots: U32,
             runs: list[tuple[int, int]]) -> StepStats: ...

class EngineStepPlanner:
    max_descriptors: int
    has_pending: bool
    def __init__(self, space: AddressSpace, max_batch: int, max_q_len: int, max_top_k: int,
                 top_k_multiple: int = 1) -> None: ...
    # selections/indices: int32 [batch, q_len, top_k] or [batch * q_len, top_k] (page_table_1).
    def step(self, rank: int, group: int, selections: I32, indices: I32, requests: Requests) -> StepStats: ...
    def plan(self, rank: int, group: int, selections: I32, indices: I32,
             descriptors: np.ndarray, requests: Requests) -> tuple[int, int, StepStats]: ...
    def complete(self, fence: int, status: U8) -> tuple[int, int]: ...
    def register_engine_memory(self, tier: str, rank: int, group: int, memory: EngineMemory) -> None: ...
    def execute_on_engine_memory(self, descriptors: np.ndarray, status: U8) -> None: ...

class TpConfig:
    num_ranks: int
    num_groups: int
    entry_bytes: int
    device_bytes_per_rank: int
    host_bytes_per_rank: int
    buffer_bytes_per_rank: int
    attention: str
    def __init__(self, num_ranks: int = 2, num_groups: int = 1, entry_bytes: int = 656,
                 attention: str = "local_buffer", device_bytes_per_rank: int = 0, host_bytes_per_rank: int = 0,
                 buffer_bytes_per_rank: int = 0, policy: str = "pb_lru") -> None: ...
    def validate(self) -> None: ...

class TpRankStepStats:
    distinct: int
    home_hits: int
    home_misses: int
    home_evictions: int
    buffer_hits: int
    remote_fetches: int
    buffer_evictions: int
    host_bytes: int
    remote_bytes: int
    elsewhere: int

class TpAddressSpace:
    num_live_addresses: int
    def __init__(self, config: TpConfig, backend: str = "cpu", faults: Optional[FaultPlan] = None) -> None: ...
    def shard_device_pool(self, rank: int, group: int) -> U8: ...
    def buffer_entry(self, rank: int, group: int, slot: int, out: U8) -> None: ...
    def add_request(self, request: int) -> None: ...
    def allocate(self, request: int, n_tokens: int) -> U32: ...
    def free(self, request: int) -> None: ...
    def write(self, addr: int, group: int, data: U8) -> None: ...
    def read(self, addr: int, group: int, out: U8) -> None: ...
    def home_of(self, addr: int) -> int: ...
    def is_live(self, addr: int) -> bool: ...
    def advance_round(self) -> None: ...
    def check_invariants(self) -> None: ...

class TpEngineStepPlanner:
    num_ranks: int
    device_slots: int
    index_slots: int
    def __init__(self, space: TpAddressSpace, max_batch: int, max_q_len: int, max_top_k: int) -> None: ...
    # indices: int32 [ranks, *selections.shape]
    def step(self, group: int, selections: I32, indices: I32, requests: Requests) -> list[TpRankStepStats]: ...

class TpStepPlanner:
    def __init__(self, space: TpAddressSpace) -> None: ...
    def step(self, group: int, selections: U32,
             runs: list[tuple[int, int]]) -> tuple[U8, U32, list[TpRankStepStats]]: ...

class UnifiedBufferConfig:
    capacity_bytes: int
    def __init__(self, capacity_bytes: int, kinds: list[tuple[str, int, str]], alignment: int = 64,
                 padding_kind: int = 0, padding_blocks: int = 0, compaction: str = "lazy") -> None: ...
    def validate(self) -> None: ...

class AllocatorStats:
    capacity_bytes: int
    reserved_bytes: int
    live_bytes: int
    hole_bytes: int
    middle_bytes: int
    live_blocks_per_kind: list[int]
    bytes_moved: int
    bytes_freed: int
    blocks_moved: int

class UnifiedBuffer:
    padding_offset: int
    def __init__(self, config: UnifiedBufferConfig) -> None: ...
    def allocate(self, demand: list[int]) -> U32: ...
    def can_allocate(self, demand: list[int]) -> bool: ...
    def free(self, id: int) -> None: ...
    def pin(self, id: int) -> None: ...
    def unpin(self, id: int) -> None: ...
    def kind_of(self, id: int) -> int: ...
    def offset(self, id: int) -> int: ...
    def translate(self, ids: U32, offsets: U64) -> None: ...
    def compact(self) -> int: ...
    def stats(self) -> AllocatorStats: ...
    def check_invariants(self) -> None: ...

class PrefixCacheConfig:
    page_tokens: int
    kv_kind: int
    state_kind: int  # -1: none (window pages only, no recurrent layer)
    window_kind: int  # -1: none
    sliding_window: int  # W counts the token itself: SGLang's sliding_window_size W - 1
    record_events: bool
    def __init__(self, page_tokens: int = 16, kv_kind: int = 1, state_kind: int = 0, window_kind: int = -1,
                 sliding_window: int = 0, record_events: bool = False) -> None: ...
    def validate(self) -> None: ...

class PrefixMatch:
    length: int
    pages: U32
    checkpoint_state: Optional[int]
    checkpoint_window: Optional[int]
    kv_length: int
    branch: int
    host_length: int
    path: U32
    copy_state: Optional[int]
    copy_window: Optional[int]
    window_pages: I64  # -1: outside the window or released

class EvictionStats:
    nodes: int
    pages: int
    checkpoints: int
    tombstones: int
    tokens: int
    offloaded: int
    window_pages: int
    offloaded_pages: int

class CacheEvent:
    type: str  # "page_stored" | "page_removed" | "state_stored" | "state_removed" | "window_stored" | "window_removed"
    block: int
    position: int
    hash: int  # pages and window pages: chained over the path's tokens (states: 0)
    parent_hash: Optional[int]  # stored pages: the previous page's hash (None: the first page)
    tokens: U32  # stored pages: the page's tokens

class KindBytes:
    evictable: int
    protected_bytes: int

class PrefixCacheMetrics:
    kv: KindBytes
    state: KindBytes
    window: KindBytes
    nodes: int
    checkpoints: int
    tombstones: int
    host_checkpoints: int
    host_hits: int
    host_pages: int
    host_page_hits: int

class PrefixCache:
    num_nodes: int
    num_checkpoints: int
    def __init__(self, config: PrefixCacheConfig, buffer: UnifiedBuffer) -> None: ...
    def match(self, tokens: U32, max_length: int) -> PrefixMatch: ...
    def match_copy_on_write(self, tokens: U32, max_length: int, rule: str = "allocation_aware") -> PrefixMatch: ...
    def lock(self, match: PrefixMatch) -> None: ...
    def unlock(self, match: PrefixMatch) -> None: ...
    def release_window(self, match: PrefixMatch) -> None: ...
    def insert(self, tokens: U32, pages: U32, checkpoints: list[tuple[int, int, int]] = ...,
               window_pages: Optional[I64] = None) -> int: ...
    def insert_chunk(self, tokens: U32, pages: U32, checkpoints: list[tuple[int, int, int]], held: PrefixMatch,
                     window_pages: Optional[I64] = None) -> PrefixMatch: ...
    def make_room(self, buffer: UnifiedBuffer, demand: list[int], rule: str = "allocation_aware") -> EvictionStats: ...
    def evict(self, kv_tokens: int, states: int = 0, window_tokens: int = 0) -> EvictionStats: ...
    def holds(self, tokens: U32) -> bool: ...
    def holds_on_host(self, tokens: U32) -> bool: ...
    def kv_on_host(self, tokens: U32) -> bool: ...
    def attach_host_tier(self, buffer: UnifiedBuffer, slots: int, page_slots: int = 0) -> None: ...
    def attach_copy_backend(self, buffer: UnifiedBuffer) -> None: ...
    def metrics(self) -> PrefixCacheMetrics: ...
    def take_events(self) -> list[CacheEvent]: ...
    def debug_digest(self) -> int: ...
    def check_invariants(self) -> None: ...
