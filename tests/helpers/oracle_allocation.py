"""TEST ORACLE: the simulator's former in-memory allocation model (sage_tfx/simulate/allocation.py until
the allocation module), kept as an independent implementation of the allocation rules. The simulator and the
ledger now share sage_tfx/privacy/allocation.py; tests/privacy/test_allocation.py drives this copy and that
module with the same random workloads and checks they agree. Do not import it from sage_tfx.

The original docstring follows.

A numpy-free, in-memory model of the ledger's budget allocation, used to CHOOSE blocks fast.

The simulator asks, hundreds of times per simulated hour, "on which blocks can
pipeline p still spend this cost?". The ledger answers it in one read
(``Ledger.available_per_block``), but a read of every block's state per
question is still too slow at the simulation's scale, so this class keeps the
same state in memory and applies the same rules, written from the Sage paper §3.3
and using the real filter's ``admits``/``fits_share``:

* a new block's capacity is split evenly among the pipelines waiting then;
* a charge draws on the pipeline's own reservation if it fits there, else on
  the unreserved pool (capacity not reserved, minus what was spent outside
  reservations);
* a finished pipeline keeps what it used; the rest of each of its
  reservations on active blocks is split evenly among those still waiting;
* a block that cannot admit ``min_epsilon`` more is retired.

It only proposes: every charge is then made by the real ledger, which refuses
anything this model gets wrong, and the tests compare this model with the
ledger's tables block by block after a simulation (an independent check of
the ledger's allocation code).
"""

from sage_tfx.privacy import filters


class Allocation:
    def __init__(self, filt, min_cost):
        self.filt = filt
        self.min_cost = tuple(min_cost)
        self.spent = {}  # block -> spent vector
        self.reservations = {}  # block -> {pipeline: [reserved, used]}
        self.active = []  # active block ids, oldest first
        self.retired = set()
        self._pools = {}  # block -> (pool_used, pool_reserved), dropped whenever the block changes

    def add_block(self, block, waiting):
        zero = self.filt.zero()
        self.spent[block] = zero
        self.active.append(block)
        if waiting:
            share = tuple(c / len(waiting) for c in self.filt.capacity)
            self.reservations[block] = {p: [share, zero] for p in sorted(waiting)}
        else:
            self.reservations[block] = {}

    def _pool(self, block):
        pool = self._pools.get(block)
        if pool is None:
            pool = self._pools[block] = self._compute_pool(block)
        return pool

    def _compute_pool(self, block):
        pool_reserved = list(self.filt.capacity)
        pool_used = list(self.spent[block])
        for reserved, used in self.reservations[block].values():
            pool_reserved = [p - x for p, x in zip(pool_reserved, reserved)]
            pool_used = [p - x for p, x in zip(pool_used, used)]
        return pool_used, pool_reserved

    def source(self, block, pipeline, cost):
        """'own', 'pool' or None, by the ledger's rule (own reservation first)."""
        if block in self.retired or not self.filt.admits(self.spent[block], cost):
            return None
        own = self.reservations[block].get(pipeline)
        if own is not None and self.filt.fits_share(own[1], cost, own[0]):
            return "own"
        pool_used, pool_reserved = self._pool(block)
        if self.filt.fits_share(pool_used, cost, pool_reserved):
            return "pool"
        return None

    def fits(self, block, pipeline, cost):
        return self.source(block, pipeline, cost) is not None

    def available_epsilon(self, block, pipeline, delta):
        """Basic accounting only: the largest epsilon ``pipeline`` may spend on ``block`` (closed form)."""
        if block in self.retired:
            return 0.0
        cap_eps, cap_delta = self.filt.capacity
        spent_eps, spent_delta = self.spent[block]
        if spent_delta + delta > cap_delta:
            return 0.0
        best = 0.0
        own = self.reservations[block].get(pipeline)
        if own is not None and own[1][1] + delta <= own[0][1]:
            best = own[0][0] - own[1][0]
        pool_used, pool_reserved = self._pool(block)
        if pool_used[1] + delta <= pool_reserved[1]:
            best = max(best, pool_reserved[0] - pool_used[0])
        return max(0.0, min(best, cap_eps - spent_eps))

    def choose(self, pipeline, cost, window):
        """The newest ``window`` active blocks on which ``pipeline`` can spend ``cost``, oldest first; or None."""
        chosen = []
        for block in reversed(self.active):
            if self.fits(block, pipeline, cost):
                chosen.append(block)
                if len(chosen) == window:
                    return chosen[::-1]
        return None

    def charge(self, blocks, pipeline, cost):
        for block in blocks:
            source = self.source(block, pipeline, cost)
            if source is None:
                raise AssertionError(f"model: block {block} cannot take {cost} for {pipeline}")
            self.spent[block] = filters.add(self.spent[block], cost)
            self._pools.pop(block, None)
            if source == "own":
                own = self.reservations[block][pipeline]
                own[1] = filters.add(own[1], cost)
            if not self.filt.admits(self.spent[block], self.min_cost):
                self.retired.add(block)
                self.active.remove(block)

    def finish(self, pipeline, others):
        others = sorted(others)
        zero = self.filt.zero()
        for block in self.active:
            own = self.reservations[block].get(pipeline)
            if own is None:
                continue
            leftover = [max(0.0, r - u) for r, u in zip(own[0], own[1])]
            self._pools.pop(block, None)
            own[0] = tuple(own[1])
            if not others:
                continue
            share = [x / len(others) for x in leftover]
            for other in others:
                entry = self.reservations[block].setdefault(other, [zero, zero])
                entry[0] = filters.add(entry[0], share)
