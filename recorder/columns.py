"""Column buffers that hold runs, not rows.

At 1024 running decode requests most columns of a step's rows are one value repeated (the step,
kind 'cached', no new blocks, no drafts). Materialising each as 1024 Python values and converting
them one by one was most of the recorder's cost. A column is kept run-length encoded (values and
counts) and expanded in C at flush time, in one call per column; rows that differ from their
neighbours are runs of one. Values held are ints, strs, None and flat int lists: nothing that
Python's cyclic GC has to walk in the engine's process.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np
import pyarrow as pa


class Column:
    __slots__ = ("type", "values", "counts", "n")

    def __init__(self, typ: pa.DataType) -> None:
        self.type = typ
        self.values: list = []
        self.counts: list[int] = []
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def append(self, value) -> None:
        self.repeat(value, 1)

    def extend(self, values) -> None:
        before = len(self.values)
        self.values.extend(values)
        added = len(self.values) - before
        self.counts.extend(repeat(1, added))
        self.n += added

    def repeat(self, value, count: int) -> None:
        if not count:
            return
        if self.values and self.values[-1] is value:
            self.counts[-1] += count
        else:
            self.values.append(value)
            self.counts.append(count)
        self.n += count

    def drain(self) -> pa.Array:
        values, counts, n = self.values, self.counts, self.n
        self.values, self.counts, self.n = [], [], 0
        if len(values) == n:  # no runs
            return pa.array(values, self.type)
        if len(values) == 1 and values[0] is None:
            return pa.nulls(n, self.type)
        index = np.repeat(np.arange(len(values), dtype=np.int32), counts)
        return pa.array(values, self.type).take(pa.array(index))


class FlatListColumn:
    """A list<int64> column given flattened: one list of all values, one of list lengths.
    A step's 1024 one-token lists are never held, only their ints."""

    __slots__ = ("type", "values", "lengths", "nulls", "n")

    def __init__(self, typ: pa.DataType) -> None:
        self.type = typ
        self.values: list[int] = []
        self.lengths: list[int] = []
        self.nulls: list[int] = []  # row numbers of None entries
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def extend_flat(self, values: list[int], lengths: list[int]) -> None:
        self.values.extend(values)
        self.lengths.extend(lengths)
        self.n += len(lengths)

    def append(self, lst: list[int] | None) -> None:
        if lst is None:
            self.nulls.append(self.n)
            lst = []
        self.extend_flat(list(lst), [len(lst)])

    def drain(self) -> pa.Array:
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(self.lengths, out=offsets[1:])
        mask = None
        if self.nulls:
            mask = np.zeros(self.n, dtype=bool)
            mask[self.nulls] = True
        out = pa.ListArray.from_arrays(pa.array(offsets), pa.array(self.values, pa.int64()),
                                       mask=None if mask is None else pa.array(mask))
        self.values, self.lengths, self.nulls, self.n = [], [], [], 0
        return out


class RowTable:
    """A table of about one row per step (steps, updates, transport): each row one tuple in
    schema order, turned into columns at flush by zip() (in C). One list append per row on
    the hot side, instead of one Python call per column."""

    __slots__ = ("types", "rows")

    def __init__(self, schema: pa.Schema) -> None:
        self.types = [f.type for f in schema]
        self.rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self.rows)

    def drain(self, pause=None) -> list[pa.Array]:
        rows, self.rows = self.rows, []
        columns = list(zip(*rows)) if rows else [()] * len(self.types)
        out = []
        for values, typ in zip(columns, self.types):
            out.append(pa.array(values, typ))
            if pause is not None:
                pause()
        return out


def warm_up() -> None:
    """Run each conversion path once. pyarrow initialises its compute kernels on first use
    (about 0.1 s here); better at attach time than inside the first flush of a live engine."""
    for col, fill in ((Column(pa.string()), lambda c: (c.repeat("a", 3), c.extend(["b"]))),
                      (Column(pa.int64()), lambda c: c.repeat(None, 2)),
                      (FlatListColumn(pa.list_(pa.int64())), lambda c: (c.extend_flat([1], [1]),
                                                                        c.append(None)))):
        fill(col)
        col.drain()
