"""The exporters: for each kind of result a command prints (a check's findings, a query's rows,
a replay, ...), the formats it has and the function that renders each. A new format is one
function registered here with `@exporter(kind, name)`; the command line offers it from then on,
since its --format choices are read from `formats(kind)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# kind -> format -> render function; the order of registration is the order --help lists
_EXPORTERS: dict[str, dict[str, Callable[..., "Rendered"]]] = {}


@dataclass
class Rendered:
    """What a command prints, in order: chunks of text each bound for stdout (the data, which
    must parse in a machine format) or stderr (notes and diagnostics), so that on a terminal
    they interleave as they always did."""
    chunks: list[tuple[str, bool]] = field(default_factory=list)  # (text, to stderr)

    def out(self, text: str) -> "Rendered":
        self.chunks.append((text, False))
        return self

    def err(self, text: str) -> "Rendered":
        self.chunks.append((text, True))
        return self

    @property
    def stdout(self) -> str:
        return "".join(t for t, to_err in self.chunks if not to_err)


def exporter(kind: str, name: str):
    """Register the decorated function as the `name` format of `kind`."""
    def register(fn: Callable[..., Rendered]) -> Callable[..., Rendered]:
        _EXPORTERS.setdefault(kind, {})[name] = fn
        return fn
    return register


def formats(kind: str) -> list[str]:
    return list(_EXPORTERS[kind])


def render(kind: str, name: str, *args, **kwargs) -> Rendered:
    try:
        fn = _EXPORTERS[kind][name]
    except KeyError:
        raise ValueError(f"no {name!r} format for {kind}; there are "
                         f"{', '.join(_EXPORTERS.get(kind, ()))}") from None
    return fn(*args, **kwargs)
