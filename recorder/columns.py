"""Column buffers that hold runs, not rows.

At 1024 running decode requests most columns of a step's rows are one value repeated (the step,
kind 'cached', no new blocks, no drafts). Materialising each as 1024 Python values and converting
them one by one was most of the recorder's cost. A column is kept run-length encoded (values and
counts) and expanded in C at flush time, in one call per column; rows that differ from their
neighbours are runs of one. Values held are ints, strs, None and flat int lists: nothing that
Python's cyclic GC has to walk in the engine's process.

Integer columns (IntColumn, FlatListColumn) keep machine ints in array('q') buffers: filled in C,
turned into Arrow without a per-value conversion, and invisible to the GC. The writer's Python
work holds the GIL, which a pure-Python engine thread is waiting for, so every value converted
one at a time is paid by the engine too. No numpy: the recorder must not require it.
"""

from __future__ import annotations

import struct
from array import array
from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

_RANGE = array("q", range(4096))  # pos columns: one slice per step instead of range() items
_ONES = [1] * 4096  # run counts of values extended one by one, likewise
_ZERO = pa.scalar(0, pa.uint8())  # a Python 0 would retry a missing optional import per call


def pack_ints(values, typecode: str = "q") -> bytes:
    """Machine ints of a list of Python ints, as array(typecode) holds them; raises
    struct.error (or TypeError) on None or anything that is not an int."""
    return struct.pack(f"{len(values)}{typecode}", *values)


class Column:
    __slots__ = ("type", "values", "counts", "n")

    def __init__(self, typ: pa.DataType) -> None:
        self.type = typ
        self.values: list = []
        self.counts: list[int] = []
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def append(self, value) -> None:  # repeat(value, 1), inlined: called for every new row
        values = self.values
        if values and values[-1] is value:
            self.counts[-1] += 1
        else:
            values.append(value)
            self.counts.append(1)
        self.n += 1

    def extend(self, values) -> None:
        before = len(self.values)
        self.values.extend(values)
        added = len(self.values) - before
        self.counts.extend(_ONES[:added] if added <= len(_ONES) else repeat(1, added))
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

    def clear(self) -> None:
        # Emptied in place, never replaced: a new list of 16k ids every flush would be
        # young again, and the engine's collections would walk it until it aged out.
        self.values.clear()
        self.counts.clear()
        self.n = 0

    def truncate(self, n: int) -> None:
        """Drop the rows from row n on (a step that failed part-way through its rows)."""
        while self.n > n:
            extra = self.n - n
            if self.counts[-1] > extra:
                self.counts[-1] -= extra
                self.n = n
            else:
                self.n -= self.counts.pop()
                self.values.pop()

    def pylist(self) -> list:
        return [v for v, c in zip(self.values, self.counts) for _ in range(c)]

    def to_array(self) -> pa.Array:
        values, counts, n = self.values, self.counts, self.n
        if len(values) == n:  # no runs
            return pa.array(values, self.type)
        if len(values) == 1 and values[0] is None:
            return pa.nulls(n, self.type)
        run_ends = pc.cumulative_sum(pa.array(counts, pa.int32()))
        # from_buffers: from_arrays retries two missing optional imports on every call.
        runs = pa.RunEndEncodedArray.from_buffers(
            pa.run_end_encoded(pa.int32(), self.type), n, [None], 0, 0,
            [run_ends, pa.array(values, self.type)])
        return pc.run_end_decode(runs)


def _validity(n: int, null_runs: list[tuple[int, int]]) -> pa.Buffer:
    """Arrow validity bitmap of n rows with the (first row, count) runs unset."""
    valid = bytearray(b"\x01") * n
    for first, count in null_runs:
        valid[first:first + count] = bytes(count)
    flags = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(valid)])
    return pc.not_equal(flags, _ZERO).buffers()[1]


