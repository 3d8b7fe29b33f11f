"""SMS recipients (``delivery.outbox.validation.check_recipient``) against ``phonenumbers``
itself (pure, no services): a recipient is accepted exactly when the library's public API finds
it a valid number whose E.164 form is the input, over every region's example numbers of every
type and their mutations; everything else gets one error, which names the field, says what
form is expected and never echoes the number."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any
from unittest import mock

import phonenumbers
import pytest
from hypothesis import given
from hypothesis import strategies as st
from phonenumbers import PhoneNumberFormat, PhoneNumberType
from phonenumbers.phonemetadata import PhoneMetadata

from delivery import InvalidMessage
from delivery.outbox import validation
from delivery.outbox.validation import check_recipient

#: The one error for an SMS recipient, whatever is wrong with it (docs/concepts.md, "Enqueue").
WORDING = (
    "to: is not a valid phone number in international form "
    "(E.164: +, country code and number, digits only, like +14155550123)"
)


def library(to: str) -> bool:
    """Whether ``phonenumbers`` finds ``to`` a valid number written in its E.164 form."""
    try:
        number = phonenumbers.parse(to, None)
    except phonenumbers.NumberParseException:
        return False
    e164 = phonenumbers.format_number(number, PhoneNumberFormat.E164)
    return phonenumbers.is_valid_number(number) and e164 == to


def ours(to: Any) -> str | tuple[str, str]:
    """``check_recipient("sms", to)``: the number, or the error's (field, message)."""
    try:
        return check_recipient("sms", to)
    except InvalidMessage as exc:
        return (exc.field, str(exc))


def expected(to: str) -> str | tuple[str, str]:
    return to if library(to) else ("to", WORDING)


def examples() -> Iterator[phonenumbers.PhoneNumber]:
    """The library's example numbers: every region and type, the invalid ones, non-geographic."""
    types = [t for t in vars(PhoneNumberType).values() if isinstance(t, int)]
    for region in sorted(phonenumbers.SUPPORTED_REGIONS):
        for kind in types:
            number = phonenumbers.example_number_for_type(region, kind)
            if number is not None:
                yield number
        invalid = phonenumbers.invalid_example_number(region)
        if invalid is not None:
            yield invalid
    for code in sorted(phonenumbers.COUNTRY_CODES_FOR_NON_GEO_REGIONS):
        number = phonenumbers.example_number_for_non_geo_entity(code)
        if number is not None:
            yield number


def spellings(number: phonenumbers.PhoneNumber, rng: random.Random) -> Iterator[str]:
    """``number`` in E.164 form, mutated, and spelled the ways an app might get wrong."""
    code = str(number.country_code)
    national = phonenumbers.national_significant_number(number)
    e164 = f"+{code}{national}"
    yield e164
    for i, digit in enumerate(national):  # every digit changed, twice
        for step in (1, rng.randrange(2, 10)):
            yield f"+{code}{national[:i]}{(int(digit) + step) % 10}{national[i + 1 :]}"
    yield f"+{code}{national[:-1]}"  # wrong lengths
    yield f"+{code}{national[1:]}"
    yield f"+{code}{national}{rng.randrange(10)}"
    yield f"+{code}{national}{rng.randrange(100):02d}"
    metadata = PhoneMetadata.metadata_for_region_or_calling_code(
        number.country_code, phonenumbers.region_code_for_country_code(number.country_code)
    )
    prefix = (metadata and metadata.national_prefix) or "0"
    for extra in {prefix, "0", "1", "8", "9", "00"}:  # national prefixes, trunk digits
        yield f"+{code}{extra}{national}"
    yield f"+{code[:-1]}{national}"  # the code cut or grown: another code or none
    yield f"+{code}{code}{national}"
    yield f"+{rng.randrange(1, 1000)}{national}"
    yield f"+0{code}{national}"
    for fmt in (PhoneNumberFormat.INTERNATIONAL, PhoneNumberFormat.NATIONAL):  # not E.164
        yield phonenumbers.format_number(number, fmt)
    yield f"00{code}{national}"
    yield f"{code}{national}"
    yield f"+{code} {national}"
    yield f"+{code}-{national}"
    yield f" {e164}"
    yield f"{e164} "
    yield f"{e164}\n"
    yield f"{e164};ext=12"
    yield f"{e164}x12"
    yield f"tel:{e164}"
    yield f"+({code}){national}"
    yield "\uff0b" + e164[1:]  # fullwidth plus
    yield e164.translate({ord(d): 0xFF10 + int(d) for d in "0123456789"})  # fullwidth digits
    yield e164.translate({ord(d): 0x0660 + int(d) for d in "0123456789"})  # Arabic-Indic


def inputs() -> list[str]:
    rng = random.Random(13)
    seen: dict[str, None] = {}
    for number in examples():
        seen.update(dict.fromkeys(spellings(number, rng)))
    for _ in range(20_000):  # random E.164-shaped strings: unknown codes, any length
        seen[f"+{rng.randrange(10 ** rng.randrange(2, 20)) + 1}"] = None
    seen.update(dict.fromkeys(["+", "+1", "+12", "+123", "+0", "+00", "+" + "9" * 30]))
    seen.update(dict.fromkeys(["+1201555012" + "3" * n for n in (20, 22, 40, 300)]))
    return list(seen)


