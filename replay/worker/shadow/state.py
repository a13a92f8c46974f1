"""The shadow worker's state: what it caches per request (Req), everything that changes per
step (State), and the packed checkpoints going back restores (Checkpoints)."""

from __future__ import annotations

import pickle
from bisect import bisect_right, insort

from vllm_contract.findings import Finding

# Checkpoints are packed (pickled plain tuples); past this many bytes every other one goes and
# the interval doubles, so a long trace's checkpoints stay within it.
CHECKPOINT_BUDGET = 256 << 20


class Req:
    """What the worker caches for one request (CachedRequestState, the parts the contract
    governs)."""

    __slots__ = ("req_id", "prompt_len", "num_computed", "num_output", "blocks", "mm",
                 "intro_step", "preempted", "adopted")

    def __init__(self, req_id, prompt_len, num_computed, blocks, mm, intro_step, adopted=False):
        self.req_id = req_id
        self.prompt_len = prompt_len
        self.num_computed = num_computed
        self.num_output = 0
        self.blocks = blocks  # list per KV cache group
        self.mm = mm  # [(identifier, offset, length)] in mm_features order
        self.intro_step = intro_step
        self.preempted = False  # preempted since its table was last set whole
        self.adopted = adopted  # taken as held without seeing it introduced

    def plain(self) -> dict:
        return {"req_id": self.req_id, "prompt_len": self.prompt_len,
                "num_computed_tokens": self.num_computed, "num_output_tokens": self.num_output,
                "block_ids": [list(g) for g in self.blocks],
                "mm_features": [{"identifier": i, "offset": o, "length": n}
                                for i, o, n in self.mm],
                "introduced_at": self.intro_step, "preempted": self.preempted,
                "adopted": self.adopted}

    def pack(self) -> tuple:
        return (self.req_id, self.prompt_len, self.num_computed, self.num_output, self.blocks,
                self.mm, self.intro_step, self.preempted, self.adopted)

    @classmethod
    def unpack(cls, t: tuple) -> Req:
        r = cls(t[0], t[1], t[2], t[4], t[5], t[6], t[8])
        r.num_output, r.preempted = t[3], t[7]
        return r


class State:
    """Everything that changes per step; packed whole for a checkpoint."""

    def __init__(self) -> None:
        self.pos = 0  # index into the engine's steps of the next step to apply
        self.requests: dict[str, Req] = {}
        self.slots: list[str | None] = []  # the persistent batch, in order
        self.encoder: dict[str, int] = {}  # identifier -> step it was cached at
        self.ever_encoded: set[str] = set()
        self.holders: dict[tuple[int, int], set[str]] = {}  # (group, block) -> req ids
        self.released_events = 0  # finish events whose blocks were released
        self.findings: list[Finding] = []
        self.flagged: set[str] = set()  # ids already reported unknown (once per instance)
        # The fast path may take the next step: the batch holds, once each and with no hole,
        # exactly the ids the previous step gave a token count, none of them preempted or
        # with multimodal features.
        self.fast_ok = True
        # After a fast step the batch's requests' token counts are not written: they are
        # those of their rows in the previous step (see WorkerModel._sync).
        self.stale = False

    def pack(self) -> bytes:
        return pickle.dumps((self.pos, [r.pack() for r in self.requests.values()], self.slots,
                             self.encoder, self.ever_encoded, self.holders,
                             self.released_events, len(self.findings), self.flagged,
                             self.fast_ok), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def unpack(cls, data: bytes, findings: list[Finding]) -> State:
        (pos, reqs, slots, encoder, ever, holders, released, nfound, flagged,
         fast_ok) = pickle.loads(data)
        s = cls()
        s.pos, s.slots, s.encoder, s.ever_encoded, s.holders = pos, slots, encoder, ever, holders
        s.requests = {t[0]: Req.unpack(t) for t in reqs}
        s.released_events, s.flagged, s.fast_ok = released, flagged, fast_ok
        s.findings = findings[:nfound]
        return s


class Checkpoints:
    """Packed States by position (`packed`, its positions sorted in `keys`), one every `every`
    steps, the interval doubling as CHECKPOINT_BUDGET asks."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.packed: dict[int, bytes] = {}
        self.keys: list[int] = []
        self.size = 0

    def store(self, at: int, state: State) -> None:
        data = state.pack()
        self.packed[at] = data
        insort(self.keys, at)
        self.size += len(data)
        while self.size > CHECKPOINT_BUDGET and len(self.keys) > 2:
            self.every *= 2
            for k in [k for k in self.keys if k % self.every]:
                self.size -= len(self.packed.pop(k))
            self.keys = sorted(self.packed)

    def last(self, pos: int) -> int | None:
        """The position of the last checkpoint at or before `pos`."""
        i = bisect_right(self.keys, pos) - 1
        return self.keys[i] if i >= 0 else None

    def restore(self, at: int, findings: list[Finding]) -> State:
        """The state at `at`; its findings are a prefix of `findings`."""
        return State.unpack(self.packed[at], findings)
