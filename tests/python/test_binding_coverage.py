"""Python has what C++ has: every public member (method or field) of
every C++ class the package binds has a binding, or a stated reason in EXCLUDED.

The public members are read from the C++ headers of the bound classes (a small parser:
comments stripped, nested bodies dropped, public sections only). A C++ name maps to the
snake_case Python name (MatchCopyOnWrite -> match_copy_on_write) unless ALIASES says
otherwise. Every class the package binds must be listed in CLASSES (or NOT_CPP), and every
exclusion must still be needed: a stale one fails too, so the list stays the truth.
"""
import re
from pathlib import Path

import pytest

ulacache = pytest.importorskip("ulacache")

REPO = Path(__file__).resolve().parents[2]

# Python class -> (header, C++ class) whose public members it binds.
CLASSES = {
    "ModelConfig": ("src/config/model_config.h", "ModelConfig"),
    "HardwareConfig": ("src/config/hardware_config.h", "HardwareConfig"),
    "Indexer": ("src/indexer/indexer.h", "Indexer"),
    "StepStats": ("include/ula/step_stats.h", "StepStats"),
    "AddressSpaceConfig": ("include/ula/address_space.h", "AddressSpaceConfig"),
    "AddressSpace": ("include/ula/address_space.h", "AddressSpace"),
    "StepPlanner": ("include/ula/step_planner.h", "StepPlanner"),
    "TpConfig": ("include/ula/tp_address_space.h", "TpConfig"),
    "TpAddressSpace": ("include/ula/tp_address_space.h", "TpAddressSpace"),
    "UnifiedBufferConfig": ("include/ula/unified_buffer.h", "UnifiedBufferConfig"),
    "AllocatorStats": ("include/ula/hybrid_allocator.h", "AllocatorStats"),
    "UnifiedBuffer": ("include/ula/unified_buffer.h", "UnifiedBuffer"),
    "PrefixCacheConfig": ("include/ula/prefix_cache.h", "PrefixCacheConfig"),
    "PrefixMatch": ("include/ula/prefix_cache.h", "PrefixMatch"),
    "EvictionStats": ("include/ula/prefix_cache.h", "EvictionStats"),
    "CacheEvent": ("include/ula/prefix_events.h", "CacheEvent"),
    "KindBytes": ("include/ula/prefix_cache.h", "KindBytes"),
    "PrefixCacheMetrics": ("include/ula/prefix_cache.h", "PrefixCacheMetrics"),
    "PrefixCache": ("include/ula/prefix_cache.h", "PrefixCache"),
    "KvEventPublisherConfig": ("include/ula/kv_event_publisher.h", "KvEventPublisherConfig"),
    "KvEventPublisher": ("include/ula/kv_event_publisher.h", "KvEventPublisher"),
    "FaultPlan": ("src/backend/fault_backend.h", "FaultPlan"),
    "FaultStats": ("src/backend/fault_backend.h", "FaultStats"),
    "TpStepPlanner": ("include/ula/tp_step_planner.h", "TpStepPlanner"),
    "KvKind": ("include/ula/kv_kinds.h", "KvKind"),
    "KindPages": ("include/ula/kv_kinds.h", "KindPages"),
    "KindBlockCopy": ("include/ula/kv_kinds.h", "KindBlockCopy"),
    "PrefixShare": ("include/ula/kv_kinds.h", "PrefixShare"),
    "KindBudget": ("include/ula/address_space.h", "KindBudget"),
}

# Bound enums -> (header, C++ enum class): every enumerator is a Python value, named
# snake_case without the k (kPerRequest -> per_request), with the same number.
ENUMS = {
    "KindLifetime": ("include/ula/kv_kinds.h", "KindLifetime"),
    "KindPlacement": ("include/ula/kv_kinds.h", "KindPlacement"),
    "AttentionLayerType": ("src/config/model_config.h", "AttentionLayerType"),
}

# Bound Python classes with no C++ class of their own.
NOT_CPP = {}

# (Python class, C++ member) -> the Python name, where it is not the snake_case one.
ALIASES = {
    ("UnifiedBuffer", "AllocateDemand"): "allocate",
    ("PrefixCache", "Create"): "__init__",
    ("UnifiedBuffer", "Create"): "__init__",
    ("PrefixMatch", "checkpoint"): "checkpoint_state",  # and checkpoint_window
    ("PrefixMatch", "copy"): "copy_state",  # and copy_window
    ("PrefixCacheConfig", "Validate"): "validate",
    ("KvEventPublisherConfig", "Validate"): "validate",
    ("KvEventPublisher", "Create"): "__init__",
    ("UnifiedBufferConfig", "Validate"): "validate",
    ("AddressSpace", "Create"): "__init__",
    ("TpAddressSpace", "Create"): "__init__",
    ("StepPlanner", "Create"): "__init__",
    ("Indexer", "Create"): "__init__",
    ("TpStepPlanner", "Create"): "__init__",
    ("AddressSpace", "DeviceLayerBytes"): "device_layer",
    ("AddressSpace", "DevicePoolBytes"): "device_pool",
}
# attach_host_tier(buffer, slots, page_slots) and attach_copy_backend(buffer) take the
# buffer instead of HostTierConfig's backend and arenas: the host arena and the copies go on
# the Python buffer's own backend.


