"""A log-bucket latency histogram in the style of HdrHistogram: fixed, preallocated buckets.

Values are non-negative integers (the probe records nanoseconds). With ``digits`` significant
decimal digits the histogram keeps ``sub = 2 ** ceil(log2(2 * 10 ** digits))`` linear buckets
per power of two (256 for 2 digits): every value below ``sub`` has its own bucket, and a value
``v >= sub`` with ``e = v.bit_length() - log2(sub)`` lands in the bucket of ``v >> e``, so a
bucket is never wider than ``1 / (sub / 2)`` of its values (0.78 % for 2 digits: better than
the 1 % that 2 significant digits promise).

Index layout (``sub = 256``, ``half = 128``)::

    index 0 .. 255                       value == index            (exact)
    index 256 + (e - 1) * 128 + (m - 128)   value in [m << e, (m + 1) << e), m = v >> e in 128..255

``record(v)`` computes the index with integer arithmetic and increments one slot of a NumPy
int64 array through a memoryview: no Python object is kept per sample, no list grows, and the
array never resizes (values above ``highest`` are clamped into the top bucket and counted in
``clamped``). Percentiles follow HdrHistogram: the value at percentile p is the highest value
equivalent to the bucket holding the ceil(p / 100 * total)-th smallest sample (never above the
exact maximum, which is tracked separately).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_DIGITS = 2
DEFAULT_HIGHEST = 3_600 * 10**9  # one hour in nanoseconds


class LogHistogram:
    """Counts of integer values in log-linear buckets; ``digits`` significant decimal digits."""

    def __init__(self, digits: int = DEFAULT_DIGITS, highest: int = DEFAULT_HIGHEST) -> None:
        if not 1 <= digits <= 5:
            raise ValueError("digits must be 1..5")
        if highest < 2:
            raise ValueError("highest must be at least 2")
        self.digits = digits
        self.sub_bits = math.ceil(math.log2(2 * 10**digits))
        self.sub = 1 << self.sub_bits
        self.half = self.sub >> 1
        self.highest = highest
        top_exp = max(0, highest.bit_length() - self.sub_bits)
        self.size = self.sub + top_exp * self.half
        self.counts: npt.NDArray[np.int64] = np.zeros(self.size, dtype=np.int64)
        # item access without NumPy scalar objects (ndarray implements the buffer protocol)
        self._slots = memoryview(self.counts.data)
        self.total = 0
        self.min = -1
        self.max = -1
        self.clamped = 0

    # -- recording -----------------------------------------------------------------------------

    def index_of(self, value: int) -> int:
        """The bucket of ``value`` (a value above ``highest`` maps to the top bucket)."""
        if value < self.sub:
            return value if value > 0 else 0
        e = value.bit_length() - self.sub_bits
        index = self.sub + (e - 1) * self.half + ((value >> e) - self.half)
        return index if index < self.size else self.size - 1

    def record(self, value: int) -> None:
        """Count one value (negative values count as 0). Allocation-free on the hot path."""
        if value < self.sub:
            index = value if value > 0 else 0
        else:
            e = value.bit_length() - self.sub_bits
            index = self.sub + (e - 1) * self.half + ((value >> e) - self.half)
            if index >= self.size:
                index = self.size - 1
                self.clamped += 1
        self._slots[index] += 1
        self.total += 1
        if value > self.max:
            self.max = value
        if value < self.min or self.min < 0:
            self.min = value if value > 0 else 0

    def record_many(self, values: npt.ArrayLike) -> None:
        """Count every value of an integer array (vectorised; used for the C floor's samples)."""
        arr = np.asarray(values, dtype=np.int64).ravel()
        if arr.size == 0:
            return
        arr = np.maximum(arr, 0)
        self.counts += np.bincount(self.indexes_of(arr), minlength=self.size)[: self.size]
        self.total += int(arr.size)
        top = int(arr.max())
        low = int(arr.min())
        self.clamped += int(np.count_nonzero(arr > self.highest_equivalent(self.size - 1)))
        self.max = max(self.max, top)
        self.min = low if self.min < 0 else min(self.min, low)

    def indexes_of(self, values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``index_of`` over an array."""
        v = np.maximum(values.astype(np.int64), 0)
        # frexp's exponent is the bit length, exactly, for integers below 2 ** 53
        bits = np.frexp(v.astype(np.float64))[1].astype(np.int64)
        e = np.maximum(bits - self.sub_bits, 0)
        small = v < self.sub
        index = np.where(small, v, self.sub + (e - 1) * self.half + ((v >> e) - self.half))
        return np.minimum(index, self.size - 1).astype(np.int64)

    def merge(self, other: LogHistogram) -> None:
        if (other.digits, other.size) != (self.digits, self.size):
            raise ValueError("histograms of different precision or range cannot be merged")
        self.counts += other.counts
        self.total += other.total
        self.clamped += other.clamped
        if other.total:
            self.max = max(self.max, other.max)
            self.min = other.min if self.min < 0 else min(self.min, other.min)

    def reset(self) -> None:
        self.counts[:] = 0
        self.total = 0
        self.min = self.max = -1
        self.clamped = 0

    # -- bucket geometry -----------------------------------------------------------------------

    def lowest_equivalent(self, index: int) -> int:
        """The smallest value that lands in bucket ``index``."""
        if index < self.sub:
            return index
        e = (index - self.sub) // self.half + 1
        m = (index - self.sub) % self.half + self.half
        return m << e

    def highest_equivalent(self, index: int) -> int:
        """The largest value that lands in bucket ``index``."""
        if index < self.sub:
            return index
        e = (index - self.sub) // self.half + 1
        return self.lowest_equivalent(index) + (1 << e) - 1

    def bucket_edges(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(lowest, highest) equivalent value of every bucket, as arrays."""
        idx = np.arange(self.size, dtype=np.int64)
        small = idx < self.sub
        e = np.where(small, 0, (idx - self.sub) // self.half + 1).astype(np.int64)
        m = np.where(small, idx, (idx - self.sub) % self.half + self.half).astype(np.int64)
        low: npt.NDArray[np.int64] = np.left_shift(m, e)
        high: npt.NDArray[np.int64] = low + np.left_shift(np.ones_like(e), e) - 1
        return low, high

    # -- queries -------------------------------------------------------------------------------

    def percentile(self, p: float) -> int:
        """The value at percentile ``p`` (0..100): HdrHistogram's highest-equivalent rule."""
        if self.total == 0:
            raise ValueError("the histogram is empty")
        if not 0.0 <= p <= 100.0:
            raise ValueError("p must be in 0..100")
        if p >= 100.0:
            return self.max
        rank = max(1, math.ceil(p / 100.0 * self.total))
        cumulative = np.cumsum(self.counts)
        index = int(np.searchsorted(cumulative, rank, side="left"))
        return min(self.highest_equivalent(index), self.max)

    def percentiles(self, ps: Iterable[float]) -> dict[float, int]:
        return {p: self.percentile(p) for p in ps}

    def mean(self) -> float:
        """The mean of the bucket midpoints (within the bucket precision)."""
        if self.total == 0:
            raise ValueError("the histogram is empty")
        low, high = self.bucket_edges()
        mid = (low + high) / 2.0
        return float(np.dot(self.counts, mid) / self.total)

    def cdf(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(value, fraction of samples <= value) at the upper edge of every non-empty bucket."""
        nz = np.nonzero(self.counts)[0]
        if nz.size == 0:
            return np.zeros(0), np.zeros(0)
        _, high = self.bucket_edges()
        values = np.minimum(high[nz], self.max).astype(np.float64)
        fractions = np.cumsum(self.counts[nz]) / float(self.total)
        return values, fractions.astype(np.float64)

    # -- serialisation -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A compact form: the non-empty buckets as [lowest value, highest value, count]."""
        nz = np.nonzero(self.counts)[0]
        low, high = self.bucket_edges()
        return {
            "digits": self.digits,
            "highest": self.highest,
            "total": self.total,
            "min": self.min,
            "max": self.max,
            "clamped": self.clamped,
            "buckets": [[int(low[i]), int(high[i]), int(self.counts[i])] for i in nz],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LogHistogram:
        hist = cls(int(data["digits"]), int(data["highest"]))
        for low, _high, count in data["buckets"]:
            hist.counts[hist.index_of(int(low))] += int(count)
        hist.total = int(data["total"])
        hist.min = int(data["min"])
        hist.max = int(data["max"])
        hist.clamped = int(data.get("clamped", 0))
        return hist
