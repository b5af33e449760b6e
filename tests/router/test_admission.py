"""Admission policies are made by name, in one place, like balancing policies."""

import pytest

from dataplane.router.admission import ADMISSION_NAMES, DEFAULT_ADMISSION, ReservationFirst, make_admission
from dataplane.router.config import RouterConfig
from dataplane.router.ratelimit import InProcessLimiter


def test_the_default_admission_policy_is_reservation_first():
    assert DEFAULT_ADMISSION in ADMISSION_NAMES
    policy = make_admission(DEFAULT_ADMISSION, InProcessLimiter(lambda: 0.0), RouterConfig())
    assert isinstance(policy, ReservationFirst)


def test_unknown_admission_policy_names_the_bad_value():
    with pytest.raises(ValueError, match="'fifo'"):
        make_admission("fifo", InProcessLimiter(lambda: 0.0), RouterConfig())
