# Type stubs of the ulacache package (the bindings in python/src/*.cc; the C++ contracts
# in include/ula/*.h). Arrays are numpy arrays, or CPU tensors with __dlpack__ (torch), of
# exactly the dtype named; nothing is cast or copied (engine memory: any dtype, taken as
# bytes). A CUDA tensor raises UnsupportedError (the planners read and write on the host).
from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]
Tensor = Any  # a numpy array or an object with __dlpack__ (torch.Tensor on the CPU)
# Request ids of a step: int32 (vLLM's req_id_per_token), uint32, int64 (torch's
# req_pool_indices) or uint64 [batch].
Requests = Union[U64, I64, I32, U32, Tensor]
# Engine-owned memory of a pool: [layers, <layer>], or the layers' <layer> tensors as a list
# (SGLang) or a dict in layer order (vLLM's register_kv_caches), at any addresses. A <layer>
# is [slots, row_bytes] (SGLang), [num_blocks, block_size, row_bytes] (vLLM) or any shape
# whose last dimensions make one row of row() bytes, in any dtype taken as bytes (bf16, fp8).
EngineMemory = Union[np.ndarray, Tensor, list, dict]
# Copy descriptors: a DESCRIPTOR_DTYPE array, or columns {field: int32 / int64 [rows]}.
Descriptors = Union[np.ndarray, dict[str, Any]]
# vLLM's query_start_loc: int32 or int64 [batch + 1].
QueryStartLoc = Optional[Union[I32, I64, Tensor]]

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
# dst_tier, op (u1), num_layers (u2: rows of `bytes` per descriptor, one per layer),
# evict_slot (u4: EVICT's host slot for the victim's row, written before the fill).
DESCRIPTOR_DTYPE: np.dtype
DESCRIPTOR_FIELDS: tuple[str, ...]
# {field: numpy [n]} (offsets int64, the rest int32): plan's descriptors as columns.
def descriptor_columns(n: int, fields: tuple[str, ...] = ...) -> dict[str, np.ndarray]: ...
COPY: int
SWAP: int
EVICT: int
# complete()'s status for an EVICT whose victim row landed on host but whose fill did not.
EVICT_LANDED: int
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
    # the layer-kind group (DeepSeek-V4; empty / 0 without layer kinds)
    compress_ratios: list[int]
    sliding_window: int
    compress_rate_csa: int
    compress_rate_hca: int
    kv_entry_bytes_fp8_uniform: int
    kv_entry_bytes_bf16: int
    index_key_bytes_fp4: int
    compressor_state_bytes_per_value: int
    has_layer_kinds: bool
    def layer_kind(self, layer: int) -> AttentionLayerType: ...
    def num_layers_of_kind(self, kind: AttentionLayerType) -> int: ...
    def group_layers(self, group: int) -> int: ...
    kv_lora_bytes_per_value: int
    kv_scale_bytes: int
    rope_bytes_per_value: int
    index_key_bytes_per_value: int
    index_key_scale_bytes: int
    kv_bytes_per_token: int
    index_key_bytes_per_token: int
    def validate(self) -> None: ...

class HardwareConfig:
    name: str
    device_memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float
    host_link_bandwidth_bytes_per_s: float
    host_memory_bytes_per_gpu: int
    gpus_per_node: int
    dense_bf16_flops: float
    dense_fp8_flops: float
    def validate(self) -> None: ...

def parse_model_config(json_text: str) -> ModelConfig: ...
def load_model_config(path: str) -> ModelConfig: ...
def load_hardware_config(path: str) -> HardwareConfig: ...

class Indexer:
    top_k: int
    def __init__(self, num_heads: int, head_dim: int, top_k: int) -> None: ...
    def select(self, query: F32, weights: F32, keys: F32) -> U32: ...
    shape: tuple[int, int, int]  # (num_heads, head_dim, top_k)
    def score(self, query: F32, weights: F32, keys: F32) -> F32: ...
    def select_union(self, queries: list[tuple[F32, F32]], keys: F32) -> tuple[list[U32], U32]: ...