class IntColumn:
    """An int64 column in an array('q') buffer; None entries are kept as (first row, count)
    runs: a step's 1024 absent values are one run, not 1024 row numbers."""

    __slots__ = ("type", "values", "null_runs", "null_count")

    def __init__(self, typ: pa.DataType) -> None:
        self.type = typ
        self.values = array("q")
        self.null_runs: list[tuple[int, int]] = []
        self.null_count = 0

    def __len__(self) -> int:
        return len(self.values)

    def append(self, value) -> None:
        if value is None:
            self.repeat(None, 1)
        else:
            self.values.append(value)

    def extend(self, values) -> None:
        """values: an array('q') (copied as memory) or a list or tuple of ints."""
        if type(values) is array and values.typecode == "q":
            self.values.extend(values)
            return
        try:  # struct packs a list of ints faster than array.extend() converts it
            self.values.frombytes(pack_ints(values))
        except (struct.error, TypeError, OverflowError):  # a None somewhere: value by value
            for v in values:
                self.append(v)

    def extend_range(self, n: int) -> None:
        if n <= len(_RANGE):
            self.values.extend(_RANGE[:n])
        else:
            self.values.extend(range(n))

    def repeat(self, value, count: int) -> None:
        if value is None:
            if count:
                self.null_runs.append((len(self.values), count))
                self.null_count += count
            value = 0
        self.values.extend(array("q", (value,)) * count)

    def clear(self) -> None:
        self.values, self.null_runs, self.null_count = array("q"), [], 0

    def truncate(self, n: int) -> None:
        del self.values[n:]
        self.null_runs = [(f, min(c, n - f)) for f, c in self.null_runs if f < n]
        self.null_count = sum(c for _, c in self.null_runs)

    def pylist(self) -> list:
        out: list = self.values.tolist()
        for first, count in self.null_runs:
            out[first:first + count] = [None] * count
        return out

    def to_array(self) -> pa.Array:
        values, runs, nulls = self.values, self.null_runs, self.null_count
        n = len(values)
        if nulls and nulls == n:
            return pa.nulls(n, self.type)
        bitmap = _validity(n, runs) if nulls else None
        return pa.Array.from_buffers(self.type, n, [bitmap, pa.py_buffer(values)],
                                     null_count=nulls)


class FlatListColumn:
    """A list<int64> column given flattened: one list of all values, one of list lengths.
    A step's 1024 one-token lists are never held, only their ints."""

    __slots__ = ("type", "values", "lengths", "nulls", "n")

    def __init__(self, typ: pa.DataType) -> None:
        self.type = typ
        self.values = array("q")
        self.lengths = array("i")
        self.nulls: list[int] = []  # row numbers of None entries
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def extend_flat(self, values, lengths) -> None:
        """values: an array('q') or a list of ints; lengths: an array('i') (the snapshot's) or
        a list of ints."""
        self.values.extend(values)
        self.lengths.extend(lengths)
        self.n += len(lengths)

    def append(self, lst: list[int] | None) -> None:
        if lst is None:
            self.nulls.append(self.n)
            lst = []
        self.extend_flat(list(lst), [len(lst)])

    def clear(self) -> None:
        self.values, self.lengths, self.nulls, self.n = array("q"), array("i"), [], 0

    def truncate(self, n: int) -> None:
        if self.n > n:
            del self.values[sum(self.lengths[:n]):]
            del self.lengths[n:]
            self.nulls = [i for i in self.nulls if i < n]
            self.n = n

    def pylist(self) -> list:
        out, at, nulls = [], 0, set(self.nulls)
        for i, k in enumerate(self.lengths):
            out.append(None if i in nulls else self.values[at:at + k].tolist())
            at += k
        return out

    def to_array(self) -> pa.Array:
        n, values, nulls = self.n, self.values, self.nulls
        lengths = array("i", [0]) + self.lengths
        offsets = pc.cumulative_sum(pa.Array.from_buffers(pa.int32(), n + 1,
                                                          [None, pa.py_buffer(lengths)]))
        flat = pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
        mask = None
        if nulls:
            mask = [False] * n
            for i in nulls:
                mask[i] = True
            mask = pa.array(mask, pa.bool_())
        return pa.ListArray.from_arrays(offsets, flat, mask=mask)


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

    def clear(self) -> None:
        self.rows.clear()  # in place, as Column.clear

    def truncate(self, n: int) -> None:
        del self.rows[n:]

    def pylists(self) -> list[list]:
        return [list(c) for c in zip(*self.rows)] if self.rows else [[] for _ in self.types]

    def to_arrays(self, pause=None) -> list[pa.Array]:
        rows = self.rows
        columns = list(zip(*rows)) if rows else [()] * len(self.types)
        out = []
        for values, typ in zip(columns, self.types):
            out.append(pa.array(values, typ))
            if pause is not None:
                pause()
        return out


def warm_up() -> None:
    """Run each conversion path once. pyarrow initialises its compute kernels on first use,
    which takes long enough to notice: better at attach time than inside the first flush of a
    live engine."""
    for col, fill in ((Column(pa.string()), lambda c: (c.repeat("a", 3), c.extend(["b"]))),
                      (Column(pa.int64()), lambda c: (c.repeat(None, 2), c.repeat(1, 2))),
                      (IntColumn(pa.int64()), lambda c: (c.repeat(None, 2), c.extend([1, None]))),
                      (FlatListColumn(pa.list_(pa.int64())), lambda c: (c.extend_flat([1], [1]),
                                                                        c.append(None)))):
        fill(col)
        col.to_array()
        col.clear()