@pytest.fixture(scope="module")
def answers() -> list[tuple[str, str | tuple[str, str]]]:
    """Every input with check_recipient's answer."""
    return [(to, ours(to)) for to in inputs()]


def test_check_recipient_accepts_exactly_what_the_library_accepts(
    answers: list[tuple[str, str | tuple[str, str]]],
) -> None:
    """Over every region's example numbers (each type, invalid ones, non-geographic), each digit
    changed, wrong lengths, national prefixes, other codes, non-E.164 spellings and random
    E.164-shaped strings (about 78,000 inputs, 17,800 of them valid), check_recipient returns
    the number exactly when phonenumbers' parse + is_valid_number + format_number(E164) give it
    back, and the one error otherwise (SMS has no rule on number types of its own)."""
    differ = [(to, answer, expected(to)) for to, answer in answers if answer != expected(to)]
    assert not differ[:10], f"{len(differ)} of {len(answers)} differ"
    accepted = sum(1 for to, answer in answers if answer == to)
    assert accepted > 15_000, accepted  # the inputs hold valid numbers of every type


@given(
    st.one_of(
        st.from_regex(r"\+[0-9]{1,22}", fullmatch=True),
        st.from_regex(r"\+?[0-9 ()+.-]{0,25}", fullmatch=True),
        st.text(max_size=30),
    )
)
def test_any_string_is_answered_as_the_library_answers(to: str) -> None:
    assert ours(to) == expected(to)


@pytest.mark.parametrize(
    "to", ["+12015550123", "+447400123456", "+390612345678", "+8613800138000", "+80012345678"]
)
def test_a_valid_e164_number_is_returned_as_it_is(to: str) -> None:
    """US, UK mobile, an Italian fixed line (leading zero), China, a non-geographic number."""
    assert check_recipient("sms", to) == to
    assert library(to)


@pytest.mark.parametrize(
    "to",
    [
        pytest.param("2015550123", id="no plus"),
        pytest.param("0044 20 7946 0958", id="international prefix instead of plus"),
        pytest.param("+1 201 555 0123", id="spaces"),
        pytest.param("+1 (201) 555-0123", id="punctuation"),
        pytest.param("+1201555O123", id="a letter"),
        pytest.param("+1-800-FLOWERS", id="letters for digits"),
        pytest.param("+1555", id="too short"),
        pytest.param("+12015550123456789012", id="too long"),
        pytest.param("+1" + "2" * 300, id="far too long"),
        pytest.param("+9995550123", id="unknown country code"),
        pytest.param("+0201555012", id="country code 0"),
        pytest.param("+11235550123", id="not a valid number (no area code 123)"),
        pytest.param("+12015550123;ext=12", id="an extension"),
        pytest.param("tel:+12015550123", id="a tel URI"),
        pytest.param("\uff0b12015550123", id="a fullwidth plus"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param(None, id="None"),
        pytest.param(12015550123, id="an int"),
        pytest.param(["+12015550123"], id="a list"),
    ],
)
def test_every_wrong_sms_recipient_gets_the_one_error(to: Any) -> None:
    """Whatever is wrong with an SMS recipient: one message, naming the field and the
    expected form, with no library text and not the number."""
    with pytest.raises(InvalidMessage) as error:
        check_recipient("sms", to)
    assert (error.value.field, str(error.value)) == ("to", WORDING)


def test_errors_never_echo_the_recipient(
    answers: list[tuple[str, str | tuple[str, str]]],
) -> None:
    """Whatever is wrong with an SMS recipient, the error names the field and not the number."""
    for to, answer in answers:
        if isinstance(answer, tuple) and len(to.strip()) > 3:
            assert answer[0] == "to"
            assert to.strip() not in answer[1]


def test_long_input_is_not_kept() -> None:
    """The cache is bounded, and input longer than any E.164 number is never cached."""
    cache = validation._is_e164_cached
    before = cache.cache_info().currsize
    for size in (40, 1_000, 100_000):
        assert ours("+1" + "2" * size) == ("to", WORDING)
    assert cache.cache_info().currsize == before
    assert cache.cache_info().maxsize is not None


def test_numbers_from_every_region_compile_no_pattern_twice() -> None:
    """The library keeps the patterns it compiled (``phonenumbers.enable_pattern_cache``):
    checking every region's example numbers again asks ``re`` to compile nothing, where ``re``'s
    own cache (512 patterns, shared with the whole process) would be overflowed and every check
    recompile."""
    numbers = [phonenumbers.format_number(n, PhoneNumberFormat.E164) for n in examples()]
    for to in numbers:
        validation._is_e164(to)
    with mock.patch("re.compile", wraps=re.compile) as compile_:
        for to in numbers:
            validation._is_e164(to)
    assert len(numbers) > 1_000
    assert compile_.call_count == 0
