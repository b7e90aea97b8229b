"""Device placement from Python (docs/ARCHITECTURE.md "The device step"): the space hands out
addresses without placing them and journals what the device step's Place must apply;
outside the mode take_placement is refused, and the host step refuses the mode."""
import pytest

import ulacache


def config(device_placement):
    return ulacache.AddressSpaceConfig(entry_bytes=32, device_bytes_per_rank=64 * 32, host_bytes_per_rank=256 * 32,
                                       page_tokens=8, policy="kernel_pb_lru", stable_new_entries=True,
                                       device_placement=device_placement)


def test_the_journal_names_every_seat_release_and_request():
    space = ulacache.AddressSpace(config(True))
    space.add_request(1, 0)
    space.add_request(2, 0)
    a = space.allocate(1, 5)
    b = space.allocate(2, 3)
    j = space.take_placement()
    assert sorted(r[0] for r in j["new_requests"]) == [1, 2]
    tags = {r[0]: r[1] for r in j["new_requests"]}
    assert all(t != 0 for t in tags.values()) and tags[1] != tags[2]
    assert [s[0] for s in j["seated"][0]] == [int(x) for x in list(a) + list(b)]  # allocate order
    assert [s[1] for s in j["seated"][0]] == [tags[1]] * 5 + [tags[2]] * 3
    assert len(j["released"][0]) == 0 and j["retired"] == []
    space.check_invariants()
    # The journal was taken: the next one holds only what came after.
    space.free(2)
    j = space.take_placement()
    assert j["retired"] == [2] and sorted(int(x) for x in j["released"][0]) == sorted(int(x) for x in b)
    assert j["new_requests"] == [] and j["seated"][0] == []
    space.check_invariants()


def test_the_mode_is_refused_where_it_does_not_exist():
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.AddressSpaceConfig(entry_bytes=32, device_bytes_per_rank=64 * 32, host_bytes_per_rank=64 * 32,
                                    device_placement=True).validate()  # without stable_new_entries
    plain = ulacache.AddressSpace(config(False))
    with pytest.raises(ulacache.FailedPreconditionError):
        plain.take_placement()
    placed = ulacache.AddressSpace(config(True))
    with pytest.raises(ulacache.UnsupportedError):  # the engine path, at its creation
        ulacache.StepPlanner(placed, max_batch=2, max_q_len=1, max_top_k=8)
