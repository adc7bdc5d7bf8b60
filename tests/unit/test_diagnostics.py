"""What an exception leaves for operators (models/diagnostics.py): classes, SQLSTATEs and
frames of the whole chain, never a message, a note or a local."""

from __future__ import annotations

import psycopg.errors

from spacejobs.models.diagnostics import MAX_CHAIN, condition_name, diagnose

SECRET = "tenant-secret-4711"


def raised(make) -> BaseException:
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def database_error_then_a_wrapper() -> None:
    local_value = SECRET  # noqa: F841 - a local the traceback must not show
    try:
        raise psycopg.errors.InvalidTextRepresentation(f'invalid input syntax: "{SECRET}"')
    except psycopg.errors.Error as exc:
        wrapper = RuntimeError(SECRET)
        wrapper.add_note(SECRET)
        raise wrapper from exc


def test_the_chain_keeps_its_classes_sqlstate_and_frames_and_loses_every_message():
    found = diagnose(raised(database_error_then_a_wrapper))
    assert SECRET not in found.traceback + found.summary + found.exception_class
    assert found.exception_class == "builtins.RuntimeError"
    assert found.summary == "builtins.RuntimeError (SQLSTATE 22P02 invalid_text_representation)"
    oldest, newest = found.traceback.split("direct cause of the following exception")
    assert "psycopg.errors.InvalidTextRepresentation [SQLSTATE 22P02 invalid_text_representation]" \
        in oldest
    assert "in database_error_then_a_wrapper" in oldest and "test_diagnostics.py" in oldest
    assert "builtins.RuntimeError (message withheld)" in newest


def test_a_context_is_shown_and_a_suppressed_one_is_not():
    def handled_badly() -> None:
        try:
            raise KeyError(SECRET)
        except KeyError:
            raise ValueError(SECRET)  # noqa: B904 - an implicit context, on purpose

    def suppressed() -> None:
        try:
            raise KeyError(SECRET)
        except KeyError:
            raise ValueError(SECRET) from None

    shown = diagnose(raised(handled_badly)).traceback
    assert "builtins.KeyError" in shown and "During handling of the above exception" in shown
    assert "builtins.KeyError" not in diagnose(raised(suppressed)).traceback
    assert SECRET not in shown


def test_a_cycle_in_the_chain_ends():
    first, second = ValueError(SECRET), TypeError(SECRET)
    first.__cause__, second.__cause__ = second, first
    text = diagnose(first).traceback
    assert text.count("builtins.ValueError") == 1 and text.count("builtins.TypeError") == 1


def test_a_long_chain_is_cut():
    exc: BaseException = ValueError(SECRET)
    for _ in range(3 * MAX_CHAIN):
        outer = ValueError(SECRET)
        outer.__cause__ = exc
        exc = outer
    assert diagnose(exc).traceback.count("builtins.ValueError") == MAX_CHAIN


def test_a_group_names_the_classes_it_holds():
    group = ExceptionGroup(SECRET, [ValueError(SECRET), KeyError(SECRET)])
    text = diagnose(group).traceback
    assert "with builtins.ValueError, builtins.KeyError" in text and SECRET not in text


def test_condition_names_come_from_psycopgs_classes():
    assert condition_name("22P02") == "invalid_text_representation"
    assert condition_name("23505") == "unique_violation"
    assert condition_name("ZZZZZ") is None
