"""Sign-in: lock-out after repeated failures (django-axes, on PostgreSQL), password rules on
`create_user`, and /admin/ served only when ADMIN_ENABLED is on."""

import importlib
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import clear_url_caches

from controlplane.capacity.models import GpuPool, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.selling import sell
from controlplane.tenants.models import Member
from tests.console.conftest import member_client

PASSWORD = "correct horse battery staple"


@pytest.fixture
def alice(owner):
    user = User.objects.create_user("alice", password=PASSWORD)
    Member.objects.create(user=user, tenant=owner)
    return user


@pytest.fixture
def bob(owner):
    user = User.objects.create_user("bob", password=PASSWORD)
    Member.objects.create(user=user, tenant=owner)
    return user


def sign_in(client: Client, username: str, password: str):
    return client.post("/accounts/login/", {"username": username, "password": password})


def signed_in_as(client: Client) -> str | None:
    response = client.get("/console/endpoints/")
    return response.wsgi_request.user.username if response.status_code == 200 else None


def test_thirty_failed_sign_ins_lock_the_user_out_even_with_the_right_password(alice):
    client = Client()
    statuses = [sign_in(client, "alice", f"wrong-{i}").status_code for i in range(30)]
    limit = settings.AXES_FAILURE_LIMIT
    assert statuses[: limit - 1] == [200] * (limit - 1)  # the form again, "wrong password"
    assert set(statuses[limit:]) == {429}
    response = sign_in(Client(), "alice", PASSWORD)  # a fresh client: the lock is not in a cookie
    assert response.status_code == 429
    assert b"Sign-in locked" in response.content and b"alice" in response.content
    assert signed_in_as(client) is None