class StepStats:
    selections: int
    distinct: int
    hits: int
    misses: int
    into_free: int
    evictions: int
    bytes_moved: int
    shadow_evictions: int  # evictions that moved no bytes (a live host shadow)
    evict_copies: int  # evictions copied device->host into a free or reclaimed host slot
    # TP: the local buffer's (entries homed elsewhere), and attention at home's
    buffer_hits: int
    remote_fetches: int
    buffer_evictions: int
    remote_bytes: int
    source_batches: int
    elsewhere: int  # homed elsewhere, left to the home rank's partial

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
                 page_tokens: int = 64, row_bytes: int = 0, group_layers: list[int] = ...,
                 stable_new_entries: bool = False, host_shadows: bool = False,
                 device_placement: bool = False) -> None: ...
    def layers_of(self, group: int) -> int: ...
    def entry_bytes_of(self, group: int) -> int: ...
    def row(self) -> int: ...
    stable_new_entries: bool  # new entries on device, slot kept for the round (StepPlanner requires it on)
    host_shadows: bool  # fetched entries keep their host slot as a clean copy; off by default
    device_placement: bool  # allocate hands out addresses, the device step places them (take_placement)
    policy: str
    kinds: list[KvKind]  # assign a whole list (the getter returns a copy); empty: one kind
    kind_frame_bytes: int  # with kinds: 0 = logical blocks; else every kind from one budget in frames
    def validate(self) -> None: ...

# DeepSeek-V4's kinds (include/ula/kv_kinds.h; docs/ARCHITECTURE.md "Kinds").
class KindLifetime:  # a pybind11 enum: KindLifetime.ring, int(x), x.name
    ring: KindLifetime
    append: KindLifetime
    per_request: KindLifetime
    name: str
    value: int
    def __int__(self) -> int: ...

class KindPlacement:  # a pybind11 enum: KindPlacement.sparse, int(x), x.name
    sparse: KindPlacement
    resident: KindPlacement
    name: str
    value: int
    def __int__(self) -> int: ...

class AttentionLayerType:  # a pybind11 enum: AttentionLayerType.sliding_window, int(x), x.name
    sliding_window: AttentionLayerType
    compressed_sparse: AttentionLayerType
    heavily_compressed: AttentionLayerType
    name: str
    value: int
    def __int__(self) -> int: ...

class KvKind:
    name: str
    tokens_per_entry: int
    lifetime: KindLifetime
    ring_tokens: int
    ring_draft_tokens: int
    state_rows: int
    layers: int
    row_bytes: int
    companion_of: Optional[int]
    placement: KindPlacement
    def __init__(self, name: str, tokens_per_entry: int = 1, lifetime: KindLifetime = KindLifetime.append,
                 ring_tokens: int = 0, ring_draft_tokens: int = 0, state_rows: int = 0, layers: int = 0,
                 row_bytes: int = 0, companion_of: Optional[int] = None,
                 placement: KindPlacement = KindPlacement.resident) -> None: ...
    def entry_bytes(self) -> int: ...

class KindPages:
    tokens: int
    entries: int
    entries_per_block: int
    first_offset: int
    filling_tokens: int
    blocks: I32  # read-only view, [ceil((first_offset + entries) / entries_per_block)]

class KindBlockCopy:
    kind: int
    src_block: int
    dst_block: int
    entries: int

class PrefixShare:
    resume_from: int
    copies: list[KindBlockCopy]

class KindBudget:
    frames: int
    free_frames: int
    frames_of_kind: list[int]
    c4_device_slots: int
    c4_entries: int
    c4_on_device: int

KIND_BLOCK_ENTRIES: int
KIND_FRAME_BYTES: int
def validate_kinds(kinds: list[KvKind]) -> None: ...
def kinds_of_model(model: ModelConfig, kv_format: str = "fp8_packed", index_format: str = "fp8",
                   max_draft_tokens: int = 0) -> list[KvKind]: ...
def space_config_of_model(model: ModelConfig, base: AddressSpaceConfig = ..., kv_format: str = "fp8_packed",
                          index_format: str = "fp8", max_draft_tokens: int = 0) -> AddressSpaceConfig: ...
