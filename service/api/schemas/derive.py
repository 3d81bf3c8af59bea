"""Response models declared once: a public model takes its fields from the row or domain type
it shows (a dataclass or a TypedDict), so a field is declared in one place."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Collection, Sequence
from types import FunctionType
from typing import Any, TypeVar

from pydantic import BaseModel, Field, create_model

M = TypeVar("M", bound=BaseModel)
_METHOD = (FunctionType, classmethod, staticmethod, property)


def _defaults(source: type) -> dict[str, object]:
    """The default of each field of dataclass ``source`` that has one (a TypedDict has none)."""
    if not dataclasses.is_dataclass(source):
        return {}
    found: dict[str, object] = {}
    for f in dataclasses.fields(source):
        if f.default is not dataclasses.MISSING:
            found[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            found[f.name] = Field(default_factory=f.default_factory)
    return found


def mirror(
    source: type, *, exclude: Collection[str] = (), first: Sequence[str] = ()
) -> Callable[[type[M]], type[M]]:
    """Give the decorated model ``source``'s fields in their order (those named in ``first``
    lead, in that order), less ``exclude``; a field the model declares itself takes that
    field's place (a description, a public type) and any other field it declares follows. The
    model keeps its name, docstring and config, not its methods (declare none)."""
    found = typing.get_type_hints(source)
    unknown = (set(exclude) | set(first)) - set(found)
    if unknown:
        raise TypeError(f"{source.__name__} has no field {', '.join(sorted(unknown))}")
    hints = {name: found[name] for name in first} | found
    defaults = _defaults(source)

    def build(model: type[M]) -> type[M]:
        methods = [n for n, v in vars(model).items() if isinstance(v, _METHOD)]
        if methods:
            raise TypeError(f"{model.__name__} would lose {', '.join(methods)}")
        own = model.model_fields
        fields: dict[str, Any] = {}
        for name, hint in hints.items():
            if name not in exclude:
                fields[name] = (hint, defaults.get(name, ...))
        fields |= {name: (info.annotation, info) for name, info in own.items()}
        made = create_model(
            model.__name__,
            __config__=model.model_config,
            __doc__=model.__doc__,
            __module__=model.__module__,
            **fields,
        )
        # mypy knows the model as declared; its fields are the source's and its own.
        return typing.cast("type[M]", made)

    return build
