import numpy as np
import pytest

from latte import _native, __version__
from latte.memory import BuddyArena
from latte.scheduling import AffinityScheduler


def test_native_core_reports_its_build():
    info = _native.build_info()
    assert info["version"] == __version__
    assert isinstance(info["cuda"], bool)
    assert info["compiler"].split()[0] in ("gcc", "clang")


def test_one_exception_hierarchy_maps_every_part_of_the_core_to_python():
    """latte::logic_error -> ValueError naming the file and line of the broken precondition;
    latte::out_of_memory -> MemoryError with the sizes involved."""
    with pytest.raises(ValueError, match=r"^latte: \S*memory/buddy_arena\.cpp:\d+: min_block must be a power of two"):
        BuddyArena(1 << 20, min_block=300)
    with pytest.raises(ValueError, match=r"^latte: \S*scheduling/scheduler_core\.cpp:\d+: max_batch_size must be at least 1"):
        AffinityScheduler(lambda key, ids, lane: None, lambda request_id, error: None, max_batch_size=0)
    with pytest.raises(MemoryError, match="BuddyArena: cannot allocate 2097152 bytes: capacity 1048576"):
        BuddyArena(1 << 20).empty(2 << 20, np.uint8)