# Python helpers over kind_pages_of (python/ulacache/__init__.py)
def newest_entry(pages: KindPages) -> Optional[tuple[int, int]]: ...
def kind_block_table(space: AddressSpace, requests: Sequence[int], kind: int, width: Optional[int] = None) -> I32: ...

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
    # device_placement only: {"new_requests": [(id, tag, rank)], "retired": [id], "seated": [[(addr, tag)]
    # per rank], "released": [U32 per rank]} since the last call; FailedPreconditionError outside the mode.
    def take_placement(self) -> dict[str, Any]: ...
    def free(self, request: int) -> None: ...
    def truncate(self, request: int, length: int) -> None: ...
    def write(self, addr: int, group: int, data: U8) -> None: ...
    def read(self, addr: int, group: int, out: U8) -> None: ...
    def lookup(self, addr: int, group: int) -> tuple[str, int, int]: ...
    # vLLM's slot_mapping of every group: out int64 [num_groups, n] (or [n]); -1 stays -1
    def slot_mapping(self, addrs: Union[U32, I32, I64, Tensor], out: I64, rank: int = 0) -> None: ...
    def addresses_of(self, request: int) -> U32: ...
    def is_live(self, addr: int) -> bool: ...
    def advance_round(self) -> None: ...
    def num_used(self, rank: int, group: int, tier: str) -> int: ...
    def num_host_shadows(self, rank: int, group: int) -> int: ...
    def num_free(self, rank: int, group: int, tier: str) -> int: ...
    def device_pool(self, rank: int, group: int) -> U8: ...
    def device_layer(self, rank: int, group: int, layer: int) -> U8: ...
    def transfer_bytes(self) -> int: ...
    def check_invariants(self) -> None: ...
    def share_into(self, request: int, addrs: U32) -> None: ...
    def retain(self, addrs: U32) -> None: ...
    def release(self, addrs: U32) -> None: ...
    def ref_count(self, addr: int) -> int: ...
    def holds(self, request: int, addr: int) -> bool: ...
    def rank_of(self, request: int) -> int: ...
    def debug_digest(self) -> int: ...
    def kind_pages_of(self, request: int, kind: int) -> KindPages: ...
    def share_prefix(self, request: int, source: int, tokens: int) -> PrefixShare: ...
    def kind_budget_of(self) -> KindBudget: ...
    def compact_kind(self, kind: int) -> int: ...
    def device_layer_view(self, rank: int, group: int, layer: int) -> U8: ...
    def kind_layer_view(self, kind: int, layer: int) -> U8: ...

class FaultPlan:
    seed: int
    fail_every_nth: int
    fail_fraction: float
    partial: bool
    def __init__(self, seed: int = 1, fail_every_nth: int = 0, fail_fraction: float = 0.0, partial: bool = False,
                 copies: bool = True, swaps: bool = True, at_submit: bool = True, at_wait: bool = True,
                 delay_us: float = 0.0) -> None: ...
    delay: float  # microseconds

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
    max_descriptors: int
    has_pending: bool
    # {args_ns, planner_ns, outputs_ns} of the last successful plan call (for measurement)
    last_plan_timing: dict[str, int]
    # StepPlanner(space): the library path only (step_runs); with an engine shape, both paths.
    def __init__(self, space: AddressSpace, max_batch: int | None = None, max_q_len: int | None = None,
                 max_top_k: int | None = None, top_k_multiple: int = 1, max_rows: int = 0) -> None: ...
    # selections/indices: int32 [batch, q_len, top_k] or [batch * q_len, top_k] (page_table_1).
    # query_start_loc: request b owns rows [qsl[b], qsl[b+1]) of [tokens, top_k] selections.
    def step(self, rank: int, group: int, selections: I32, indices: I32, requests: Requests,
             query_start_loc: QueryStartLoc = None) -> StepStats: ...
    # The library layout: uint32 selections cut into runs [(request, count), ...], uint32 out_slots.
    def step_runs(self, rank: int, group: int, selections: U32, out_slots: U32,
                  runs: list[tuple[int, int]]) -> StepStats: ...
    def plan(self, rank: int, group: int, selections: I32, indices: I32,
             descriptors: Descriptors, requests: Requests,
             query_start_loc: QueryStartLoc = None) -> tuple[int, int, StepStats]: ...
    def complete(self, fence: int, status: U8) -> tuple[int, int]: ...
    # (device_needed, device_room) of the largest group; ResourceExhaustedError when the round does not fit
    def reserve_round(self, rank: int, requests: Requests, new_tokens: np.ndarray, max_selections: U32) -> tuple[int, int]: ...
    def register_engine_memory(self, tier: str, rank: int, group: int, memory: EngineMemory) -> None: ...
    def execute_on_engine_memory(self, descriptors: Descriptors, status: U8) -> None: ...
    # threads of steps 1-3 and their knobs (step_planner.h); refused while a plan is pending
    def set_options(self, threads: int = 1, prefetch_distance: int = 16,
                    parallel_claim_min_victims: int = 4194304) -> None: ...
    options: dict[str, int]
    counters: dict[str, int]

