"""Workloads: query-arrival traces, their CSV format, and seeded generators. Pure Python + numpy.

A `Trace` is a sorted sequence of query arrivals: `time_s[i]` (seconds from 0) and `application[i]` (an
index into `applications`), and optionally a per-query `deadline_ms` (NaN where a query has none). The
simulator replays traces; the planner is sized from their rates.

CSV format
----------
One header line, then one row per arrival, sorted by time::

    time_s,application[,deadline_ms]
    0.0137,resnet
    0.0211,bert

`time_s` is a finite, non-negative float (written as Python's shortest round-trip repr, so a write/read
round trip is exact); rows must be in non-decreasing time order. `application` is a non-empty name
without commas, quotes, line breaks or surrounding whitespace (no quoting is ever needed).
`deadline_ms`, when the column exists, is a positive float or empty (no deadline). `trace_read` is strict:
any malformed row, unsorted time or negative time raises `TraceFormatError` (a `ValueError`) naming the
file and line. Files are read in chunks of lines and parsed column-wise with numpy: about a microsecond per
row (ten million rows in roughly ten seconds) and memory proportional to the arrays.

Generators
----------
Every generator draws from `numpy.random.default_rng(seed)` (an int, a `SeedSequence` or a `Generator`;
the draws made are listed in each docstring in the order they are made), covers `[0, duration_s)` and
returns a single-application `Trace` (application `"default"` unless given). `split_zipf` then assigns
arrivals to applications, and `trace_for_applications` does both.

- `arrivals_uniform`: constant inter-arrival time `1 / rate`.
- `arrivals_poisson`: exponential inter-arrival times (CV 1).
- `arrivals_gamma`: gamma inter-arrival times with the given shape k and mean `1 / rate`, so the mean rate
  is preserved and the CV is `1 / sqrt(k)`. Small shapes give micro-bursts (k = 0.05, CV 4.5, is the
  Proteus setting): most gaps are tiny and a few are long.
- `arrivals_macro_bursts`: flat low and high periods (a Poisson process whose rate is a periodic step).
- `arrivals_diurnal`: an inhomogeneous Poisson process, made by thinning, whose rate follows a compressed
  day with short spikes (`rate_curve_diurnal` documents the curve).

Where the diurnal shape comes from: Proteus (ASPLOS'24) and IPA evaluate on a Twitter trace rather than a
synthetic process. Proteus replays it compressed in time (its plotting script for the bursty experiment,
`plotting/bursty.py` in UMass-LIDS/Proteus, rescales the run onto a 0..24 minute axis), splits the queries over model families with Zipf
popularity (alpha 1.001, Proteus §6.1.3) and tests batching on gamma micro-bursts (shape 0.05, §6.4); IPA replays per-second request counts of the Twitter trace divided by a damping factor
(`load_tester/barazmoon/twitter/loader.py` in reconfigurable-ml-pipeline/ipa). The trace itself is not
shipped here; `rate_curve_diurnal` is a stylised stand-in with the two features those evaluations rely
on: a diurnal swing (default peak-to-trough 2, the peak/valley ratio of tweet arrivals measured by
Gonzalez et al., "On the tweet arrival process at Twitter", ETT 2014) and short event spikes with a steep
rise and a slower decay. It is not fitted to, and does not claim to reproduce, any particular trace.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

import numpy as np

__all__ = [
    "DEFAULT_APPLICATION",
    "KINDS",
    "MAX_ARRIVALS",
    "PROTEUS_ZIPF_ALPHA",
    "DiurnalCurve",
    "RateCurve",
    "Spike",
    "StepCurve",
    "Trace",
    "TraceFormatError",
    "TraceSummary",
    "arrivals_diurnal",
    "arrivals_from_rate_curve",
    "arrivals_gamma",
    "arrivals_macro_bursts",
    "arrivals_poisson",
    "arrivals_uniform",
    "rate_curve_diurnal",
    "rate_curve_macro_bursts",
    "split_zipf",
    "trace_for_applications",
    "trace_read",
    "trace_summary",
    "trace_write",
    "zipf_shares",
]

Seed = Union[int, np.random.SeedSequence, np.random.Generator]

DEFAULT_APPLICATION = "default"
PROTEUS_ZIPF_ALPHA = 1.001
# The generator kinds `trace_for_applications` and `tessera trace generate` know.
KINDS = ("uniform", "poisson", "gamma", "macro-bursts", "diurnal")
# Generators refuse to make more arrivals than this (expected count), to fail early instead of swapping.
MAX_ARRIVALS = 200_000_000

HEADER = ("time_s", "application")
HEADER_DEADLINE = ("time_s", "application", "deadline_ms")
_READ_CHUNK_LINES = 1 << 18
_WRITE_CHUNK_ROWS = 1 << 18
_FORBIDDEN_NAME_CHARS = (",", '"', "\n", "\r")


class TraceFormatError(ValueError):
    """A trace file is malformed. `path` and `line` (1-based, the header is line 1) say where."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}: line {line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


# --------------------------------------------------------------------------- Trace


def _frozen_array(values: Any, dtype: Any) -> np.ndarray:
    """A read-only 1-d array of `dtype` that no caller holds a writable reference to."""
    array = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"trace arrays must be one-dimensional, got shape {array.shape}")
    if array is values or not array.flags.owndata:
        array = array.copy()
    array.setflags(write=False)
    return array


def _application_name_problem(name: Any) -> str | None:
    if not isinstance(name, str):
        return f"application names must be strings, got {name!r}"
    if not name:
        return "an application name is empty"
    if name != name.strip():
        return f"application name {name!r} has surrounding whitespace"
    if any(c in name for c in _FORBIDDEN_NAME_CHARS):
        return f"application name {name!r} contains a comma, quote or line break"
    return None


