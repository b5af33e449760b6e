"""Console users for the three personas: a tenant's engineer, another tenant's, an operator."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from controlplane.tenants.models import Member


def member_client(username, *, tenant=None, operator=False, enforce_csrf=False) -> Client:
    user = User.objects.create_user(username, password="pw-" + username)
    Member.objects.create(user=user, tenant=tenant, is_operator=operator)
    client = Client(enforce_csrf_checks=enforce_csrf)
    client.force_login(user)
    return client


@pytest.fixture
def owner_web(owner):
    return member_client("olivia", tenant=owner)


@pytest.fixture
def other_web(other):
    return member_client("oscar", tenant=other)


@pytest.fixture
def operator_web(db):
    return member_client("opal", operator=True)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Sign-in tests hash a password per attempt: a cheap hasher keeps 30 attempts fast (the
    lock-out logic does not depend on the hasher)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