class TpConfig:
    num_ranks: int
    num_groups: int
    entry_bytes: int
    device_bytes_per_rank: int
    host_bytes_per_rank: int
    buffer_bytes_per_rank: int
    page_tokens: int
    stable_new_entries: bool  # new entries on device, slot kept for the round (TpStepPlanner requires it on)
    host_shadows: bool  # each shard's fetched entries keep their host slot as a clean copy; off by default
    kinds: list[KvKind]  # DeepSeek-V4's kinds (as AddressSpaceConfig.kinds); with kinds, attention must be 'at_home'
    attention: str
    policy: str
    buffer_policy: str
    device_slots_per_group: int
    host_slots_per_group: int
    buffer_slots_per_group: int
    shard_slots_per_group: int
    def __init__(self, num_ranks: int = 2, num_groups: int = 1, entry_bytes: int = 656,
                 attention: str = "local_buffer", device_bytes_per_rank: int = 0, host_bytes_per_rank: int = 0,
                 buffer_bytes_per_rank: int = 0, policy: str = "pb_lru", page_tokens: int = 64,
                 stable_new_entries: bool = False, host_shadows: bool = False) -> None: ...
    def validate(self) -> None: ...

class TpAddressSpace:
    num_live_addresses: int
    def __init__(self, config: TpConfig, backend: str = "cpu", faults: Optional[FaultPlan] = None) -> None: ...
    def shard_device_pool(self, rank: int, group: int, writable: bool = False) -> U8: ...
    def shard_host_pool(self, rank: int, group: int, writable: bool = False) -> U8: ...
    def buffer_entry(self, rank: int, group: int, slot: int, out: U8) -> None: ...
    def add_request(self, request: int) -> None: ...
    def allocate(self, request: int, n_tokens: int) -> U32: ...
    def free(self, request: int) -> None: ...
    def truncate(self, request: int, length: int) -> None: ...
    def write(self, addr: int, group: int, data: U8) -> None: ...
    def read(self, addr: int, group: int, out: U8) -> None: ...
    def home_of(self, addr: int) -> int: ...
    def is_live(self, addr: int) -> bool: ...
    def advance_round(self) -> None: ...
    def check_invariants(self) -> None: ...
    config: TpConfig
    num_requests: int
    hosted_ranks: list[int]
    def hosts(self, rank: int) -> bool: ...
    def addresses_of(self, request: int) -> U32: ...
    def kind_pages_of(self, request: int, kind: int, rank: int) -> KindPages: ...
    def window_home_of(self, request: int) -> int: ...
    def lookup(self, addr: int, group: int) -> tuple[str, int, int]: ...
    # vLLM's slot_mapping of every group: out int64 [num_groups, n] (or [n]); -1 stays -1
    def slot_mapping(self, addrs: Union[U32, I32, I64, Tensor], out: I64, rank: int = 0) -> None: ...
    def buffer_slot(self, rank: int, addr: int, group: int) -> Optional[int]: ...
    def num_used(self, rank: int, group: int, tier: str) -> int: ...
    def num_free(self, rank: int, group: int, tier: str) -> int: ...
    def num_new_on_host(self, rank: int, group: int) -> int: ...
    def num_host_shadows(self, rank: int, group: int) -> int: ...
    def num_buffered(self, rank: int, group: int) -> int: ...
    def num_homed(self, rank: int) -> int: ...
    def share_into(self, request: int, addrs: U32) -> None: ...
    def retain(self, addrs: U32) -> None: ...
    def release(self, addrs: U32) -> None: ...
    def ref_count(self, addr: int) -> int: ...
    def holds(self, request: int, addr: int) -> bool: ...
    def debug_digest(self) -> int: ...

