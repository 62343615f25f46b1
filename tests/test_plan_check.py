"""Check mode guards a plan's buffers: reshaped, resized or reallocated since the plan was made, or the plan
freed, raises ``HpccollError`` on every rank (never a hang, never the old buffer read silently), also where
only one rank changed its buffer. Without check mode a plan reads the buffer it was made with."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree, raises_everywhere

import hpccoll
from hpccoll import HpccollError

pytestmark = pytest.mark.mpi

COLLECTIVES = [
    (hpccoll.all_reduce, {}),
    (hpccoll.all_gather, {}),
    (hpccoll.broadcast, {"root": 0}),
    (hpccoll.shift, {}),
]


@pytest.mark.parametrize("collective, options", COLLECTIVES, ids=lambda v: getattr(v, "__name__", ""))
def test_check_mode_refuses_a_reshaped_buffer_on_every_rank(comm, collective, options):
    with hpccoll.Communicator(comm, check=True) as c:
        x = np.arange(6.0) + c.rank
        p = hpccoll.plan(collective, x, c, **options)
        want = collective(x, c, **options)
        agree(c, np.array_equal(p(), want), "a call before any change")
        for who in {0, c.size - 1}:  # every rank, then one rank only (the others unchanged)
            if c.rank == who:
                x.shape = (2, 3)  # the same memory, another shape
            raises_everywhere(c, HpccollError, r"plan of \w+: x changed since the plan was made", p)
            x.shape = (6,)
            agree(c, np.array_equal(p(), want), "a call after the shape came back")
        p.free()
        raises_everywhere(c, HpccollError, r"the plan was freed; expected a live plan", p)
        raises_everywhere(c, HpccollError, r"the plan was freed; expected a live plan", lambda: p.start())


def test_check_mode_refuses_a_resized_buffer(comm):
    with hpccoll.Communicator(comm, check=True) as c:
        x = np.ones(4)
        with hpccoll.plan(hpccoll.all_reduce, x, c) as p:
            if c.rank == c.size - 1:
                x.resize(8, refcheck=False)  # reallocated: the plan's buffer may be gone
            raises_everywhere(c, HpccollError, r"x changed since the plan was made", p)


def test_without_check_mode_the_plan_reads_its_own_buffer(comm):
    """Rebinding the name leaves the plan on the old buffer (the documented pitfall); no exchange per call."""
    with hpccoll.Communicator(comm, check=False) as c:
        x = np.ones(3)
        with hpccoll.plan(hpccoll.all_reduce, x, c) as p:
            kept = x
            x = np.full(3, 5.0)  # noqa: F841 - a new array the plan never sees
            agree(c, np.array_equal(p(), np.full(3, c.size)) and np.array_equal(kept, np.ones(3)), "old buffer")
