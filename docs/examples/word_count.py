"""A job kind: the most common words in an organization's project descriptions.

Workers and web processes load it when this module is named in SPACEJOBS_EXTRA_KIND_MODULES
(here `word_count`, with this folder on PYTHONPATH). tests/integration/test_guides.py runs it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated, Any

from pydantic import Field

from spacejobs import JobContext, Params, job_kind
from spacejobs.demo.projects import Projects

WORD = re.compile(r"[^\W\d_]+")


class WordCountParams(Params):
    """What a submit may ask for; anything else is refused with 400 invalid_params."""

    top: Annotated[int, Field(ge=1, le=100, title="How many words",
                              description="The most common words, this many of them.")] = 10
    min_length: Annotated[int, Field(ge=1, le=50, title="Shortest word",
                                     description="Words shorter than this are not counted.")] = 3


@job_kind("word_count", org_states={"active", "read_only"}, role="member",
          max_attempts=3, params=WordCountParams,
          # how the Jobs page offers it: a card with this label and sentence, and a form made
          # from WordCountParams (its titles, descriptions, bounds and defaults)
          label="Count words", description="The most common words in the projects' descriptions.",
          start_from_pages=True)
def count_words(ctx: JobContext, params: WordCountParams) -> dict[str, Any]:
    # A transaction scoped to the job's organization: only its rows are visible.
    with ctx.tenant() as tenant:
        projects = Projects.of(tenant).list()
    counts: Counter[str] = Counter()
    for done, project in enumerate(projects, start=1):
        counts.update(word for word in WORD.findall(project.description.lower())
                      if len(word) >= params.min_length)
        if done % 100 == 0 or done == len(projects):
            ctx.progress("counting words", done=done, total=len(projects))  # also a checkpoint
    return {"projects": len(projects),
            "words": [{"word": word, "count": count} for word, count in counts.most_common(params.top)]}
