"""Every settings class declares what each field allows (``_parameter_constraints``, as
scikit-learn's) and one validator walks the table: a bad value of any field is one line naming
the field, the value and what is allowed (issue 41, item 2)."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest

from mhainterp.ablation import METHODS
from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.specialization.settings import DivisionSettings, SpecializationSettings
from mhainterp.validation import (
    DistinctList,
    Interval,
    Options,
    ParameterError,
    SomeOf,
    allowed_text,
    validate,
)

CLASSES = [ModelConfig, TrainConfig, SweepConfig, SpecializationSettings, DivisionSettings]
FROZEN = [TrainConfig, SweepConfig, SpecializationSettings, DivisionSettings]
# ModelConfig subclasses TransformerLens's mutable config, and model.to() moves its device.

NOT_AN_OPTION = "not-an-option"


def _candidates(constraint) -> list:
    """Values just outside what ``constraint`` allows (and one of the wrong kind)."""
    values = [NOT_AN_OPTION]
    if isinstance(constraint, Interval):
        step = 1 if constraint.kind is int else 0.5
        if constraint.low is not None:
            values += [constraint.low - step, constraint.low]
        if constraint.high is not None:
            values += [constraint.high + step, constraint.high]
        values += [1.5] if constraint.kind is int else [float("nan")]
    if isinstance(constraint, SomeOf):
        values += [()]
    if isinstance(constraint, DistinctList):
        low = constraint.each.low
        values += [[], [low, low], [np.int64(low)]]  # a NumPy int would not reach JSON
    return values


def _invalid_values(constraints) -> list:
    found = []
    for constraint in constraints:
        for value in _candidates(constraint):
            allowed = any(value is None if c is None else c.allows(value) for c in constraints)
            if not allowed and all(value is not v for v in found) and value not in found:
                found.append(value)
    return found


CASES = [
    (cls, name, value)
    for cls in CLASSES
    for name, constraints in cls._parameter_constraints.items()
    for value in _invalid_values(constraints)
]


def test_every_table_names_real_fields_and_has_a_bad_value_for_each():
    for cls in CLASSES:
        fields = {f.name for f in dataclasses.fields(cls)}
        table = cls._parameter_constraints
        assert set(table) <= fields, (cls.__name__, set(table) - fields)
        for name in table:
            assert any(c is cls and n == name for c, n, _ in CASES), (cls.__name__, name)


@pytest.mark.parametrize(("cls", "name", "value"), CASES, ids=lambda x: repr(x)[:40])
def test_each_bad_value_is_one_line_naming_field_value_and_what_is_allowed(cls, name, value):
    constraints = cls._parameter_constraints[name]
    with pytest.raises(ParameterError) as error:
        cls(**{name: value})
    message = str(error.value)
    assert "\n" not in message
    head = f"{name}={value!r} is invalid: "
    assert message.startswith(head), message
    allowed = message.removeprefix(head)
    assert allowed == allowed_text(constraints, value)
    for constraint in constraints:  # what is allowed names every constraint's values
        if isinstance(constraint, Interval):
            for bound in (constraint.low, constraint.high):
                assert bound is None or str(bound) in allowed, allowed
        if isinstance(constraint, (Options, SomeOf)):
            assert all(repr(option) in allowed for option in constraint.values), allowed
        if constraint is None:
            assert allowed.endswith("None"), allowed


def test_every_default_passes_its_table():
    for cls in CLASSES:
        validate(cls())


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_a_literal_typed_field_allows_exactly_its_literal(cls):
    """Fields are typed with the Literal types; the table's options are those types' values."""
    hints = typing.get_type_hints(cls)
    checked = 0
    for name, constraints in cls._parameter_constraints.items():
        hint = hints[name]
        if typing.get_origin(hint) is tuple:  # tuple[Method, ...]
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is not typing.Literal:
            continue
        (constraint,) = constraints
        assert tuple(constraint.values) == typing.get_args(hint), name
        checked += 1
    # Ablation methods are a registry (``Method`` is ``str``), not a Literal: their fields'
    # options are the live registry, read at each check
    expected = {
        ModelConfig: 1,
        TrainConfig: 1,
        SweepConfig: 0,
        SpecializationSettings: 2,
        DivisionSettings: 1,
    }
    assert checked == expected[cls]
    for name, constraints in cls._parameter_constraints.items():
        if name in ("method", "methods", "ablation_method"):
            assert constraints[0].values is METHODS, name


@pytest.mark.parametrize("cls", FROZEN, ids=lambda cls: cls.__name__)
def test_settings_are_frozen_and_replace_validates(cls):
    settings = cls()
    name = next(iter(cls._parameter_constraints))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, name, getattr(settings, name))
    with pytest.raises(ParameterError, match=f"{name}='not-an-option' is invalid"):
        dataclasses.replace(settings, **{name: NOT_AN_OPTION})
