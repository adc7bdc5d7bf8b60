"""A smoke run of ``python -m bench.storage_sketch``, tiny, on the private PostgreSQL 15 it
starts: every variant's life is written and measured, and the narrow shapes do what they are
there for (the claim's and the finish's updates of the job's row are HOT). The figures
themselves are read in the benchmark's report, not judged here."""

from __future__ import annotations

import re

from bench.tests.test_hold import run
from tests.kit.servers import Servers

LINE = re.compile(r"^(?P<variant>[^:\n]+): WAL (?P<wal>[\d,]+) B a job; rows (?P<rows>[\d.]+) a job"
                  r" \((?P<hot>[\d.]+) HOT updates\); growth [\d,]+ KB per 1,000 jobs\n"
                  r" +by relation: (?P<relations>.+)$", re.MULTILINE)


def test_the_sketch_writes_every_variants_life_and_the_narrow_rows_update_in_place(
        servers: Servers) -> None:
    out = run(servers, "bench.storage_sketch", "--jobs", "100", "--batch", "20")
    lines = {m["variant"]: m for m in LINE.finditer(out)}
    assert list(lines) == ["wide (today's shape)", "narrow, rows deleted", "narrow, rows truncated",
                           "narrow, rows truncated, no birth event"], out
    wide = lines["wide (today's shape)"]
    assert "wide_jobs_pkey" in wide["relations"] and "wide_events" in wide["relations"], out
    # Every job is born, claimed and finished: three rows of its own and three events at least.
    assert all(float(m["rows"]) >= 6 for m in lines.values()), out
    # Today's claim and finish make new versions with an entry in every index; in the narrow
    # shapes both are HOT (the count row's update is HOT in every shape).
    for variant in ("narrow, rows deleted", "narrow, rows truncated"):
        assert float(lines[variant]["hot"]) >= float(wide["hot"]) + 1.9, out
