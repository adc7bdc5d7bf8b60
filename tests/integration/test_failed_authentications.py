"""Failed authentications are counted against the client address and against everyone, so that
a flood of made-up credentials gets 429 quickly and costs no lookup in PostgreSQL
(webapp/failed_auth.py). Each test is the attack, sent as a stranger would send it."""

from __future__ import annotations

import secrets
import uuid

from spacejobs.models.tenancy import accounts
from tests.conftest import csrf_of, sign_in
from tests.kit.stack import Stack
from tests.netproxy import Partition, postgres_address, through

PASSWORD = "correct horse battery staple"
ATTACKER = {"REMOTE_ADDR": "203.0.113.7"}
ELSEWHERE = {"REMOTE_ADDR": "198.51.100.9"}


def made_up() -> dict[str, str]:
    """A token of the real shape that no one was ever given."""
    return {"Authorization": f"Bearer sj_{secrets.token_urlsafe(32)}"}


def assert_refused(answer) -> None:
    assert answer.status_code == 429, (answer.status_code, answer.get_data(as_text=True)[:300])
    assert answer.get_json()["error"]["code"] == "rate_limited"
    assert int(answer.headers["Retry-After"]) > 0


def seen(answer) -> tuple[int, bytes, list[tuple[str, str]]]:
    return answer.status_code, answer.data, sorted((k, v) for k, v in answer.headers if k != "Date")


