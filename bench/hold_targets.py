"""Issue 32's targets for a queue under a long-open transaction, judged the same way by
bench.hold (Space Jobs beside PgQueuer) and bench.soak (Space Jobs alone, for an hour):

- in the hold's last minute, the claim p95 and the end-to-end p95 at most 1.5x those of the
  minute before the hold;
- in the first minute after the hold, both back to at most 1.2x the minute before it;
- (bench.soak) the tables' size at the end at most 1.5x their size in the minute before the hold.

A run is a list of per-minute p95s; the three minutes compared are picked by their 1-based index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HOLD_RATIO = 1.5
AFTER_RATIO = 1.2
SIZE_RATIO = 1.5


@dataclass(frozen=True)
class P95s:
    """One minute's claim p95 and end-to-end p95, in seconds (None: nothing measured in it)."""

    claim: float | None
    e2e: float | None


@dataclass(frozen=True)
class AroundHold:
    """The three minutes the targets compare; None where the run had no such minute."""

    before: P95s | None  # the last minute before the hold opened
    last: P95s | None  # the last minute the hold was open in
    after: P95s | None  # the first minute after it ended


def around_hold(minutes: Sequence[P95s], hold_first: int, hold_last: int) -> AroundHold:
    """Pick the minutes around a hold open from minute ``hold_first`` to ``hold_last``
    (1-based, inclusive) out of a run's minutes."""

    def at(index: int) -> P95s | None:
        return minutes[index - 1] if 1 <= index <= len(minutes) else None

    return AroundHold(at(hold_first - 1), at(hold_last), at(hold_last + 1))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _ratio(later: P95s | None, earlier: P95s | None, figure: str) -> tuple[float, float, float] | None:
    """(ratio, later, earlier) of ``figure`` ('claim' or 'e2e'), or None if either is missing."""
    if later is None or earlier is None:
        return None
    high, low = getattr(later, figure), getattr(earlier, figure)
    if high is None or low is None or low <= 0:
        return None
    return high / low, high, low


def _comparison(name: str, run: AroundHold, figure: str, when: str) -> tuple[str, bool | None]:
    later = run.last if when == "last" else run.after
    found = _ratio(later, run.before, figure)
    if found is None:
        return f"{name} not measured", None
    ratio, high, low = found
    return f"{name} {ratio:.2f}x ({ms(high)} vs {ms(low)} ms)", ratio <= (
        HOLD_RATIO if when == "last" else AFTER_RATIO)


def hold_lines(name: str, run: AroundHold, peer: tuple[str, AroundHold] | None = None) -> list[str]:
    """One line per target, ``name``'s ratio and verdict, a peer's ratio (and its own verdict,
    in brackets) beside it when given."""
    lines = []
    for figure, words in (("claim", "claim p95"), ("e2e", "end-to-end p95")):
        for when, limit, where in (("last", HOLD_RATIO, "in the hold's last minute"),
                                   ("after", AFTER_RATIO, "in the first minute after the hold")):
            said, ok = _comparison(name, run, figure, when)
            line = (f"target {words} {where} <= {limit}x the minute before the hold: {said}"
                    + ("" if ok is None else f" {verdict(ok)}"))
            if peer is not None:
                peer_said, peer_ok = _comparison(peer[0], peer[1], figure, when)
                line += f"; beside it {peer_said}" + (
                    "" if peer_ok is None else f" [{verdict(peer_ok)}]")
            lines.append(line)
    return lines


def size_line(name: str, before_bytes: int | None, end_bytes: int | None, what: str) -> str:
    """The size target: ``what`` at the end at most 1.5x its size in the minute before the hold."""
    if not before_bytes or end_bytes is None:
        return f"target {what} at the end <= {SIZE_RATIO}x before the hold: {name} not measured"
    ratio = end_bytes / before_bytes
    return (f"target {what} at the end <= {SIZE_RATIO}x before the hold: {name} {ratio:.2f}x"
            f" ({end_bytes / 2**20:.1f} vs {before_bytes / 2**20:.1f} MB)"
            f" {verdict(ratio <= SIZE_RATIO)}")
