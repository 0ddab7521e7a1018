"""One error model: every exception subs defines is a `SubsError`, and the turn's
ErrorInfo, the API's JSON and the CLI's line are all read off it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import bot
import engine
from engine.errors import ERROR_CODES, ProtocolError, SubsError
from engine.protocol import ErrorInfo

ROOT = Path(__file__).resolve().parents[1]


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for package in (engine, bot):
        for mod in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(mod.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    found.append(cls)
    assert len(found) > 10, "found too few exception classes to be checking anything"
    return found


def test_every_exception_subs_defines_is_a_subs_error() -> None:
    """Private control-flow exceptions (jsonedge's `_Wide`, `_Refused`) never leave their
    module; every public one is a SubsError, so the API, the CLI and ErrorInfo read it."""
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _exception_classes()
        if not issubclass(cls, SubsError) and not cls.__name__.startswith("_")
    ]
    assert outside == []


def positional_beyond_the_message(cls: type[BaseException]) -> list[str]:
    """The parameters of `cls(...)` that may be given by position, other than `message`."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # past `self`
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional[1:] if positional[:1] == ["message"] else positional


def test_every_error_takes_its_message_first_and_all_else_by_name() -> None:
    """One constructor order (there were four: `(code, message, status)`, `(status, code,
    message)`, `(file, key, message)`, `(message, code)`): a call names what each value is."""
    loose = {
        cls.__qualname__: extra
        for cls in _exception_classes()
        if issubclass(cls, SubsError) and (extra := positional_beyond_the_message(cls))
    }
    assert loose == {}


def test_the_constructor_rule_sees_a_positional_parameter() -> None:
    class Old(SubsError):
        def __init__(self, status: int, code: str, message: str) -> None:
            super().__init__(message, code=code, status=status)

    class Built(SubsError):
        def __init__(self, key: str) -> None:
            super().__init__(f"lost {key}")

    assert positional_beyond_the_message(Old) == ["status", "code", "message"]
    assert positional_beyond_the_message(Built) == ["key"]
    assert positional_beyond_the_message(SubsError) == []


def test_private_exceptions_are_raised_and_caught_in_their_own_module() -> None:
    for cls in _exception_classes():
        if issubclass(cls, SubsError):
            continue
        users = [
            p.relative_to(ROOT).as_posix()
            for folder in ("engine", "bot")
            for p in (ROOT / folder).rglob("*.py")
            if cls.__name__ in p.read_text()
        ]
        home = cls.__module__.replace(".", "/") + ".py"
        assert users == [home], f"{cls.__name__} is used outside {home}: {users}"


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (SubsError("x", code="worker_unreachable"), "worker_unreachable"),
        (ProtocolError("x", param="a.b"), "invalid_response"),
        (SubsError("x", code="turn_running", status=409), "internal"),  # not an ErrorCode
        (SubsError("x"), "internal"),
    ],
)
def test_info_is_a_valid_error_info_whatever_the_code(err: SubsError, code: str) -> None:
    info = err.info()
    assert info["code"] == code and code in ERROR_CODES
    ErrorInfo.model_validate(info)


def test_body_is_the_apis_error_shape() -> None:
    err = SubsError("bad", code="invalid_input", status=422, param="input.x", detail={"limit": 3})
    assert err.body() == {"error": "bad", "code": "invalid_input", "param": "input.x", "limit": 3}