# (Python class, C++ member) -> why it has no binding.
EXCLUDED = {
    ("ModelConfig", "indexer_shape"): "the indexer's shape from the model's fields (index_heads, index_head_dim, top_k), which Python reads from ModelConfig itself",
    ("AddressSpace", "SetMoveExecutor"): "a C++ callback run inside Allocate; from Python, register_engine_memory installs the executor over the engine's memory",
    ("AddressSpaceConfig", "bytes_per_address"): "metadata accounting of the benches (ula bench metadata)",
    ("FaultPlan", "Validate"): "the FaultPlan constructor validates",
    ("FaultPlan", "at_submit"): "a FaultPlan constructor argument, not read back",
    ("FaultPlan", "at_wait"): "a FaultPlan constructor argument, not read back",
    ("FaultPlan", "copies"): "a FaultPlan constructor argument, not read back",
    ("FaultPlan", "swaps"): "a FaultPlan constructor argument, not read back",
    ("FaultPlan", "fetches"): "TP remote fetches are faulted through the fabric (src/tp/fault_fabric.h), which Python does not bind",
    # The hybrid prefix cache (: everything else is bound).
    ("PrefixCache", "SetEvictionObserver"): "a test hook called inside eviction; re-entering Python there is not supported",
    ("PrefixCache", "config"): "the cache's config is the PrefixCacheConfig the caller passed",
    ("UnifiedBuffer", "num_kinds"): "len(config.kinds) of the caller's UnifiedBufferConfig",
    ("UnifiedBuffer", "kind_config"): "the caller's UnifiedBufferConfig.kinds",
    ("UnifiedBuffer", "base"): "a raw pointer; bytes are reached through offset() on the engine's own memory",
    ("UnifiedBuffer", "LiveBlocks"): "a debugging listing for C++ tests; stats() has the counts",
    ("UnifiedBuffer", "DebugDigest"): "a C++ test helper (refused calls change nothing); not part of the engine API",
    ("UnifiedBuffer", "config"): "the UnifiedBufferConfig the caller passed",
    ("UnifiedBuffer", "arena"): "the arena lives on the buffer's own backend, not a Python object",
    ("UnifiedBufferConfig", "kinds"): "given to the constructor as (name, bytes, end) tuples",
    ("UnifiedBufferConfig", "alignment"): "a constructor argument",
    ("UnifiedBufferConfig", "padding_kind"): "a constructor argument",
    ("UnifiedBufferConfig", "padding_blocks"): "a constructor argument",
    ("UnifiedBufferConfig", "compaction"): "a constructor argument",
    ("UnifiedBufferConfig", "hold_bytes"): "the Python buffer always holds its bytes (on its own CPU backend)",
    # Raw memory and bench settings (: everything else is bound).
    ("AddressSpace", "DeviceSlotData"): "a raw pointer into a device pool; device_pool(rank, group)[slot] views the same bytes",
    ("AddressSpace", "Metadata"): "metadata accounting of the benches (ula bench metadata), as bytes_per_address",
    ("AddressSpace", "backend"): "the space owns its backend (the constructor's backend and faults arguments); holds_bytes, fault_stats and transfer_bytes read it",
    ("AddressSpaceConfig", "policy_options"): "the residency policies' tuning knobs (residency_policy.h PolicyOptions) are bench settings; Python spaces keep their defaults",
    ("TpAddressSpace", "RefData"): "a raw pointer; shard_device_pool(rank, group) and buffer_entry(rank, group, slot) read the same bytes",
    ("TpAddressSpace", "ShardMemory"): "raw memory for a fabric's one-sided reads (MPI windows); shard_device_pool and shard_host_pool view its pools",
    ("TpAddressSpace", "backend"): "the space owns its backend (the constructor's backend and faults arguments)",
    ("TpConfig", "policy_options"): "the residency policies' tuning knobs (residency_policy.h PolicyOptions) are bench settings; Python spaces keep their defaults",
}