def _applications_check(applications: Sequence[str]) -> tuple[str, ...]:
    if isinstance(applications, str):
        raise ValueError(f"applications must be a sequence of names, not the string {applications!r}")
    names = tuple(applications)
    for name in names:
        problem = _application_name_problem(name)
        if problem:
            raise ValueError(problem)
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate application names: {', '.join(duplicates)}")
    return names


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """Query arrivals sorted by time.

    - `time_s`: float64 seconds from 0, finite, non-negative, non-decreasing (ties allowed).
    - `application`: int32 index into `applications` per arrival.
    - `applications`: the application names (unique; may include applications without arrivals).
    - `deadline_ms`: None (no deadline column) or float64 per arrival, NaN where a query has no deadline,
      otherwise positive.

    The arrays are copied when needed and made read-only. Equality (`==`) is structural: same names in the
    same order, same arrays (NaN deadlines compare equal).
    """

    time_s: np.ndarray
    application: np.ndarray
    applications: tuple[str, ...]
    deadline_ms: np.ndarray | None = None

    def __post_init__(self) -> None:
        names = _applications_check(self.applications)
        times = _frozen_array(self.time_s, np.float64)
        raw = np.asarray(self.application)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise ValueError(f"application indices must be integers, got dtype {raw.dtype}")
        if raw.size and (int(raw.min()) < 0 or int(raw.max()) >= len(names)):
            bad = int(raw.min()) if int(raw.min()) < 0 else int(raw.max())
            raise ValueError(f"application indices must be in [0, {len(names)}), got {bad}")
        apps = _frozen_array(self.application if isinstance(self.application, np.ndarray) else raw, np.int32)
        if times.shape != apps.shape:
            raise ValueError(f"time_s has {times.size} entries but application has {apps.size}")
        if times.size:
            if not np.all(np.isfinite(times)):
                raise ValueError(f"time_s has a non-finite entry at index {int(np.flatnonzero(~np.isfinite(times))[0])}")
            if times[0] < 0:
                raise ValueError(f"time_s must be non-negative, got {float(times[0])!r} at index 0")
            decreasing = np.flatnonzero(np.diff(times) < 0)
            if decreasing.size:
                i = int(decreasing[0]) + 1
                raise ValueError(
                    f"time_s must be sorted: index {i} ({float(times[i])!r}) is before index {i - 1} ({float(times[i - 1])!r})"
                )
        deadlines = None
        if self.deadline_ms is not None:
            deadlines = _frozen_array(self.deadline_ms, np.float64)
            if deadlines.shape != times.shape:
                raise ValueError(f"deadline_ms has {deadlines.size} entries but time_s has {times.size}")
            bad = np.flatnonzero(~np.isnan(deadlines) & ~(np.isfinite(deadlines) & (deadlines > 0)))
            if bad.size:
                raise ValueError(f"deadline_ms must be positive or NaN, got {float(deadlines[bad[0]])!r} at index {int(bad[0])}")
        object.__setattr__(self, "applications", names)
        object.__setattr__(self, "time_s", times)
        object.__setattr__(self, "application", apps)
        object.__setattr__(self, "deadline_ms", deadlines)

    # ---- basics

    def __len__(self) -> int:
        return int(self.time_s.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if self.applications != other.applications or (self.deadline_ms is None) != (other.deadline_ms is None):
            return False
        if not (np.array_equal(self.time_s, other.time_s) and np.array_equal(self.application, other.application)):
            return False
        return self.deadline_ms is None or np.array_equal(self.deadline_ms, other.deadline_ms, equal_nan=True)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Trace({len(self)} arrivals, duration_s={self.duration_s:.6g}, applications={self.applications!r}"
            f"{', with deadlines' if self.deadline_ms is not None else ''})"
        )

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (arrivals are counted from time 0); 0.0 for an empty trace."""
        return float(self.time_s[-1]) if self.time_s.size else 0.0

    def counts(self) -> dict[str, int]:
        """Arrivals per application, every application listed."""
        per_app = np.bincount(self.application, minlength=len(self.applications))
        return {name: int(n) for name, n in zip(self.applications, per_app)}

    def times_of(self, application: str) -> np.ndarray:
        """Arrival times of one application (sorted)."""
        return self.time_s[self.application == self._index_of(application)]

    def _index_of(self, application: str) -> int:
        try:
            return self.applications.index(application)
        except ValueError:
            raise KeyError(f"no application {application!r} in this trace") from None

    def _bins(self, bin_s: float) -> tuple[np.ndarray, int]:
        if not (math.isfinite(bin_s) and bin_s > 0):
            raise ValueError(f"bin_s must be positive, got {bin_s!r}")
        if not self.time_s.size:
            return np.zeros(0, dtype=np.int64), 0
        index = np.floor(self.time_s / bin_s).astype(np.int64)
        return index, int(index[-1]) + 1

    def rate_per_second(self, bin_s: float = 1.0) -> dict[str, np.ndarray]:
        """Per application, the arrival rate (arrivals per second) in consecutive bins `[k bin_s, (k+1) bin_s)`
        from time 0 up to the bin holding the last arrival (all arrays have that many bins)."""
        index, n_bins = self._bins(bin_s)
        n_apps = len(self.applications)
        flat = np.bincount(self.application.astype(np.int64) * n_bins + index, minlength=n_apps * n_bins)
        per_app = flat.reshape(n_apps, n_bins) / bin_s
        return {name: per_app[i] for i, name in enumerate(self.applications)}

    def total_rate_per_second(self, bin_s: float = 1.0) -> np.ndarray:
        """The rate of all applications together, binned as in `rate_per_second`."""
        index, n_bins = self._bins(bin_s)
        return np.bincount(index, minlength=n_bins) / bin_s

    # ---- derived traces

    def _take(self, selector: slice | np.ndarray, time_s: np.ndarray | None = None) -> Trace:
        return Trace(
            time_s=self.time_s[selector] if time_s is None else time_s,
            application=self.application[selector],
            applications=self.applications,
            deadline_ms=None if self.deadline_ms is None else self.deadline_ms[selector],
        )

    def slice(self, t0: float, t1: float, rebase: bool = False) -> Trace:
        """The arrivals with `t0 <= time_s < t1` (same applications). With `rebase`, times are shifted so
        that `t0` becomes 0."""
        if not t0 <= t1:
            raise ValueError(f"slice needs t0 <= t1, got {t0!r} > {t1!r}")
        lo, hi = np.searchsorted(self.time_s, [t0, t1], side="left")
        part = slice(int(lo), int(hi))
        if not rebase:
            return self._take(part)
        if t0 < 0:
            raise ValueError(f"rebase needs t0 >= 0, got {t0!r}")
        return self._take(part, np.maximum(self.time_s[part] - t0, 0.0))

    def merge(self, other: Trace) -> Trace:
        """Both traces' arrivals in one trace, sorted by time (on ties, this trace's arrivals first).
        Applications: this trace's, then the other's that are new. Deadlines: kept when either trace has
        them (NaN for the arrivals of a trace without)."""
        names = self.applications + tuple(n for n in other.applications if n not in self.applications)
        remap = np.array([names.index(n) for n in other.applications], dtype=np.int32)
        times = np.concatenate([self.time_s, other.time_s])
        apps = np.concatenate([self.application, remap[other.application] if len(other) else other.application])
        order = np.argsort(times, kind="stable")
        deadlines = None
        if self.deadline_ms is not None or other.deadline_ms is not None:
            mine = self.deadline_ms if self.deadline_ms is not None else np.full(len(self), np.nan)
            theirs = other.deadline_ms if other.deadline_ms is not None else np.full(len(other), np.nan)
            deadlines = np.concatenate([mine, theirs])[order]
        return Trace(time_s=times[order], application=apps[order], applications=names, deadline_ms=deadlines)

    def with_deadlines(self, deadline_ms: float | Mapping[str, float] | None) -> Trace:
        """A copy whose queries carry deadlines: one value for every query, or per application (applications
        left out get NaN: no deadline). None drops the deadline column."""
        if deadline_ms is None:
            return Trace(self.time_s, self.application, self.applications)
        if isinstance(deadline_ms, Mapping):
            unknown = sorted(set(deadline_ms) - set(self.applications))
            if unknown:
                raise ValueError(f"deadlines for unknown applications: {', '.join(unknown)}")
            per_app = np.array([float(deadline_ms.get(n, math.nan)) for n in self.applications], dtype=np.float64)
            values = per_app[self.application] if len(self) else np.zeros(0)
        else:
            values = np.full(len(self), float(deadline_ms))
        return Trace(self.time_s, self.application, self.applications, deadline_ms=values)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class TraceSummary:
    """What `tessera trace generate/show` print. `mean_rate` is queries per second over the whole bins the
    trace covers (bins of `bin_s` from 0 up to the one holding the last arrival); `peak_rate` is the
    busiest bin's rate and `peak_at_s` that bin's start."""

    queries: int
    duration_s: float
    bin_s: float
    mean_rate: float
    peak_rate: float
    peak_at_s: float
    counts: dict[str, int]

    @property
    def shares(self) -> dict[str, float]:
        return {name: (n / self.queries if self.queries else 0.0) for name, n in self.counts.items()}


def trace_summary(trace: Trace, bin_s: float = 1.0) -> TraceSummary:
    """Queries, span, mean and peak binned rates, and per-application counts of a trace."""
    total = trace.total_rate_per_second(bin_s)
    peak_bin = int(np.argmax(total)) if total.size else 0
    return TraceSummary(
        queries=len(trace),
        duration_s=trace.duration_s,
        bin_s=bin_s,
        mean_rate=len(trace) / (total.size * bin_s) if total.size else 0.0,
        peak_rate=float(total[peak_bin]) if total.size else 0.0,
        peak_at_s=peak_bin * bin_s,
        counts=trace.counts(),
    )


# --------------------------------------------------------------------------- CSV


def trace_write(trace: Trace, path: str | Path) -> None:
    """Write `trace` as CSV (see the module docstring): the deadline column is written when the trace has
    deadlines, empty where a query has none. Times and deadlines use the shortest repr that reads back
    exactly. Written in chunks, so memory stays bounded."""
    names = trace.applications
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write(",".join(HEADER_DEADLINE if trace.deadline_ms is not None else HEADER) + "\n")
        for start in range(0, len(trace), _WRITE_CHUNK_ROWS):
            part = slice(start, start + _WRITE_CHUNK_ROWS)
            times = trace.time_s[part].tolist()
            apps = trace.application[part].tolist()
            if trace.deadline_ms is None:
                lines = [f"{t!r},{names[a]}" for t, a in zip(times, apps)]
            else:
                deadlines = trace.deadline_ms[part].tolist()
                lines = [f"{t!r},{names[a]},{'' if d != d else repr(d)}" for t, a, d in zip(times, apps, deadlines)]
            out.write("\n".join(lines))
            out.write("\n")


def _first_unparsable(values: Sequence[str]) -> tuple[int, str]:
    for i, value in enumerate(values):
        try:
            float(value)
        except ValueError:
            return i, value
    raise AssertionError("numpy refused a column that float() accepts")  # pragma: no cover


def trace_read(path: str | Path, applications: Sequence[str] | None = None) -> Trace:
    """Read a CSV trace (see the module docstring). Strict: a wrong header, a row with the wrong number of
    fields, an unparsable, non-finite or negative time, a time before the previous row's, a bad
    application name or a bad deadline raises `TraceFormatError` naming the line.

    `applications`: the trace's application list, in this order (rows naming any other application are an
    error); by default the applications in order of first appearance.

    The file is read in chunks of lines; each chunk is split column-wise and converted by numpy, so the cost
    per row is a few hundred nanoseconds and the memory that of the resulting arrays plus one chunk.
    """
    index: dict[str, int] = {}
    fixed = applications is not None
    if fixed:
        index = {name: i for i, name in enumerate(_applications_check(applications))}
    time_parts: list[np.ndarray] = []
    app_parts: list[np.ndarray] = []
    deadline_parts: list[np.ndarray] = []
    try:
        handle = open(path, encoding="utf-8-sig", newline=None)
    except OSError as exc:
        raise TraceFormatError(path, None, f"cannot read: {exc.strerror or exc}") from exc
    with handle:
        try:
            header_line = handle.readline()
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, 1, f"not UTF-8 text ({exc.reason})") from exc
        header = tuple(header_line.rstrip("\n").split(","))
        if header not in (HEADER, HEADER_DEADLINE):
            got = header_line.rstrip("\n")
            raise TraceFormatError(
                path, 1,
                f"expected the header '{','.join(HEADER)}' or '{','.join(HEADER_DEADLINE)}', "
                + (f"got {got!r}" if got else "got an empty file" if not header_line else "got an empty line"),
            )
        n_cols = len(header)
        first_line = 2  # file line number of the chunk's first row
        previous_time, previous_text = -math.inf, ""
        while True:
            try:
                lines = list(itertools.islice(handle, _READ_CHUNK_LINES))
            except UnicodeDecodeError as exc:
                raise TraceFormatError(path, None, f"not UTF-8 text ({exc.reason})") from exc
            if not lines:
                break
            n = len(lines)
            commas = np.fromiter(map(str.count, lines, itertools.repeat(",")), dtype=np.intp, count=n)
            wrong = np.flatnonzero(commas != n_cols - 1)
            if wrong.size:
                i = int(wrong[0])
                text = lines[i].rstrip("\n")
                what = "an empty line" if not text.strip() else f"{int(commas[i]) + 1} field(s) in {text!r}"
                raise TraceFormatError(path, first_line + i, f"expected {n_cols} fields ({','.join(header)}), got {what}")
            text = "".join(lines)
            if not text.endswith("\n"):
                text += "\n"
            empty_deadlines = 0
            if n_cols == 3:  # an empty deadline (the only way a row can end in a comma) reads as NaN
                empty_deadlines = text.count(",\n")
                text = text.replace(",\n", ",nan\n")
            flat = text.replace("\n", ",").split(",")
            time_col = flat[0:-1:n_cols]
            name_col = flat[1:-1:n_cols]
            # times
            try:
                times = np.array(time_col, dtype=np.float64)
            except ValueError:
                i, value = _first_unparsable(time_col)
                raise TraceFormatError(path, first_line + i, f"time_s {value!r} is not a number") from None
            bad = np.flatnonzero(~(np.isfinite(times) & (times >= 0)))
            if bad.size:
                i = int(bad[0])
                what = "negative" if times[i] < 0 else "not finite"
                raise TraceFormatError(path, first_line + i, f"time_s {time_col[i]!r} is {what} (times are seconds >= 0)")
            steps = np.diff(times, prepend=previous_time)
            backwards = np.flatnonzero(steps < 0)
            if backwards.size:
                i = int(backwards[0])
                before = previous_text if i == 0 else time_col[i - 1]
                raise TraceFormatError(
                    path, first_line + i,
                    f"time_s {time_col[i]!r} is before the previous row's {before.strip()} (rows must be sorted by time)",
                )
            previous_time, previous_text = float(times[-1]), time_col[-1]
            # applications
            for name in dict.fromkeys(name_col):
                if name in index:
                    continue
                line = first_line + name_col.index(name)
                problem = _application_name_problem(name)
                if problem:
                    raise TraceFormatError(path, line, problem)
                if fixed:
                    raise TraceFormatError(path, line, f"unknown application {name!r} (expected one of {', '.join(index)})")
                index[name] = len(index)
            app_parts.append(np.fromiter(map(index.__getitem__, name_col), dtype=np.int32, count=n))
            time_parts.append(times)
            # deadlines
            if n_cols == 3:
                deadline_col = flat[2:-1:n_cols]
                try:
                    deadlines = np.array(deadline_col, dtype=np.float64)
                except ValueError:
                    i, value = _first_unparsable(deadline_col)
                    raise TraceFormatError(path, first_line + i, f"deadline_ms {value!r} is not a number") from None
                missing = np.isnan(deadlines)
                bad = np.flatnonzero(~missing & ~(np.isfinite(deadlines) & (deadlines > 0)))
                if not bad.size and int(missing.sum()) != empty_deadlines:
                    # some NaN was written out as such (e.g. 'nan') rather than left empty: find the first
                    bad = np.array([i for i in np.flatnonzero(missing) if not lines[i].rstrip("\n").endswith(",")][:1])
                if bad.size:
                    i = int(bad[0])
                    value = lines[i].rstrip("\n").rsplit(",", 1)[-1]
                    raise TraceFormatError(
                        path, first_line + i, f"deadline_ms {value!r} must be a positive number or empty"
                    )
                deadline_parts.append(deadlines)
            first_line += n
    names = tuple(index)

    def joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    return Trace(
        time_s=joined(time_parts, np.float64),
        application=joined(app_parts, np.int32),
        applications=names,
        deadline_ms=joined(deadline_parts, np.float64) if n_cols == 3 else None,
    )


# --------------------------------------------------------------------------- generators: checks


def _positive(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a positive number, got {value!r}")
    return value


def _non_negative(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a non-negative number, got {value!r}")
    return value


def _expected_count_check(expected: float) -> None:
    if expected > MAX_ARRIVALS:
        raise ValueError(f"this would generate about {expected:.3g} arrivals, more than the limit of {MAX_ARRIVALS:,}")


def _single(times: np.ndarray, application: str) -> Trace:
    return Trace(time_s=times, application=np.zeros(times.size, dtype=np.int32), applications=(application,))


# --------------------------------------------------------------------------- renewal processes


def arrivals_uniform(rate: float, duration_s: float, seed: Seed = 0, application: str = DEFAULT_APPLICATION) -> Trace:
    """Arrivals at a constant inter-arrival time: `t_k = k / rate` for every k >= 0 with `t_k < duration_s`
    (the first at 0; `ceil(rate * duration_s)` arrivals). Every whole second holds `rate` arrivals when
    `rate` is an integer. No random draws: `seed` is accepted so all generators share a signature."""
    rate = _positive(rate, "rate")
    duration_s = _positive(duration_s, "duration_s")
    _expected_count_check(rate * duration_s)
    n = max(int(math.ceil(rate * duration_s)), 0)
    while n > 0 and (n - 1) / rate >= duration_s:
        n -= 1
    while n / rate < duration_s:
        n += 1
    return _single(np.arange(n, dtype=np.float64) / rate, application)


def _renewal(rng: np.random.Generator, draw, mean_gap: float, cv: float, duration_s: float) -> np.ndarray:
    """Arrival times of a renewal process started at 0 (the first arrival one gap after 0), up to
    `duration_s`: gaps are drawn in vectorised chunks sized to overshoot the horizon with high probability,
    cumulated, and cut at `duration_s`."""
    parts: list[np.ndarray] = []
    now = 0.0
    while True:
        remaining = (duration_s - now) / mean_gap
        size = int(remaining + 6.0 * cv * math.sqrt(remaining) + 64)
        times = now + np.cumsum(draw(size))
        if times[-1] >= duration_s:
            parts.append(times[: int(np.searchsorted(times, duration_s, side="left"))])
            break
        parts.append(times)
        now = float(times[-1])
    return np.concatenate(parts)


def arrivals_poisson(rate: float, duration_s: float, seed: Seed = 0, application: str = DEFAULT_APPLICATION) -> Trace:
    """A homogeneous Poisson process of `rate` arrivals/s on `[0, duration_s)`: inter-arrival gaps are
    exponential with mean `1 / rate` (CV 1), drawn with `rng.exponential(1 / rate, size)` in chunks and
    cumulated; the first arrival is one gap after 0."""
    rate = _positive(rate, "rate")
    duration_s = _positive(duration_s, "duration_s")
    _expected_count_check(rate * duration_s)
    rng = np.random.default_rng(seed)
    scale = 1.0 / rate
    times = _renewal(rng, lambda size: rng.exponential(scale, size), scale, 1.0, duration_s)
    return _single(times, application)


def arrivals_gamma(
    rate: float, duration_s: float, shape: float, seed: Seed = 0, application: str = DEFAULT_APPLICATION
) -> Trace:
    """A gamma renewal process on `[0, duration_s)`: inter-arrival gaps are Gamma(k = `shape`,
    theta = 1 / (rate k)), drawn with `rng.gamma(shape, theta, size)` in chunks and cumulated (the first
    arrival one gap after 0). The mean gap is k theta = 1 / rate, so the mean rate is `rate`; the gaps' CV is
    1 / sqrt(k). k = 1 is a Poisson process; k < 1 is burstier, e.g. k = 0.05 (CV 4.47, Proteus's setting)
    gives micro-bursts of near-simultaneous queries separated by long gaps. The count over a long window
    T has variance about `rate T / k`, so short windows of a small-k trace deviate a lot from `rate`."""
    rate = _positive(rate, "rate")
    duration_s = _positive(duration_s, "duration_s")
    shape = _positive(shape, "shape")
    _expected_count_check(rate * duration_s)
    rng = np.random.default_rng(seed)
    theta = 1.0 / (rate * shape)
    times = _renewal(rng, lambda size: rng.gamma(shape, theta, size), 1.0 / rate, 1.0 / math.sqrt(shape), duration_s)
    return _single(times, application)


# --------------------------------------------------------------------------- rate curves and thinning


class RateCurve(Protocol):
    """A time-varying arrival rate lambda(t) (arrivals/s) that `arrivals_from_rate_curve` can thin against."""

    def rate(self, t: np.ndarray) -> np.ndarray:
        """lambda(t) at each time (vectorised)."""
        ...

    def windows(self, duration_s: float) -> np.ndarray:
        """Window edges from 0 to `duration_s` (increasing) on which `bound` is tight enough to thin."""
        ...

    def bound(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """An upper bound of lambda on each window `[start[i], end[i]]`."""
        ...


def arrivals_from_rate_curve(
    curve: RateCurve, duration_s: float, seed: Seed = 0, application: str = DEFAULT_APPLICATION
) -> Trace:
    """An inhomogeneous Poisson process with rate `curve.rate(t)` on `[0, duration_s)`, made by thinning
    (Lewis and Shedler) against a piecewise-constant majorant: on each window `[a, b)` of
    `curve.windows(duration_s)`, with `M = curve.bound(a, b)`, draw `rng.poisson(M (b - a))` candidates
    (all windows in one call), place them uniformly (`rng.random`), and keep each with probability
    `lambda(t) / M` (one more `rng.random` per candidate, kept when `u M < lambda(t)`). Everything is
    vectorised; the kept times are sorted."""
    duration_s = _positive(duration_s, "duration_s")
    rng = np.random.default_rng(seed)
    edges = np.asarray(curve.windows(duration_s), dtype=np.float64)
    start, end = edges[:-1], edges[1:]
    width = end - start
    majorant = np.asarray(curve.bound(start, end), dtype=np.float64)
    if majorant.shape != start.shape or not np.all(np.isfinite(majorant) & (majorant >= 0)):
        raise ValueError("the rate curve's bound must be finite and non-negative on every window")
    _expected_count_check(float(np.sum(majorant * width)))
    counts = rng.poisson(majorant * width)
    total = int(counts.sum())
    candidates = np.repeat(start, counts) + rng.random(total) * np.repeat(width, counts)
    rates = np.asarray(curve.rate(candidates), dtype=np.float64)
    bounds = np.repeat(majorant, counts)
    if np.any(rates > bounds * (1 + 1e-9) + 1e-12):
        raise ValueError("the rate curve exceeds its own bound: thinning would be wrong")
    keep = rng.random(total) * bounds < rates
    times = np.sort(candidates[keep])
    times = times[times < duration_s]
    return _single(times, application)


@dataclass(frozen=True)
class StepCurve:
    """A periodic step rate: in each period `[k P, (k+1) P)` the rate is `low_rate` for the first
    `(1 - high_fraction) P` seconds and `high_rate` for the last `high_fraction P` seconds."""

    low_rate: float
    high_rate: float
    period_s: float
    high_fraction: float

    def __post_init__(self) -> None:
        _non_negative(self.low_rate, "low_rate")
        _non_negative(self.high_rate, "high_rate")
        _positive(self.period_s, "period_s")
        if not 0 <= self.high_fraction <= 1:
            raise ValueError(f"high_fraction must be between 0 and 1, got {self.high_fraction!r}")
        if self.high_rate < self.low_rate:
            raise ValueError(f"high_rate ({self.high_rate:g}) must be at least low_rate ({self.low_rate:g})")

    @property
    def mean_rate(self) -> float:
        """The rate averaged over a whole period."""
        return self.low_rate * (1 - self.high_fraction) + self.high_rate * self.high_fraction

    def _high_start(self, t: np.ndarray) -> np.ndarray:
        return np.floor(t / self.period_s) * self.period_s + (1 - self.high_fraction) * self.period_s

    def rate(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        return np.where(t >= self._high_start(t), self.high_rate, self.low_rate)

    def windows(self, duration_s: float) -> np.ndarray:
        periods = duration_s / self.period_s
        if periods > 5_000_000:
            raise ValueError(f"period_s {self.period_s:g} is too short for a {duration_s:g} s trace")
        k = np.arange(int(math.ceil(periods)) + 1, dtype=np.float64) * self.period_s
        edges = np.concatenate([k, k + (1 - self.high_fraction) * self.period_s, [0.0, duration_s]])
        return np.unique(edges[(edges >= 0) & (edges <= duration_s)])

    def bound(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        start = np.asarray(start, dtype=np.float64)
        high_start = self._high_start(start)
        touches_high = (start >= high_start) | (np.asarray(end) > high_start)
        return np.where(touches_high, self.high_rate, self.low_rate)


def rate_curve_macro_bursts(low_rate: float, high_rate: float, period_s: float, high_fraction: float) -> StepCurve:
    """The step curve of `arrivals_macro_bursts` (see `StepCurve`)."""
    return StepCurve(float(low_rate), float(high_rate), float(period_s), float(high_fraction))


def arrivals_macro_bursts(
    low_rate: float,
    high_rate: float,
    period_s: float,
    high_fraction: float,
    duration_s: float,
    seed: Seed = 0,
    application: str = DEFAULT_APPLICATION,
) -> Trace:
    """Macro-bursts: flat low and high periods. Each period of `period_s` seconds starts with
    `(1 - high_fraction) period_s` seconds at `low_rate` and ends with `high_fraction period_s` seconds at
    `high_rate`; within each flat stretch arrivals are Poisson. The mean rate over whole periods is
    `low_rate (1 - high_fraction) + high_rate high_fraction`. Made by `arrivals_from_rate_curve` on
    `StepCurve`, whose windows are exactly the flat stretches (so every candidate is kept): the draws are
    one `rng.poisson` per stretch, one `rng.random` per arrival for its place, one `rng.random` per arrival
    for the (always passed) thinning test."""
    curve = rate_curve_macro_bursts(low_rate, high_rate, period_s, high_fraction)
    return arrivals_from_rate_curve(curve, duration_s, seed, application)


@dataclass(frozen=True)
class Spike:
    """A short burst on top of the diurnal curve: starting at `at_s` the rate multiplier rises linearly
    from 1 to `1 + height` over `rise_s` seconds, then decays back towards 1 exponentially with time
    constant `decay_s`: `1 + height g(t - at_s)` with `g(u) = 0` for u < 0, `u / rise_s` for
    0 <= u < rise_s, `exp(-(u - rise_s) / decay_s)` after. Spikes add up."""

    at_s: float
    height: float
    rise_s: float
    decay_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.at_s):
            raise ValueError(f"spike at_s must be finite, got {self.at_s!r}")
        _non_negative(self.height, "spike height")
        _positive(self.rise_s, "spike rise_s")
        _positive(self.decay_s, "spike decay_s")

    def shape(self, t: np.ndarray) -> np.ndarray:
        """g(t - at_s): 0 before the spike, 1 at its top."""
        u = np.asarray(t, dtype=np.float64) - self.at_s
        rising = np.clip(u / self.rise_s, 0.0, 1.0)
        decaying = np.exp(-np.maximum(u - self.rise_s, 0.0) / self.decay_s)
        return np.where(u < self.rise_s, rising, decaying)

    @property
    def top_s(self) -> float:
        return self.at_s + self.rise_s


@dataclass(frozen=True)
class DiurnalCurve:
    """lambda(t) = scale * (1 + A cos(2 pi (t - peak_s) / day_s)) * (1 + sum_k height_k g_k(t)).

    One day lasts `day_s` seconds of trace time; the base curve peaks at `peak_s` (+ whole days) and has
    its trough half a day later, with peak/trough = (1 + A) / (1 - A). `scale` is set (by
    `rate_curve_diurnal`) so that the mean over the trace's duration is the requested mean rate."""

    scale: float
    amplitude: float
    day_s: float
    peak_s: float
    spikes: tuple[Spike, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(self.scale, "scale")
        if not 0 <= self.amplitude < 1:
            raise ValueError(f"amplitude must be in [0, 1), got {self.amplitude!r}")
        _positive(self.day_s, "day_s")

    @property
    def peak_to_trough(self) -> float:
        return (1 + self.amplitude) / (1 - self.amplitude)

    def base(self, t: np.ndarray) -> np.ndarray:
        """The diurnal part, without spikes (arrivals/s)."""
        t = np.asarray(t, dtype=np.float64)
        return self.scale * (1 + self.amplitude * np.cos(2 * math.pi * (t - self.peak_s) / self.day_s))

    def spike_factor(self, t: np.ndarray) -> np.ndarray:
        factor = np.ones_like(np.asarray(t, dtype=np.float64))
        for spike in self.spikes:
            factor += spike.height * spike.shape(t)
        return factor

    def rate(self, t: np.ndarray) -> np.ndarray:
        return self.base(t) * self.spike_factor(t)

    def window_s(self) -> float:
        """Thinning window: a 1/1440 of a day (a minute of a real day) or half the shortest spike rise."""
        return min([self.day_s / 1440] + [s.rise_s / 2 for s in self.spikes])

    def windows(self, duration_s: float) -> np.ndarray:
        width = max(self.window_s(), duration_s / 5_000_000)
        n = max(int(math.ceil(duration_s / width)), 1)
        edges = np.arange(n + 1, dtype=np.float64) * (duration_s / n)
        edges[-1] = duration_s
        return edges

    def bound(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        start = np.asarray(start, dtype=np.float64)
        end = np.asarray(end, dtype=np.float64)
        # The cosine's maximum over [a, b] is at a peak inside it, or else at an end.
        first_peak = np.ceil((start - self.peak_s) / self.day_s)
        has_peak = first_peak * self.day_s + self.peak_s <= end
        base = np.where(has_peak, self.scale * (1 + self.amplitude), np.maximum(self.base(start), self.base(end)))
        # Each spike shape is unimodal with its top at top_s: its maximum over [a, b] is at clip(top_s, a, b).
        factor = np.ones_like(start)
        for spike in self.spikes:
            factor += spike.height * spike.shape(np.clip(spike.top_s, start, end))
        return base * factor


def rate_curve_diurnal(
    mean_rate: float,
    duration_s: float,
    *,
    peak_to_trough: float = 2.0,
    day_s: float = 1440.0,
    peak_hour: float = 15.0,
    spikes: int | Sequence[Spike] = 3,
    seed: Seed = 0,
) -> DiurnalCurve:
    """The compressed-day rate curve of `arrivals_diurnal` (formula in `DiurnalCurve`).

    - One day is `day_s` seconds of trace time (default 1440 s: 24 minutes, a real minute per trace second,
      like the 24-minute compressed runs of Proteus). The base curve is a cosine peaking at
      `peak_hour` o'clock (default 15:00) and bottoming out 12 hours later, with
      max/min = `peak_to_trough` exactly (A = (R - 1) / (R + 1)).
    - `spikes`: explicit `Spike`s, or a number of random ones drawn from `numpy.random.default_rng(seed)`
      in this order: start times `rng.uniform(0, duration_s, n)` (sorted), heights
      `rng.uniform(0.5, 2.0, n)` (the top is 1.5x to 3x the diurnal rate at that time), decay constants
      `rng.uniform(0.01, 0.03, n) * day_s` (15 to 45 real minutes); the rise is `0.004 day_s` (about six
      real minutes): a steep ramp and a slower decay, as event-driven spikes in tweet volume look.
    - `scale` makes the curve's mean over `[0, duration_s)` equal `mean_rate`, spikes included (so with
      spikes the diurnal base is a little lower). The mean is integrated numerically with the midpoint rule
      on at least 10,000 points, spaced no more than 1/20 of a spike's rise or 1/2880 of a day.
    """
    mean_rate = _positive(mean_rate, "mean_rate")
    duration_s = _positive(duration_s, "duration_s")
    ratio = float(peak_to_trough)
    if not (math.isfinite(ratio) and ratio >= 1):
        raise ValueError(f"peak_to_trough must be a number >= 1, got {peak_to_trough!r}")
    day_s = _positive(day_s, "day_s")
    if not (math.isfinite(peak_hour) and 0 <= peak_hour < 24):
        raise ValueError(f"peak_hour must be in [0, 24), got {peak_hour!r}")
    if isinstance(spikes, (int, np.integer)) and not isinstance(spikes, bool):
        if spikes < 0:
            raise ValueError(f"spikes must be a non-negative count, got {spikes}")
        rng = np.random.default_rng(seed)
        starts = np.sort(rng.uniform(0.0, duration_s, int(spikes)))
        heights = rng.uniform(0.5, 2.0, int(spikes))
        decays = rng.uniform(0.01, 0.03, int(spikes)) * day_s
        chosen = tuple(Spike(float(a), float(h), 0.004 * day_s, float(d)) for a, h, d in zip(starts, heights, decays))
    else:
        chosen = tuple(spikes)
        if not all(isinstance(s, Spike) for s in chosen):
            raise ValueError("spikes must be a count or a sequence of Spike")
    amplitude = (ratio - 1) / (ratio + 1)
    unit = DiurnalCurve(scale=1.0, amplitude=amplitude, day_s=day_s, peak_s=peak_hour / 24 * day_s, spikes=chosen)
    step = min([day_s / 2880] + [s.rise_s / 20 for s in chosen])
    n = int(min(max(math.ceil(duration_s / step), 10_000), 4_000_000))
    grid = (np.arange(n, dtype=np.float64) + 0.5) * (duration_s / n)
    unit_mean = float(np.mean(unit.rate(grid)))
    return DiurnalCurve(
        scale=mean_rate / unit_mean, amplitude=amplitude, day_s=day_s, peak_s=unit.peak_s, spikes=chosen
    )


def arrivals_diurnal(
    mean_rate: float,
    duration_s: float,
    seed: Seed = 0,
    *,
    peak_to_trough: float = 2.0,
    spikes: int | Sequence[Spike] = 3,
    day_s: float = 1440.0,
    peak_hour: float = 15.0,
    application: str = DEFAULT_APPLICATION,
) -> Trace:
    """A Twitter-like diurnal workload: an inhomogeneous Poisson process whose rate follows
    `rate_curve_diurnal(mean_rate, duration_s, ...)` (a compressed day, cosine-shaped with the given
    peak-to-trough ratio, plus short spikes), generated by thinning (`arrivals_from_rate_curve`) with
    windows of a real minute (1/1440 of `day_s`) or less. One generator `default_rng(seed)` draws the
    random spikes first (if `spikes` is a count), then the arrivals. The expected mean rate over
    `[0, duration_s)` is `mean_rate`."""
    rng = np.random.default_rng(seed)
    curve = rate_curve_diurnal(
        mean_rate, duration_s, peak_to_trough=peak_to_trough, day_s=day_s, peak_hour=peak_hour, spikes=spikes, seed=rng
    )
    return arrivals_from_rate_curve(curve, duration_s, rng, application)


# --------------------------------------------------------------------------- applications


def zipf_shares(n: int, alpha: float = PROTEUS_ZIPF_ALPHA) -> np.ndarray:
    """Zipf popularity of `n` ranks: share of rank i (1-based) = i^-alpha / sum_j j^-alpha."""
    if n < 1:
        raise ValueError(f"need at least one application, got {n}")
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"the Zipf alpha must be a non-negative number, got {alpha!r}")
    weights = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return weights / weights.sum()


def split_zipf(
    trace_or_total: Trace | float,
    applications: Sequence[str],
    alpha: float = PROTEUS_ZIPF_ALPHA,
    seed: Seed = 0,
) -> Trace | dict[str, float]:
    """Spread load over `applications` with Zipf popularity: the i-th application (rank i, 1-based) gets
    the share i^-alpha / sum_j j^-alpha (`zipf_shares`; alpha 1.001 as in Proteus, so rank 1 gets about
    2^alpha times rank 2's share).

    - Given a `Trace`: every arrival is assigned an application independently with those probabilities
      (inverse CDF: one `rng.random(len(trace))` draw, `searchsorted` into the cumulative shares). Times
      and deadlines are kept; the result's applications are exactly `applications`.
    - Given a number (a total rate or count): the expected split, `{application: total * share}`
      (deterministic; `seed` unused).
    """
    names = _applications_check(applications)
    shares = zipf_shares(len(names), alpha)
    if not isinstance(trace_or_total, Trace):
        total = float(trace_or_total)
        if not (math.isfinite(total) and total >= 0):
            raise ValueError(f"the total to split must be a non-negative number, got {trace_or_total!r}")
        return {name: total * float(share) for name, share in zip(names, shares)}
    trace = trace_or_total
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(shares)
    cumulative[-1] = 1.0
    assigned = np.searchsorted(cumulative, rng.random(len(trace)), side="right").astype(np.int32)
    return Trace(time_s=trace.time_s, application=assigned, applications=names, deadline_ms=trace.deadline_ms)


_KIND_PARAMS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "poisson": {},
    "gamma": {"shape": 0.05},
    "macro-bursts": {"burst_factor": 4.0, "period_s": 60.0, "high_fraction": 0.25},
    "diurnal": {"peak_to_trough": 2.0, "spikes": 3, "day_s": 1440.0, "peak_hour": 15.0},
}


def _arrivals_of_kind(
    kind: str, rate: float, duration_s: float, seed: Seed, params: Mapping[str, Any], application: str
) -> Trace:
    if kind == "uniform":
        return arrivals_uniform(rate, duration_s, seed, application)
    if kind == "poisson":
        return arrivals_poisson(rate, duration_s, seed, application)
    if kind == "gamma":
        return arrivals_gamma(rate, duration_s, params["shape"], seed, application)
    if kind == "macro-bursts":
        factor = float(params["burst_factor"])
        if not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"burst_factor (high rate / low rate) must be >= 1, got {params['burst_factor']!r}")
        fraction = float(params["high_fraction"])
        if not 0 <= fraction <= 1:
            raise ValueError(f"high_fraction must be between 0 and 1, got {params['high_fraction']!r}")
        low = rate / ((1 - fraction) + fraction * factor)
        return arrivals_macro_bursts(low, low * factor, params["period_s"], fraction, duration_s, seed, application)
    return arrivals_diurnal(
        rate, duration_s, seed, peak_to_trough=params["peak_to_trough"], spikes=params["spikes"],
        day_s=params["day_s"], peak_hour=params["peak_hour"], application=application,
    )


