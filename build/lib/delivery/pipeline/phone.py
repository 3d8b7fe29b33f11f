"""An SMS recipient already in E.164 form, checked from ``phonenumbers``' own metadata.

``check_recipient`` accepts an SMS recipient when ``phonenumbers.parse(to)`` succeeds, the
number is valid (``is_valid_number``) and its E.164 form is ``to`` itself. Parsing is general
(punctuation, national forms, extensions, RFC 3966) and costs most of ``enqueue``'s own time;
for a string that already is ``+``, a country calling code and ASCII digits, the answer can be
read straight from the same metadata, which is what ``accepts`` does:

1. the country calling code is the one prefix of 1 to 3 digits that is a known code (codes
   are prefix-free: the library's ``_extract_country_code``); the rest is the national number;
2. parsing keeps that national number unchanged unless the region's
   ``national_prefix_for_parsing`` matches its start, so any such match is left to the library;
3. validity is ``is_valid_number``'s: the region is the code's only region, or the first of
   its regions whose ``leading_digits`` match (or, without them, for which the number is
   valid); the number is valid for a region when it matches the general description and one
   of the types ``_number_type_helper`` tries (each: possible lengths, then a full match of the
   national number pattern).

``accepts`` answers True only when the library would accept ``to``; False means "not sure",
and the caller runs the library, which also words the error (so errors are unchanged).
``tests/test_phone.py`` holds it to the library over every region's example numbers and
their mutations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import phonenumbers
from phonenumbers.phonemetadata import PhoneMetadata, PhoneNumberDesc

__all__ = ["accepts"]

#: "+", then 3 to 18 ASCII digits, the first not 0 (what parse needs for a country code and a
#: national number of 2 to 17 digits; validity bounds the length further).
_E164 = re.compile(r"\+([1-9][0-9]{2,19})")
_MIN_NSN, _MAX_NSN = 2, 17
#: Every desc ``_number_type_helper`` tries after the general one (any match: valid).
_TYPES = (
    "premium_rate",
    "toll_free",
    "shared_cost",
    "voip",
    "personal_number",
    "pager",
    "uan",
    "voicemail",
    "fixed_line",
    "mobile",
)


@dataclass(frozen=True, slots=True)
class _Desc:
    """One ``NumberDesc``: possible lengths (None: any) and its national number pattern."""

    lengths: frozenset[int] | None
    pattern: re.Pattern[str]

    def matches(self, national: str) -> bool:
        if self.lengths is not None and len(national) not in self.lengths:
            return False
        return self.pattern.fullmatch(national) is not None


@dataclass(frozen=True, slots=True)
class _Region:
    """One region of a country calling code: how it claims a number, and its validity."""

    leading_digits: re.Pattern[str] | None
    general: _Desc | None  # None: the library finds no number valid here
    types: tuple[_Desc, ...]
    #: Per length the general description allows: the patterns of the types that allow it as
    #: one alternation (a full match of it is a full match of one of them), None if none do.
    by_length: dict[int, re.Pattern[str] | None]

    def valid(self, national: str) -> bool:
        if self.general is None or not self.general.matches(national):
            return False
        size = len(national)
        if size in self.by_length:
            pattern = self.by_length[size]
            return pattern is not None and pattern.fullmatch(national) is not None
        return any(desc.matches(national) for desc in self.types)


@dataclass(frozen=True, slots=True)
class _Code:
    """A country calling code: the national prefix that parsing would strip, its regions."""

    national_prefix: re.Pattern[str] | None
    regions: tuple[_Region, ...]

    def valid(self, national: str) -> bool:
        if len(self.regions) == 1:
            return self.regions[0].valid(national)
        for region in self.regions:  # the library's _region_code_for_number_from_list
            if region.leading_digits is not None:
                if region.leading_digits.match(national):
                    return region.valid(national)
            elif region.valid(national):
                return True
        return False


_codes: dict[int, _Code | None] = {}


def accepts(to: str) -> bool:
    """True when ``to`` is an E.164 number that ``check_recipient``'s library check accepts
    as it is; False when that is not certain (the library decides)."""
    match = _E164.fullmatch(to)
    if match is None:
        return False
    digits = match[1]
    for size in (1, 2, 3):
        code = int(digits[:size])
        if code in phonenumbers.COUNTRY_CODE_TO_REGION_CODE:
            break
    else:
        return False
    national = digits[size:]
    if not _MIN_NSN <= len(national) <= _MAX_NSN:
        return False
    plan = _codes.get(code) if code in _codes else _codes.setdefault(code, _build(code))
    if plan is None:
        return False
    if plan.national_prefix is not None and plan.national_prefix.match(national):
        return False
    return plan.valid(national)


def _build(code: int) -> _Code | None:
    regions = phonenumbers.COUNTRY_CODE_TO_REGION_CODE[code]
    main = PhoneMetadata.metadata_for_region_or_calling_code(code, regions[0])
    if main is None:  # parse would fail (or assert): the library decides
        return None
    prefix = main.national_prefix_for_parsing
    built = []
    for region in regions:
        metadata = PhoneMetadata.metadata_for_region_or_calling_code(code, region)
        if metadata is None:
            if len(regions) == 1:
                return None
            continue  # the library skips it
        if region != phonenumbers.REGION_CODE_FOR_NON_GEO_ENTITY and (
            phonenumbers.country_code_for_valid_region(region) != code
        ):
            return None  # not a case the metadata has: leave it to the library
        leading = metadata.leading_digits
        general = _desc(metadata.general_desc)
        types = tuple(
            d for d in (_desc(getattr(metadata, name)) for name in _TYPES) if d is not None
        )
        built.append(
            _Region(
                leading_digits=re.compile(leading) if leading is not None else None,
                general=general,
                types=types,
                by_length={
                    size: _either(d for d in types if d.lengths is None or size in d.lengths)
                    for size in (general.lengths or () if general is not None else ())
                },
            )
        )
    return _Code(re.compile(prefix) if prefix else None, tuple(built))


def _either(descs: Iterable[_Desc]) -> re.Pattern[str] | None:
    patterns = [f"(?:{desc.pattern.pattern})" for desc in descs]
    return re.compile("|".join(patterns)) if patterns else None


def _desc(desc: PhoneNumberDesc | None) -> _Desc | None:
    if desc is None or not desc.national_number_pattern:
        return None  # the library's _match_national_number: never a match
    lengths = frozenset(desc.possible_length)
    return _Desc(lengths or None, re.compile(desc.national_number_pattern))
