"""A public model declared from its row or domain type: the source's fields in their order,
the model's own declarations in their place, nothing lost silently."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import pytest
from pydantic import BaseModel, Field

from service.api.schemas.derive import mirror


@dataclass(frozen=True)
class Source:
    a: int
    b: str | None
    c: float = 1.5
    d: list[int] = field(default_factory=list)


class Row(TypedDict):
    x: int
    secret: str
    y: str


def test_fields_keep_the_sources_order_and_defaults_with_own_fields_in_place() -> None:
    @mirror(Source)
    class Public(BaseModel):
        """The public form."""

        b: str | None = Field(description="b, described")
        extra: bool = False

    assert list(Public.model_fields) == ["a", "b", "c", "d", "extra"]
    assert Public.model_fields["b"].description == "b, described"
    assert Public.model_validate({"a": 1, "b": None}).model_dump() == {
        "a": 1, "b": None, "c": 1.5, "d": [], "extra": False
    }  # fmt: skip
    assert Public.__name__ == "Public" and Public.__doc__ == "The public form."


def test_a_typed_dict_row_less_its_excluded_fields() -> None:
    @mirror(Row, exclude=("secret",))
    class RowPublic(BaseModel):
        """A row."""

    row = Row(x=1, secret="s", y="why")
    assert RowPublic.model_validate(row).model_dump_json() == '{"x":1,"y":"why"}'


def test_fields_named_first_lead_in_that_order() -> None:
    @mirror(Source, first=("c", "a"))
    class Led(BaseModel):
        """Led by c, then a."""

    assert list(Led.model_fields) == ["c", "a", "b", "d"]


def test_an_unknown_exclusion_and_a_method_that_would_be_lost_are_errors() -> None:
    with pytest.raises(TypeError, match="no field nope"):
        mirror(Row, exclude=("nope",))
    with pytest.raises(TypeError, match="no field first"):
        mirror(Row, first=("first",))
    with pytest.raises(TypeError, match="would lose shown"):

        @mirror(Row)
        class WithMethod(BaseModel):
            def shown(self) -> str:
                return "x"
