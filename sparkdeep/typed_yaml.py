"""What the config (``sparkdeep.config``) and the dataset specs (``sparkdeep.dataset``)
share: the error type, YAML without aliases, values cut short in messages, and the rules
that turn a YAML tree into their dataclasses (:class:`Fields`). Both
modules import it; neither imports the other at load, and the spec module imports
nothing from the config."""
from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type, or a config file is missing/bad."""


_SHOWN = 200  # characters of a value echoed in an error message


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length: error messages stay one short line."""
    return _cut(repr(value))


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases, so no document expands beyond its own size."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(f"line {mark.line + 1}: YAML aliases (*name) are not allowed in config; "
                              "write the value out")
        return super().compose_node(parent, index)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def read_mapping(path: str | Path, what: str, error: type[Exception]) -> dict:
    """The mapping a YAML file holds, as plain dicts with string keys; an empty file is an
    empty mapping. Errors (``error``) name ``what`` (``"config file"``, ``"dataset spec"``)
    and the file: bad YAML with its line, an alias, anything but a mapping at the top."""
    try:
        data = _yaml(Path(path).read_text()) or {}
    except ConfigError as exc:
        raise error(f"{what} {str(path)!r}, {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise error(f"{what} {str(path)!r} must hold a mapping at the top")
    return plain(data)


def plain(value: Any) -> Any:
    """Mappings as plain dicts with string keys, all the way down."""
    return {str(k): plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def put_dotted(tree: dict, parts: list[str], value: Any) -> None:
    """``tree[parts[0]]...[parts[-1]] = value`` (a ``--set a.b.c=v``), making mappings on the
    way; a ``ValueError`` names the dotted prefix that holds something else."""
    cursor = tree
    for i, part in enumerate(parts[:-1]):
        nxt = cursor.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ValueError(".".join(parts[:i + 1]))
        cursor = nxt
    cursor[parts[-1]] = value


@dataclasses.dataclass(frozen=True)
class Fields:
    """YAML trees to frozen dataclasses, one set of rules and messages for the config and
    the dataset specs: unknown keys, missing keys, and each value checked against its
    field's type (true/false, a whole number, a finite number, a string, a list, a mapping
    of strings, a nested dataclass; ``X | None`` takes null).

    The two differ only in wording and in ``lenient``: a spec may leave a string, list or
    mapping empty (null), give one value where a list is expected, and its list items are
    compared as text (YAML's ``true`` and ``1`` become ``"true"`` and ``"1"``).
    """
    error: type[Exception]
    where: Callable[[str, str], str]                  # (key, source) -> how a message names the key
    unknown: Callable[[str, str, str], str]           # (key, source, known keys) -> message
    missing: Callable[[str, str], str]                # (key, source) -> message
    lenient: bool = False
    skip: tuple[str, ...] = ()                        # fields the tree never sets

    def build(self, cls: type, tree: Mapping, prefix: str, source: Callable[[str], str]) -> Any:
        """``cls(**tree)``, each value coerced; ``source(dotted key)`` names where it came from."""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in self.skip}
        kwargs = {}
        for key, value in tree.items():
            dotted = f"{prefix}{key}"
            if key not in fields:
                raise self.error(self.unknown(dotted, source(dotted), ", ".join(sorted(fields))))
            kwargs[key] = self.coerce(value, hints[key], dotted, source)
        missing = [n for n, f in fields.items() if n not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise self.error(self.missing(prefix + missing[0], source(prefix + missing[0])))
        return cls(**kwargs)

    def coerce(self, value: Any, tp: Any, key: str, source: Callable[[str], str]) -> Any:
        where = self.where(key, source(key))
        args = typing.get_args(tp)
        if type(None) in args:  # X | None
            if value is None:
                return None
            tp = next(a for a in args if a is not type(None))
        origin = typing.get_origin(tp)
        is_tuple = origin is tuple
        is_mapping = origin in (Mapping, dict, collections.abc.Mapping) or tp in (dict, Mapping)
        if value is None:
            if self.lenient and (tp is str or is_tuple or is_mapping):
                return "" if tp is str else () if is_tuple else types.MappingProxyType({})
            raise self.error(f"{where} has no value: it is required")
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise self.error(f"{where}: expected a mapping, got {shown(value)}")
            return self.build(tp, value, key + ".", source)
        if tp is bool:
            if isinstance(value, bool):
                return value
            raise self.error(f"{where}: expected true/false, got {shown(value)}")
        if tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise self.error(f"{where}: expected a whole number, got {shown(value)}")
        if tp is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):  # YAML's .inf / .nan: no setting means "infinite"
                    raise self.error(f"{where}: expected a finite number, got {value!r}")
                return float(value)
            raise self.error(f"{where}: expected a number, got {shown(value)}")
        if tp is str:
            if isinstance(value, str):
                return value
            raise self.error(f"{where}: expected a string, got {shown(value)}")
        if is_tuple:
            if self.lenient and isinstance(value, (str, int, float, bool)):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise self.error(f"{where}: expected a list, got {shown(value)}")
            if self.lenient:
                return tuple(self._text(v, f"{where}[{i}]") for i, v in enumerate(value))
            item = typing.get_args(tp)[0]
            return tuple(self.coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value))
        if is_mapping:
            if not isinstance(value, Mapping):
                raise self.error(f"{where}: expected a mapping, got {shown(value)}")
            # Spark settings and the like are strings whatever YAML made of them.
            return types.MappingProxyType({str(k): self._text(v, f"{where}[{k!r}]") for k, v in value.items()})
        raise self.error(f"{where}: unsupported type {tp!r}")  # pragma: no cover

    def _text(self, value: Any, where: str) -> str:
        if isinstance(value, (Mapping, list, tuple)) or value is None:
            raise self.error(f"{where}: expected a plain value, got {shown(value)}")
        return str(value).lower() if isinstance(value, bool) else str(value)