def snake(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def class_body(text, cls):
    m = re.search(r"\b(class|struct)\s+" + re.escape(cls) + r"\b(\s+final)?\s*(:[^;{]*)?\{", text)
    assert m, f"{cls}: no definition found"
    depth, i = 1, m.end()
    out = []
    while depth > 0:
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 2:
                out.append(";")  # an inline body or a nested definition ends a declaration
        elif c == "}":
            depth -= 1
        elif depth == 1:
            out.append(c)
        i += 1
    return m.group(1), "".join(out)


def top_level_split(s, sep):
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def public_members(header, cls):
    kind, body = class_body(strip_comments((REPO / header).read_text()), cls)
    access = "public" if kind == "struct" else "private"
    members = set()
    for stmt in body.split(";"):
        while True:  # access labels open the statement
            m = re.match(r"\s*(public|private|protected)\s*:(?!:)", stmt)
            if not m:
                break
            access, stmt = m.group(1), stmt[m.end():]
        stmt = " ".join(stmt.split())
        if not stmt or access != "public":
            continue
        # Nested types, aliases and operators are not members a binding names.
        if re.match(r"(using|enum|struct|class|friend|static_assert|template)\b", stmt) or re.search(r"\boperator\b", stmt):
            continue
        head = stmt.split("=")[0] if "(" not in stmt.split("=")[0] else stmt
        if "(" in head:
            m = re.search(r"(~?\w+)\s*\(", head)
            name = m.group(1)
            if name in (cls, "~" + cls):
                continue
            members.add(name)
            continue
        for part in top_level_split(stmt, ","):
            decl = part.split("=")[0].strip()
            m = re.search(r"(\w+)\s*(\[[^\]]*\])?$", decl)
            if m:
                members.add(m.group(1))
    return members


def bound_classes():
    import ulacache._ulacache as ext
    return {name for name, obj in vars(ext).items()
            if isinstance(obj, type) and type(obj).__name__ == "pybind11_type"}


def test_every_bound_class_is_listed():
    unlisted = sorted(bound_classes() - set(CLASSES) - set(NOT_CPP) - set(ENUMS))
    assert not unlisted, f"bound classes missing from CLASSES (or NOT_CPP, ENUMS): {unlisted}"
    gone = sorted((set(CLASSES) | set(NOT_CPP) | set(ENUMS)) - bound_classes())
    assert not gone, f"listed classes the package no longer binds: {gone}"


def test_the_parser_reads_members():
    members = public_members("include/ula/prefix_cache.h", "PrefixCache")
    assert {"Match", "MatchCopyOnWrite", "InsertChunk", "ReleaseWindow", "Evict", "TakeEvents", "Metrics",
            "num_nodes", "SetEvictionObserver", "Create"} <= members
    assert not members & {"Node", "nodes_", "Split", "PrefixCache"}  # private, or the constructor
    fields = public_members("include/ula/prefix_cache.h", "PrefixCacheMetrics")
    assert {"kv", "state", "window", "nodes", "checkpoints", "host_page_hits"} <= fields


@pytest.mark.parametrize("py_name", sorted(CLASSES))
def test_every_public_member_is_bound_or_excluded(py_name):
    header, cpp = CLASSES[py_name]
    cls = getattr(ulacache, py_name)
    missing, stale = [], []
    for member in sorted(public_members(header, cpp)):
        key = (py_name, member)
        attr = ALIASES.get(key, snake(member))
        bound = hasattr(cls, attr) or hasattr(cls, member)
        if key in EXCLUDED:
            if bound and key not in ALIASES:
                stale.append(member)
        elif not bound:
            missing.append(f"{member} (as {attr})")
    for (cls_name, member) in EXCLUDED:
        if cls_name == py_name and member not in public_members(header, cpp):
            stale.append(member + " (no longer a public member)")
    assert not missing, f"{py_name}: public C++ members with neither a binding nor a reason in EXCLUDED: {missing}"
    assert not stale, f"{py_name}: excluded members that are bound now (remove them from EXCLUDED): {stale}"


def enumerators(header, name):
    text = strip_comments((REPO / header).read_text())
    m = re.search(r"\benum\s+class\s+" + re.escape(name) + r"\b[^{;]*\{([^}]*)\}", text)
    assert m, f"{name}: no enum class found in {header}"
    out = {}
    for item in m.group(1).split(","):
        item = item.strip()
        if item:
            key, value = (x.strip() for x in item.split("="))
            out[snake(key[1:])] = int(value)
    return out


@pytest.mark.parametrize("py_name", sorted(ENUMS))
def test_every_enumerator_is_bound_with_its_value(py_name):
    header, cpp = ENUMS[py_name]
    cls = getattr(ulacache, py_name)
    bound = {name: int(value) for name, value in cls.__members__.items()}
    assert bound == enumerators(header, cpp)