def trace_for_applications(
    kind: str,
    applications: Sequence[str],
    total_rate: float,
    duration_s: float,
    seed: Seed = 0,
    *,
    zipf_alpha: float = PROTEUS_ZIPF_ALPHA,
    independent: bool = False,
    deadline_ms: float | Mapping[str, float] | None = None,
    **params: Any,
) -> Trace:
    """A multi-application trace: arrivals of `kind` (one of `KINDS`) at `total_rate` arrivals/s on
    average, spread over `applications` with Zipf popularity (`zipf_alpha`, rank = position in
    `applications`).

    Kind parameters (`params`), with defaults: gamma `shape=0.05`; macro-bursts `burst_factor=4.0`
    (high/low rate), `period_s=60.0`, `high_fraction=0.25` (low and high rates are set so the mean is
    `total_rate`); diurnal `peak_to_trough=2.0`, `spikes=3`, `day_s=1440.0`, `peak_hour=15.0`.

    Seeding: `SeedSequence(seed)` is spawned into independent streams. By default (`independent=False`)
    one aggregate process is generated from the first stream and each arrival is assigned an application
    from the second (`split_zipf`): bursts are shared by all applications. With `independent=True`, each
    application gets its own process at `total_rate * share` from its own stream (stream i for rank i),
    and the traces are merged: bursts are independent. `deadline_ms` adds deadlines (`Trace.with_deadlines`).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r} (expected one of {', '.join(KINDS)})")
    unknown = sorted(set(params) - set(_KIND_PARAMS[kind]))
    if unknown:
        accepted = ", ".join(_KIND_PARAMS[kind]) or "none"
        raise ValueError(f"parameter(s) {', '.join(unknown)} do not apply to kind {kind!r} (accepted: {accepted})")
    settings = {**_KIND_PARAMS[kind], **params}
    names = _applications_check(applications)
    if not names:
        raise ValueError("need at least one application")
    total_rate = _positive(total_rate, "total_rate")
    sequence = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(
        seed.integers(0, 2**63) if isinstance(seed, np.random.Generator) else seed
    )
    if independent:
        rates = split_zipf(total_rate, names, zipf_alpha)
        streams = sequence.spawn(len(names))
        parts = [
            _arrivals_of_kind(kind, rates[name], duration_s, stream, settings, name)
            for name, stream in zip(names, streams)
            if rates[name] > 0
        ]
        times = np.concatenate([part.time_s for part in parts])
        apps = np.concatenate([np.full(len(part), names.index(part.applications[0]), dtype=np.int32) for part in parts])
        order = np.argsort(times, kind="stable")
        trace = Trace(time_s=times[order], application=apps[order], applications=names)
    else:
        arrivals_stream, split_stream = sequence.spawn(2)
        zipf_shares(len(names), zipf_alpha)  # validate alpha before the (possibly long) generation
        aggregate = _arrivals_of_kind(kind, total_rate, duration_s, arrivals_stream, settings, DEFAULT_APPLICATION)
        trace = split_zipf(aggregate, names, zipf_alpha, split_stream)
    return trace.with_deadlines(deadline_ms) if deadline_ms is not None else trace
