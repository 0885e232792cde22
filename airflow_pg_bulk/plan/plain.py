"""PlainData: a frozen dataclass that round-trips through a dict of JSON types.

Every class of the plan converts to and from a dict of JSON types (``to_dict`` / ``from_dict``),
so the plan can be returned by the prepare task, fed to ``.expand()`` and read back by the copy
and finalize tasks on any worker.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T", bound="PlainData")


class PlainData:
    """Mixin: a frozen dataclass that round-trips through a dict of JSON types."""

    def to_dict(self) -> dict[str, Any]:
        """This object as a dict of JSON types (tuples become lists)."""
        return _to_plain(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        """Rebuild the object from :meth:`to_dict` output.

        :raises ValueError: a key the class does not have, or a field without a default that
            ``data`` lacks: what a plan made by another version of this package looks like
            (prepare ran before an upgrade, copy or finalize after it); the message says so
            and how to plan again."""
        hints = _hints(cls)
        unknown = sorted(set(data) - hints.keys())
        missing = [name for name in _required(cls) if name not in data]
        if unknown or missing:
            found = "; ".join(
                words
                for words in (
                    f"unknown fields {unknown}" if unknown else "",
                    f"missing fields {missing}" if missing else "",
                )
                if words
            )
            raise ValueError(
                f"{cls.__name__}: {found}. Was it made by another version of "
                "airflow-pg-bulk (prepare before an upgrade, this task after it)? Clear the "
                "load's prepare task so that it plans again with this version"
            )
        kwargs = {name: _from_plain(hints[name], value) for name, value in data.items()}
        return cls(**kwargs)


# per class, once: a plan of 100,000 files has 100,000 pieces to convert
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_HINTS: dict[type, dict[str, Any]] = {}
_SCALARS = (str, int, float, bool, type(None))


_REQUIRED: dict[type, tuple[str, ...]] = {}


def _required(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` without a default (``from_dict`` needs them in its data)."""
    names = _REQUIRED.get(cls)
    if names is None:
        names = _REQUIRED[cls] = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
    return names


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        every = typing.get_type_hints(cls)
        hints = _HINTS[cls] = {f.name: every[f.name] for f in dataclasses.fields(cls)}
    return hints


def _to_plain(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        # a StrEnum (a mode, a catalog code) travels as its plain value
        return value.value if isinstance(value, enum.Enum) else value
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    if names is not None:
        return {name: _to_plain(getattr(value, name)) for name in names}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _from_plain(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _from_plain(arg, value)
    if origin is tuple:
        (item,) = typing.get_args(hint)[:1]
        return tuple(_from_plain(item, v) for v in value)
    if origin is dict:
        _key_type, val_t = typing.get_args(hint)
        return {k: _from_plain(val_t, v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, PlainData):
        return hint.from_dict(value)
    return value
