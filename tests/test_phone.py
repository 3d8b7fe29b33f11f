"""The E.164 fast path (``delivery.pipeline.phone``) against ``phonenumbers`` itself (pure, no
services): ``check_recipient`` accepts and rejects every SMS recipient exactly as the library
check does, with the same error, over every region's example numbers and their mutations."""

from __future__ import annotations

import random
from collections.abc import Iterator

import phonenumbers
import pytest
from phonenumbers import PhoneNumberFormat, PhoneNumberType
from phonenumbers.phonemetadata import PhoneMetadata

from delivery import InvalidMessage
from delivery.pipeline import phone
from delivery.pipeline.validation import check_recipient


def library(to: str) -> str | tuple[str, str]:
    """What ``check_recipient("sms", to)`` answered before the fast path: the number, or the
    error's (field, problem)."""
    try:
        number = phonenumbers.parse(to, None)
    except phonenumbers.NumberParseException as exc:
        return ("to", f"is not an E.164 phone number: {exc}")
    if not phonenumbers.is_valid_number(number):
        return ("to", "is not a valid phone number")
    e164 = phonenumbers.format_number(number, PhoneNumberFormat.E164)
    if e164 != to:
        return ("to", "is not in E.164 form (+, country code, digits only)")
    return str(e164)


def ours(to: str) -> str | tuple[str, str]:
    try:
        return check_recipient("sms", to)
    except InvalidMessage as exc:
        return (exc.field, exc.problem)


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
    return list(seen)


@pytest.fixture(scope="module")
def answers() -> list[tuple[str, str | tuple[str, str], str | tuple[str, str]]]:
    """Every input with check_recipient's answer and the library's."""
    return [(to, ours(to), library(to)) for to in inputs()]


def test_check_recipient_answers_every_input_exactly_as_the_library(
    answers: list[tuple[str, str | tuple[str, str], str | tuple[str, str]]],
) -> None:
    """Over every region's example numbers (each type, invalid ones, non-geographic), each digit
    changed, wrong lengths, national prefixes, other codes, non-E.164 spellings and random
    E.164-shaped strings (about 78,000 inputs, 17,800 of them valid), check_recipient returns
    the same number or raises the same error as phonenumbers' parse + is_valid_number +
    format_number."""
    differ = [answer for answer in answers if answer[1] != answer[2]]
    assert not differ[:10], f"{len(differ)} of {len(answers)} differ"


def test_the_fast_path_accepts_only_what_the_library_accepts_and_most_of_it(
    answers: list[tuple[str, str | tuple[str, str], str | tuple[str, str]]],
) -> None:
    """accepts() is True only for input the library accepts as it is, and it decides nearly
    all of the valid numbers (the rest, e.g. a national prefix that parsing might strip, go to
    the library)."""
    accepted = [(to, expected) for to, _, expected in answers if phone.accepts(to)]
    assert all(expected == to for to, expected in accepted)
    valid = [to for to, _, expected in answers if expected == to]
    assert len(accepted) >= 0.95 * len(valid), (len(accepted), len(valid))


@pytest.mark.parametrize(
    "to", ["+12015550123", "+447400123456", "+390612345678", "+8613800138000", "+80012345678"]
)
def test_a_valid_e164_number_is_returned_as_it_is(to: str) -> None:
    """US, UK mobile, an Italian fixed line (leading zero), China, a non-geographic number."""
    assert phone.accepts(to)
    assert check_recipient("sms", to) == to == library(to)


def test_errors_never_echo_the_recipient(
    answers: list[tuple[str, str | tuple[str, str], str | tuple[str, str]]],
) -> None:
    """Whatever is wrong with an SMS recipient, the error names the field and not the number."""
    for to, answer, _ in answers:
        if isinstance(answer, tuple) and len(to.strip()) > 3:
            assert answer[0] == "to"
            assert to.strip() not in answer[1]