class TpStepPlanner:
    num_ranks: int
    ranks: list[int]
    device_slots: int
    index_slots: int
    max_descriptors: int
    has_pending: bool
    # TpStepPlanner(space): the library path only (step_runs, check); with an engine shape, both paths.
    def __init__(self, space: TpAddressSpace, max_batch: int | None = None, max_q_len: int | None = None,
                 max_top_k: int | None = None, max_rows: int = 0) -> None: ...
    # indices: int32 [ranks, *selections.shape]
    def reserve_round(self, requests: Requests, new_tokens: U32, max_selections: U32) -> tuple[int, int]: ...
    def step(self, group: int, selections: I32, indices: I32, requests: Requests) -> list[StepStats]: ...
    # (fence, n, stats, first_phase): descriptors[:first_phase] the local buffer's remote fetches (0 at
    # home), then every rank's home moves; every fetch completes before any home move starts
    def plan(self, group: int, selections: I32, indices: I32, descriptors: Descriptors,
             requests: Requests) -> tuple[int, int, list[StepStats], int]: ...
    def complete(self, fence: int, status: U8) -> tuple[int, int]: ...
    def execute_on_shards(self, descriptors: Descriptors, status: U8) -> None: ...
    # The library layout: uint32 selections cut into runs [(request, count), ...].
    def step_runs(self, group: int, selections: U32,
                  runs: list[tuple[int, int]]) -> tuple[U8, U32, list[StepStats]]: ...
    def check(self, group: int, selections: U32, runs: list[tuple[int, int]]) -> None: ...

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
    event_hash: str  # "sglang" (SHA-256, SGLang's) or "debug"
    window_recency: str  # "cushion" (SGLang's window LRU) or "path"
    unaligned_tail: str  # "keep" (the partial last page stays cached) or "drop" (SGLang's)
    def __init__(self, page_tokens: int = 16, kv_kind: int = 1, state_kind: int = 0, window_kind: int = -1,
                 sliding_window: int = 0, record_events: bool = False, event_hash: str = "sglang",
                 window_recency: str = "cushion", unaligned_tail: str = "keep") -> None: ...
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
    type: str  # "page_stored" | "page_removed" | "state_stored" | "state_removed" | "window_stored" | "window_removed" | "all_cleared"
    block: Optional[int]  # None on the host medium and for all_cleared
    position: int
    hash: int  # pages and window pages: SGLang's signed 64-bit block hash by default (states: 0)
    parent_hash: Optional[int]  # stored pages: the previous page's hash (None: the first page)
    tokens: U32  # stored pages: the page's tokens
    medium: str  # "GPU" (device) or "CPU" (host tier)
    group: int  # the kinds cache's events: vLLM's group_idx (-1: none)
    spec_kind: str  # the kinds cache's events: vLLM's kv_cache_spec_kind ("" when none)
    spec_window: int  # a sliding-window kind's window (0 otherwise)
    stored: bool
    kv: bool
    window: bool
    state: bool

class KvEventPublisherConfig:
    endpoint: str  # bound; "tcp://127.0.0.1:*" takes a free port
    topic: str
    block_size: int  # the cache's page_tokens
    sliding_window: int  # the cache's sliding_window
    data_parallel_rank: Optional[int]  # None: left out of each KVEventBatch
    send_high_water_mark: int
    def __init__(self, endpoint: str = "tcp://127.0.0.1:5557", topic: str = "", block_size: int = 16,
                 sliding_window: int = 0, data_parallel_rank: Optional[int] = None,
                 send_high_water_mark: int = 100000) -> None: ...
    def validate(self) -> None: ...

class KvEventPublisher:
    """SGLang's / vLLM's KVEventBatch over a bound ZeroMQ PUB socket: [topic, seq, payload]."""
    def __init__(self, config: KvEventPublisherConfig) -> None: ...
    @property
    def endpoint(self) -> str: ...  # the port chosen for "*"
    def publish(self, events: Sequence[CacheEvent], ts: float) -> int: ...  # the batch's sequence number
    def encode(self, events: Sequence[CacheEvent], ts: float) -> bytes: ...  # its msgpack payload

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
    def stored_blocks(self) -> list[CacheEvent]: ...
    def reset(self) -> None: ...
    def debug_digest(self) -> int: ...
    def check_invariants(self) -> None: ...
