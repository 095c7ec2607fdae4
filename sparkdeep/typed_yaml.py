"""What the config (``sparkdeep.config``) and the dataset specs (``sparkdeep.dataset``)
share: the error type, YAML without aliases, and values cut short in messages. Both
modules import it; neither imports the other at load, and the spec module imports
nothing from the config."""
from __future__ import annotations

from typing import Any

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
