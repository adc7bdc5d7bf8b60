"""The Jobs page's import upload, fuzzed the way schemathesis fuzzes the JSON API: hypothesis
makes hostile files (NULs and lone surrogates in strings, numbers past any range, nesting past
the parser's recursion, invalid UTF-8, repeated keys, truncated and mangled documents, bytes
at random) and a signed-in admin uploads each through the real form, CSRF token and all.

Every answer must be no 5xx: either the import is accepted (a redirect to its job) or the page
says what is wrong with the file (a 4xx with its problem paragraph) and no job was written.
"""

from __future__ import annotations

import io
import json
import re
import uuid

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.conftest import csrf_of, sign_in
from tests.kit.stack import Stack

PASSWORD = "correct horse battery staple"
#: in every generated project name: a refused page must not echo the file's content
MARKER = "MARKER-" + uuid.uuid4().hex[:12]
HTML = {"Accept": "text/html"}  # as a browser sends it
PROBLEM = re.compile(r'<p class="problem" role="alert" id="problem">([^<]+)</p>')

HOSTILE_CHARACTERS = st.sampled_from(["\x00", "\ud800", "\udfff", "\ufeff", "\u2028", "\x7f", "é",
                                      "\U0001f680"])
STRINGS = st.text(st.characters(exclude_categories=()) | HOSTILE_CHARACTERS, max_size=12)
NUMBERS = (st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([10**400, -(10**400), 2**63, 2**31, 1e308, 5e-324]))
VALUES = st.recursive(st.none() | st.booleans() | NUMBERS | STRINGS,
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=4),
                      max_leaves=12)


def encoded(document: object, ascii_only: bool) -> bytes:
    """JSON text as a file holds it; lone surrogates become the bytes of invalid UTF-8."""
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# An import-shaped document: the kind's own shape, with hostile names and extra fields.
PROJECTS = st.builds(
    lambda names, extra, ascii_only: encoded(
        {"projects": [{"name": MARKER + name, **extra} for name in names]}, ascii_only),
    st.lists(STRINGS, min_size=1, max_size=3), st.dictionaries(STRINGS, VALUES, max_size=2), st.booleans())
ANY_DOCUMENT = st.builds(encoded, VALUES, st.booleans())
DEEP = st.builds(lambda opening, depth: (opening * depth).encode(),
                 st.sampled_from(["[", '{"a":', '{"projects":[']),
                 st.sampled_from([900, 1_000, 5_000, 100_000]))
HUGE_NUMBERS = st.builds(lambda text: b'{"projects":[{"name":"x","n":' + text.encode() + b"}]}",
                         st.sampled_from(["1e999", "-1e400", "NaN", "Infinity", "-Infinity", "1" + "0" * 5000,
                                          "0." + "0" * 5000 + "1", "1e-99999"]))
REPEATED_KEYS = st.sampled_from([b'{"projects":[{"name":"a","name":"b"}]}',
                                 b'{"projects":[],"projects":[{"name":"a"}]}',
                                 b'{"projects":[{"name":"a","name":"a"}]}'])


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """A valid import, cut short or with bytes put in at random."""
    valid = encoded({"projects": [{"name": MARKER + draw(STRINGS)}]}, draw(st.booleans()))
    at = draw(st.integers(0, len(valid)))
    if draw(st.booleans()):
        return valid[:at]
    return valid[:at] + draw(st.binary(min_size=1, max_size=4)) + valid[at:]


ODD_ENCODINGS = st.sampled_from([
    b"\xef\xbb\xbf" + b'{"projects":[{"name":"x"}]}',  # a UTF-8 byte order mark
    '{"projects":[{"name":"x"}]}'.encode("utf-16"),
    b'{"projects":[{"name":"\xed\xa0\x80"}]}',  # a surrogate, encoded
    b'{"projects":[{"name":"\xc0\xaf"}]}',  # an overlong encoding
    b"", b"null", b"[]", b'"projects"',
])
FILES = (PROJECTS | ANY_DOCUMENT | DEEP | HUGE_NUMBERS | REPEATED_KEYS | ODD_ENCODINGS | mangled()
         | st.binary(max_size=64))


@pytest.fixture(scope="module")
def importer(bare_stack: Stack):
    """An admin of an organization, signed in on the Jobs page (imports need the admin role);
    no workers, so an accepted import stays a queued row."""
    org = bare_stack.org()
    admin = bare_stack.user(org, role="admin", password=PASSWORD)
    browser = bare_stack.make_app().test_client()
    sign_in(browser, admin)
    return bare_stack, org, browser, csrf_of(browser.get(f"/orgs/{org}/jobs"))


def jobs_in(stack: Stack, org: uuid.UUID) -> int:
    return sum(stack.job_counts(org).values())


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(b'{"projects":[{"name":"a\\u0000b"}]}')  # the finding: a NUL answered 500
@given(content=FILES)
def test_a_hostile_import_file_is_refused_on_the_page_and_writes_nothing(importer, content: bytes):
    stack, org, browser, csrf = importer
    before = jobs_in(stack, org)
    answer = browser.post(f"/orgs/{org}/jobs", content_type="multipart/form-data", headers=HTML, data={
        "kind": "projects_import", "csrf": csrf, "file": (io.BytesIO(content), "projects.json")})
    page = answer.get_data(as_text=True)
    event(f"answered {answer.status_code}")  # pytest --hypothesis-show-statistics
    assert answer.status_code < 500, (answer.status_code, content[:200], page[:500])
    if answer.status_code == 302:  # a valid import: its job, and nothing else
        assert "/jobs/" in answer.headers["Location"]
        assert jobs_in(stack, org) == before + 1
        return
    assert 400 <= answer.status_code < 500, (answer.status_code, content[:200])
    if answer.status_code == 413:  # past MAX_CONTENT_LENGTH: the error page says the limit
        assert "Files and forms may be at most 1 MiB." in page
    else:  # the Jobs page again, saying what is wrong with the file
        problem = PROBLEM.search(page)
        assert problem and problem.group(1).strip(), (answer.status_code, content[:200], page[:500])
        event(problem.group(1).split(" (")[0].split(":")[0])
    assert MARKER not in page
    assert jobs_in(stack, org) == before