def test_a_flood_of_made_up_tokens_is_refused_429_before_it_costs_a_database_lookup(bare_stack: Stack):
    """Attack: 1,500 requests in 7 s, each with a made-up ``Bearer sj_…``: every one answered 401,
    none 429 (the limit was keyed on the token sent, a new one each time), and each one cost a
    token lookup in PostgreSQL."""
    partition = Partition(postgres_address(bare_stack.admin_url))
    app = bare_stack.make_app(DATABASE_URL=through(bare_stack.app_url, partition),
                              FAILED_AUTH_RATE_LIMIT_ADDRESS="5 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="1000 per minute")
    client = app.test_client()
    org = uuid.uuid4()

    def attack(path: str = "/api/v1/me", method: str = "GET"):
        return client.open(path, method=method, headers=made_up(), environ_base=ATTACKER,
                           json={"kind": "bench.noop"} if method == "POST" else None)

    # both ways a token is looked up: on its own, and with the organization of the URL
    answers = [attack() if i % 2 else attack(f"/api/v1/orgs/{org}/jobs", "POST") for i in range(300)]
    assert [a.status_code for a in answers[:5]] == [401] * 5
    assert {a.status_code for a in answers[5:]} == {429}
    assert_refused(answers[-1])

    partition.cut()  # from here on, anything that asks PostgreSQL answers 503
    try:
        for path, method in (("/api/v1/me", "GET"), (f"/api/v1/orgs/{org}/jobs", "POST"),
                             (f"/api/v1/orgs/{org}/jobs/{uuid.uuid4()}", "GET"), ("/ops/api/jobs", "GET"),
                             ("/metrics", "GET")):
            assert_refused(attack(path, method))
        looked_up = client.get("/api/v1/me", headers=made_up(), environ_base=ELSEWHERE)
        assert looked_up.status_code == 503  # the same request from a fresh address needs the database
    finally:
        partition.open_again()


def test_a_stranger_flooding_made_up_tokens_leaves_members_elsewhere_their_whole_budget(bare_stack: Stack):
    """Attack: the same flood while a member works from another address; her token's own
    budget is hers alone, and her good requests, more than the failed-auth budget, never
    count against it."""
    app = bare_stack.make_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="5 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="1000 per minute", API_RATE_LIMIT="8 per minute")
    client = app.test_client()
    anna = bare_stack.user(bare_stack.org())
    flood = [client.get("/api/v1/me", headers=made_up(), environ_base=ATTACKER).status_code
             for _ in range(50)]
    assert flood == [401] * 5 + [429] * 45
    hers = [client.get("/api/v1/me", headers=anna.auth, environ_base=ELSEWHERE) for _ in range(9)]
    assert [a.status_code for a in hers] == [200] * 8 + [429]
    assert hers[-1].get_json()["error"]["message"].startswith("Too many requests")  # her API budget


def test_a_flood_spread_over_many_addresses_meets_the_global_budget(bare_stack: Stack):
    """Attack: made-up tokens from many addresses, each staying under its own budget."""
    app = bare_stack.make_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="3 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="10 per minute")
    client = app.test_client()
    org = bare_stack.org()
    anna, ben = bare_stack.user(org), bare_stack.user(org)
    assert client.get("/api/v1/me", headers=anna.auth, environ_base=ELSEWHERE).status_code == 200
    spread = [client.get("/api/v1/me", headers=made_up(), environ_base={"REMOTE_ADDR": f"203.0.113.{i}"})
              for i in range(1, 6) for _ in range(2)]
    assert [a.status_code for a in spread] == [401] * 10
    assert_refused(client.get("/api/v1/me", headers=made_up(), environ_base={"REMOTE_ADDR": "192.0.2.1"}))
    # The backstop's price while it is spent: a token not seen lately is not looked up either;
    # a member already working goes on, from any address (and is still looked up: revocable).
    assert_refused(client.get("/api/v1/me", headers=ben.auth, environ_base=ELSEWHERE))
    assert client.get("/api/v1/me", headers=anna.auth, environ_base=ELSEWHERE).status_code == 200
    assert client.get(f"/api/v1/orgs/{org}/jobs", headers=anna.auth,
                      environ_base={"REMOTE_ADDR": "192.0.2.2"}).status_code == 200
    with bare_stack.admin() as conn:
        accounts.revoke_token(conn, anna.token)
    assert client.get("/api/v1/me", headers=anna.auth, environ_base=ELSEWHERE).status_code == 401


def test_made_up_tokens_at_operator_urls_are_counted_and_refused_like_anywhere_else(bare_stack: Stack):
    """Attack: /ops and /metrics looked every made-up token up (to answer their hidden 404) and
    no limit ever applied there."""
    app = bare_stack.make_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="5 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="1000 per minute")
    client = app.test_client()
    flood = [client.get(path, headers=made_up(), environ_base=ATTACKER).status_code
             for _ in range(10) for path in ("/metrics", "/ops/api/jobs")]
    assert flood == [404] * 5 + [429] * 15
    # And the refusal tells nothing of what is there: an unknown URL answers it byte for byte.
    same = {"X-Request-ID": "one-id", **made_up()}
    assert seen(client.get("/metrics", headers=same, environ_base=ATTACKER)) == \
        seen(client.get(f"/nope-{uuid.uuid4().hex}", headers=same, environ_base=ATTACKER))


def test_a_session_cookie_replayed_after_sign_out_is_counted_like_a_made_up_token(bare_stack: Stack):
    """Attack: a session cookie kept after its sign-out and sent again and again, each time a
    session lookup in PostgreSQL."""
    app = bare_stack.make_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="5 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="1000 per minute")
    org = bare_stack.org()
    anna = bare_stack.user(org, role="member", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, anna)
    kept = browser.get_cookie("spacejobs_session").value
    browser.post("/logout", data={"csrf": csrf_of(browser.get(f"/orgs/{org}/jobs"))})
    thief = app.test_client()
    answers = []
    for _ in range(10):
        thief.set_cookie("spacejobs_session", kept)  # each answer drops it; the thief sends it again
        answers.append(thief.get(f"/orgs/{org}/jobs", environ_base=ATTACKER))
    assert [a.status_code for a in answers[:5]] == [302] * 5
    assert {a.status_code for a in answers[5:]} == {429}
    assert int(answers[-1].headers["Retry-After"]) > 0


def test_made_up_tokens_from_every_address_of_one_ipv6_block_share_its_budget(bare_stack: Stack):
    """Attack: the same flood from a new IPv6 address each time, all in the one /64 that a single
    subscriber is given whole: each address had a budget of its own, so the flood never ran out."""
    app = bare_stack.make_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="5 per minute",
                              FAILED_AUTH_RATE_LIMIT_GLOBAL="1000 per minute")
    client = app.test_client()
    flood = [client.get("/api/v1/me", headers=made_up(),
                        environ_base={"REMOTE_ADDR": f"2001:db8:1:2::{i:x}"}).status_code
             for i in range(1, 21)]
    assert flood == [401] * 5 + [429] * 15
    neighbour = client.get("/api/v1/me", headers=made_up(), environ_base={"REMOTE_ADDR": "2001:db8:1:3::1"})
    assert neighbour.status_code == 401  # the next /64 is someone else's
