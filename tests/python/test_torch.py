"""The engine step API with torch tensors (Debian's python3-torch, CPU): selections,
indices, int64 request ids (torch's req_pool_indices) and engine-owned per-layer KV caches
as torch tensors, viewed through DLPack, never copied. Its own ctest (python_ulacache_torch:
importing torch takes seconds); skipped, with the reason, where torch is not installed
(deps/debian-packages.txt does not list it: see docs/INTEGRATION.md, "Tensors")."""
import numpy as np
import pytest

import ulacache

torch = pytest.importorskip("torch", reason="python3-torch is not installed (optional: docs/INTEGRATION.md, Tensors)")

ENTRY = 64


def pattern(addr):
    return ((np.arange(ENTRY) + addr * 131) & 0xFF).astype(np.uint8)


def test_torch_tensors_in_and_out_on_a_counting_space():
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, row_bytes=ENTRY // 2,
                                      device_bytes_per_rank=16 * ENTRY, host_bytes_per_rank=48 * ENTRY)
    space = ulacache.AddressSpace(cfg, backend="counting")
    planner = ulacache.EngineStepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    # vLLM-style: one tensor per layer, views of one allocation, handed over as a dict.
    dev = torch.zeros((2, 16, ENTRY // 2), dtype=torch.uint8)
    host = torch.zeros((2, 48, ENTRY // 2), dtype=torch.uint8)
    planner.register_engine_memory("device", 0, 0, {f"layers.{l}": t for l, t in enumerate(dev.unbind(0))})
    planner.register_engine_memory("host", 0, 0, list(host.unbind(0)))      # SGLang-style list
    mem = {"device": dev, "host": host}
    addrs = {}
    for r in (0, 1):
        space.add_request(r)
        addrs[r] = space.allocate(r, 20)
        for a in addrs[r]:
            tier, _, slot = space.lookup(int(a), 0)
            mem[tier][:, slot] = torch.from_numpy(pattern(int(a)).reshape(2, -1))
    space.advance_round()
    sel = torch.full((4, 4), -1, dtype=torch.int32)                           # page_table_1 [tokens, top_k]
    sel[0, :3] = torch.tensor(addrs[0][10:13].astype(np.int32))
    sel[1, :2] = torch.tensor(addrs[0][15:17].astype(np.int32))
    sel[2, :4] = torch.tensor(addrs[1][4:8].astype(np.int32))
    sel[3, :1] = torch.tensor(addrs[1][19:20].astype(np.int32))
    idx = torch.full_like(sel, 99)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    req = torch.tensor([0, 1], dtype=torch.int64)                              # req_pool_indices
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, req)
    status = torch.zeros(n, dtype=torch.uint8)
    planner.execute_on_engine_memory(desc[:n], status)
    assert planner.complete(fence, status) == (n, 0)
    assert int((idx == 99).sum()) == 0                                         # written in place
    for s, i in zip(sel.reshape(-1).tolist(), idx.reshape(-1).tolist()):
        assert (i < 0) == (s < 0)
        if s >= 0:
            assert (dev[:, i].reshape(-1).numpy() == pattern(s)).all()
    # FlashMLA's view of a layer: k_cache[num_blocks, block, 1, row] over the same memory.
    assert dev[0].view(1, 16, 1, ENTRY // 2).data_ptr() == dev[0].data_ptr()


def test_torch_refusals():
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, device_bytes_per_rank=8 * ENTRY,
                                      host_bytes_per_rank=48 * ENTRY)
    space = ulacache.AddressSpace(cfg)
    space.add_request(0)
    addrs = space.allocate(0, 8)
    space.advance_round()
    planner = ulacache.EngineStepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    sel = torch.tensor(addrs[:8].astype(np.int32)).reshape(2, 1, 4).repeat(1, 2, 1)   # [batch 2, q_len 2, 4]
    idx = torch.zeros_like(sel)
    req = torch.tensor([0, 0])
    with pytest.raises(ulacache.InvalidArgumentError, match="C-contiguous"):   # the [:, :1] view
        planner.step(0, 0, sel[:, :1], idx[:, :1].contiguous(), req)
    with pytest.raises(ulacache.InvalidArgumentError, match="dtype"):
        planner.step(0, 0, sel.to(torch.int64), idx, req)
    assert int((idx != 0).sum()) == 0
    st = planner.step(0, 0, sel, idx, req)
    assert st.selections == 16
