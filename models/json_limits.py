"""How large and how deep JSON may be at each door where it enters, in one place, with the one
depth check every door uses.

Depth counts levels of arrays and objects: a number or a string is 0 levels, ``[]`` and ``{}``
are 1, ``{"a": [1]}`` is 2. Every VALUE that enters, by any door, may nest at most
:data:`MAX_DEPTH` (64) levels, counted from its own top: a job's params (the params object is
the first level), each step's params of a workflow, a signal's payload, an uploaded import
file. A document that CARRIES such values, or that a kind makes around one, may add
:data:`ENVELOPE_LEVELS` (8) levels of its own, :data:`MAX_ENVELOPE_DEPTH` (72): an HTTP body
(the deepest value one carries is a step's params in a batch's workflow, 6 levels down:
``{"jobs": [{"params": {"steps": [{"params": …``), a workflow's params (3 levels above its
steps' params), a kind's result and a step's recorded value (``{"payload": …}`` around a
signal's payload at the limit). Python's own parser and encoder give up near 1,000 levels,
fewer the deeper the stack that calls them, so a document past any limit could be accepted by
one process and fail in the next; at 72 every reader of ours (the web, a worker, psycopg's
loader, ``Jobs.wait``) is hundreds of levels away from that.

Each door, its size limit and its depth limit (docs/reference/http-api.md, "Limits", says the
same for clients):

- an HTTP body, on any route, and a form with its file: :data:`MAX_BODY_BYTES` (1 MiB, else
  413 ``payload_too_large``); 72 levels as a whole (else 400 ``invalid_request``), and what it
  carries as below;
- a job's params (the API, the pages, the Python API's ``submit``, ``submit_many``,
  ``enqueue``, ``submit_workflow``): :data:`MAX_PARAMS_BYTES` (1 MiB as compact UTF-8 JSON,
  after the kind's model) and 64 levels, checked before the kind's model (a workflow's: each
  step's params 64, the whole 72). A fan-out's items, the params of its children: 64 levels;
- a signal's payload (the API, ``Jobs.signal``): :data:`MAX_SIGNAL_BYTES` (64 KiB) and 64;
- an uploaded import file (the Jobs page): the form's 1 MiB, and 64 levels (it is the
  import's params);
- a kind's result: no size limit of its own (over ``SPACEJOBS_RESULT_INLINE_MAX_BYTES``,
  256 KiB, it goes to the results store), and 72 levels, else its attempt fails
  ``result_not_storable`` at once;
- a step's recorded value (``ctx.step``, a signal a wait took): the kind's own, no size limit;
  72 levels, as a result.

Every check here is iterative (level by level), so neither it nor a value that refers to
itself can recurse, and each refusal names the field and the limit, never the value.
"""

from __future__ import annotations

import json
from typing import Any

from spacejobs.models.errors import InvalidRequest, ResultNotStorable

#: levels of arrays and objects one value that enters may nest (see the module's table)
MAX_DEPTH = 64
#: levels that what carries values at MAX_DEPTH, or wraps one, may add of its own
ENVELOPE_LEVELS = 8
#: an HTTP body, a workflow's params, a kind's result, a step's value
MAX_ENVELOPE_DEPTH = MAX_DEPTH + ENVELOPE_LEVELS

#: an HTTP request's body (the web's MAX_CONTENT_LENGTH): JSON, or a form with its file
MAX_BODY_BYTES = 1024 * 1024
#: a job's params, encoded as compact UTF-8 JSON (so any the API takes in a body fits)
MAX_PARAMS_BYTES = 1024 * 1024
#: a signal's payload, encoded the same way
MAX_SIGNAL_BYTES = 64 * 1024

_CONTAINERS = (dict, list, tuple)
#: one encoder for every size check (json.dumps with options builds a new one each call)
_COMPACT = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def nests_past(value: object, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects (dicts, lists, tuples) more than ``limit``
    levels deep. Level by level, holding only the containers of one level at a time: no
    recursion, and it stops at the first level past ``limit`` (so a value that contains itself
    is "too deep", not an endless loop)."""
    level: list[Any] = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, _CONTAINERS)]
    return False


def too_deep(what: str, limit: int = MAX_DEPTH) -> str:
    """The sentence of a refusal: the rule, never the value."""
    return f"{what} may nest arrays and objects at most {limit} levels deep."


def check_depth(value: object, what: str, field: str, *, limit: int = MAX_DEPTH,
                **details: object) -> None:
    """InvalidRequest naming ``field`` (and saying ``what`` and the limit) when ``value`` nests
    past ``limit``. Call it before anything else reads the value: a parser, a printer or a
    pydantic model could recurse on it."""
    if nests_past(value, limit):
        refused = InvalidRequest(too_deep(what, limit), fields=[field])
        refused.details.update(details)
        raise refused


def check_params(params: object, *, workflow: bool = False) -> None:
    """A job's params, before its kind's model reads them: MAX_DEPTH levels. A workflow's
    (``workflow=True``) carry its steps' params (``{"steps": [{"params": …}, …]}``): each step's
    params MAX_DEPTH, the whole MAX_ENVELOPE_DEPTH (its model checks the rest of its shape)."""
    if not workflow:
        check_depth(params, "A job's params", "params")
        return
    steps = params.get("steps") if isinstance(params, dict) else None
    for place, step in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(step, dict):
            check_step_params(step.get("params"), place)
    handler = params.get("on_failure") if isinstance(params, dict) else None
    if isinstance(handler, dict):
        check_step_params(handler.get("params"), "on_failure")
    check_depth(params, "A workflow's params", "params", limit=MAX_ENVELOPE_DEPTH)


def check_step_params(params: object, place: int | str) -> None:
    """One workflow step's params (``place``: its index among the steps, as a refusal of its
    kind's model names it; ``on_failure`` for the workflow's failure handler)."""
    check_depth(params, "A step's params", "steps", step=place)


def encoded_size(value: object) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (what a body of it would at least hold). Check
    its depth first: the encoder recurses."""
    return len(_COMPACT.encode(value).encode("utf-8", "surrogatepass"))


def check_size(value: object, what: str, field: str, limit: int) -> None:
    """InvalidRequest naming ``field`` when ``value`` is not JSON or holds more than ``limit``
    bytes (:func:`encoded_size`)."""
    try:
        size = encoded_size(value)
    except ValueError:  # NaN or an infinity: JSON (and jsonb) has neither
        raise InvalidRequest(f"{what} must be JSON: it holds NaN or an infinite number.",
                             fields=[field]) from None
    except TypeError:
        raise InvalidRequest(f"{what} must be JSON: it holds a value JSON has no form for.",
                             fields=[field]) from None
    if size > limit:
        raise InvalidRequest(f"{what} holds at most {_bytes(limit)}.", fields=[field])


def check_written(value: object, what: str) -> None:
    """What a kind writes (``what``: its result, a step's value): past MAX_ENVELOPE_DEPTH,
    ResultNotStorable, which fails the attempt at once (the next would write the same)."""
    if nests_past(value, MAX_ENVELOPE_DEPTH):
        raise ResultNotStorable(f"{what} cannot be kept: it nests arrays and objects more than "
                                f"{MAX_ENVELOPE_DEPTH} levels deep.")


def _bytes(count: int) -> str:
    if count % (1024 * 1024) == 0:
        return f"{count // (1024 * 1024)} MiB"
    if count % 1024 == 0:
        return f"{count // 1024} KiB"
    return f"{count} bytes"