def test_the_lock_is_per_user_another_user_at_the_same_address_signs_in(alice, bob):
    client = Client()  # every request from 127.0.0.1
    for i in range(settings.AXES_FAILURE_LIMIT + 5):
        sign_in(client, "alice", f"wrong-{i}")
    assert sign_in(client, "alice", PASSWORD).status_code == 429
    response = sign_in(client, "bob", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/console/"
    assert signed_in_as(client) == "bob"


def test_a_username_is_locked_from_every_address_and_operators_see_it_on_call(alice, owner):
    limit = settings.AXES_FAILURE_LIMIT
    for i in range(limit):  # each failure from another address: the count is the username's
        sign_in(Client(REMOTE_ADDR=f"10.0.0.{i % 3 + 1}"), "alice", f"wrong-{i}")
    assert sign_in(Client(REMOTE_ADDR="10.9.9.9"), "alice", PASSWORD).status_code == 429
    page = member_client("opal", operator=True).get("/console/oncall/").content.decode()
    # The refused right password counts too: limit + 1 failures from 4 addresses.
    assert "Sign-ins locked:" in page and f"alice \u00d7{limit + 1} from 4 addresses" in page
    tenant_page = member_client("olivia", tenant=owner).get("/console/oncall/").content.decode()
    assert "Sign-ins locked" not in tenant_page and "alice" not in tenant_page


def test_failures_below_the_limit_do_not_lock_and_a_success_clears_them(alice):
    client = Client()
    for _ in range(2):
        for i in range(settings.AXES_FAILURE_LIMIT - 1):
            assert sign_in(client, "alice", f"wrong-{i}").status_code == 200
        assert sign_in(client, "alice", PASSWORD).status_code == 302
        client.post("/accounts/logout/")
    assert signed_in_as(client) is None


def test_an_operator_unlocks_a_user_with_axes_reset_username(alice):
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in(Client(), "alice", f"wrong-{i}")
    assert sign_in(Client(), "alice", PASSWORD).status_code == 429
    call_command("axes_reset_username", "alice", stdout=StringIO())
    assert sign_in(Client(), "alice", PASSWORD).status_code == 302


@pytest.mark.parametrize(
    ("password", "says"),
    [
        ("a", "too short"),
        ("12345678901", "entirely numeric"),
        ("password123", "too common"),
        ("weakling-user", "too similar to the username"),
    ],
)
def test_create_user_refuses_a_weak_password_saying_why(owner, password, says):
    with pytest.raises(CommandError, match=says):
        call_command("create_user", "weakling-user", "--tenant", owner.name, stdin=StringIO(password + "\n"))
    assert not User.objects.filter(username="weakling-user").exists()


def test_create_user_accepts_a_strong_password(owner):
    call_command(
        "create_user", "strong", "--tenant", owner.name, stdin=StringIO(PASSWORD + "\n"), stdout=StringIO()
    )
    assert User.objects.get(username="strong").check_password(PASSWORD)


def test_create_user_reads_the_password_from_the_environment(owner, monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_USER_PASSWORD", PASSWORD)
    call_command("create_user", "from-env", "--operator", stdin=StringIO(""), stdout=StringIO())
    assert User.objects.get(username="from-env").check_password(PASSWORD)
    # --password-stdin: the pipe, even with the variable set.
    call_command(
        "create_user", "piped", "--operator", "--password-stdin", stdin=StringIO("Other-" + PASSWORD)
    )
    assert User.objects.get(username="piped").check_password("Other-" + PASSWORD)


def test_create_user_refuses_a_password_on_the_command_line(owner):
    with pytest.raises(
        CommandError, match=r"--password puts the password on the command line.*--password-stdin"
    ):
        call_command("create_user", "argv-user", "--password", PASSWORD, "--tenant", owner.name)
    with pytest.raises(CommandError, match="no password"):
        call_command("create_user", "argv-user", "--tenant", owner.name, stdin=StringIO(""))
    assert not User.objects.filter(username="argv-user").exists()


@pytest.mark.stack
def test_create_user_from_a_shell_refuses_argv_in_one_line_without_echoing_it():
    secret = "Visible-in-ps-" + PASSWORD
    done = subprocess.run(
        [sys.executable, "manage.py", "create_user", "bob", "--password", secret, "--operator"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and secret not in done.stderr
    assert lines[-1].startswith("manage.py create_user: error: --password puts the password"), lines


def reload_urls() -> None:
    import controlplane.urls

    importlib.reload(controlplane.urls)
    clear_url_caches()


@pytest.fixture
def admin_urls():
    """Re-reads the URLconf under the settings the test sets, and as it was afterwards."""
    yield reload_urls
    reload_urls()


def test_admin_is_not_served_by_default(db, admin_urls):
    admin_urls()
    assert Client().get("/admin/login/").status_code == 404
    assert Client().post("/admin/login/", {"username": "x", "password": "y"}).status_code == 404


def test_admin_is_served_when_admin_enabled_and_throttled_too(alice, admin_urls):
    with override_settings(ADMIN_ENABLED=True):
        admin_urls()
        client = Client()
        assert client.get("/admin/login/").status_code == 200
        for i in range(settings.AXES_FAILURE_LIMIT):
            client.post("/admin/login/", {"username": "alice", "password": f"wrong-{i}"})
        assert client.post("/admin/login/", {"username": "alice", "password": PASSWORD}).status_code == 429


def test_the_console_password_change_applies_the_validators(alice):
    client = Client()
    client.force_login(alice)
    weak = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": "a", "new_password2": "a"},
    )
    assert weak.status_code == 200 and "too short" in weak.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)
    strong = "another long and unusual passphrase"
    done = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": strong, "new_password2": strong},
    )
    assert done.status_code == 302 and done["Location"] == "/accounts/password_change/done/"
    alice.refresh_from_db()
    assert alice.check_password(strong)
    assert "Password changed" in client.get(done["Location"]).content.decode()


def test_there_is_no_password_reset_by_mail(db):
    assert Client().get("/accounts/password_reset/").status_code == 404


@pytest.mark.parametrize(
    "model", [GpuPool, ModelProfile, Reservation, Endpoint], ids=lambda m: m._meta.model_name
)
def test_the_admin_shows_what_selling_checks_and_writes_none(alice, owner, admin_urls, make_endpoint, model):
    """A pool's shape, a model's price, a sale and an endpoint are checked under the pool's lock
    (controlplane.selling), which an admin form would pass by: the admin lists and shows them and
    adds, changes and deletes none, a POST included. A GPU type, checked by none, is written."""
    endpoint = make_endpoint(owner, "chat")
    sell(endpoint, mu_per_minute=100, best_effort_allowed=False, sold_by="ops")
    row = model.objects.get()
    before = model.objects.values().get()
    alice.is_staff = alice.is_superuser = True
    alice.save()
    with override_settings(ADMIN_ENABLED=True):
        admin_urls()
        client = Client()
        client.force_login(alice)
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}"
        assert client.get(f"{base}/").status_code == 200
        assert client.get(f"{base}/{row.pk}/change/").status_code == 200  # shown, read-only
        assert client.get(f"{base}/add/").status_code == 403
        assert client.post(f"{base}/add/", {"name": "x"}).status_code == 403
        assert client.post(f"{base}/{row.pk}/change/", {"name": "renamed"}).status_code == 403
        assert client.post(f"{base}/{row.pk}/delete/", {"post": "yes"}).status_code == 403
        assert model.objects.values().get() == before
        assert client.get("/admin/capacity/gputype/add/").status_code == 200
