"""`app.decimal_text.decimal`: whole numbers in text someone else wrote."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.decimal_text import decimal


@given(st.one_of(st.text(max_size=30), st.binary(max_size=30), st.none()))
def test_any_text_is_a_number_or_none_never_an_error(text: str | bytes | None) -> None:
    n = decimal(text)
    if n is not None:
        assert isinstance(n, int) and n >= 0 and str(n) == str(int(text.strip())).lstrip("+")  # type: ignore[union-attr]


@given(st.integers(min_value=0, max_value=10**18 - 1))
def test_every_number_of_up_to_18_digits_reads_back(n: int) -> None:
    assert decimal(str(n)) == n == decimal(f" {n}\n".encode())


def test_what_isdigit_took_and_int_refused_is_none() -> None:
    for text in ("²", "①", "١", "１２", "9" * 19, "", " ", "-1", "+1", "1.0", "1_000"):
        assert decimal(text) is None, text
    assert decimal("9" * 19, most_digits=19) == int("9" * 19)
