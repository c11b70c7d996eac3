"""durq's page in Django's admin, through Django's test client: in the index and sidebar,
permissions per action, CSRF, the old hand-mounted URL, and durq's migration."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.tasks import task_backends
from django.test import Client, override_settings
from django.utils import timezone

from django_backend.notes import tasks
from durq.errors import TaskNotFoundError
from durq.states import TaskState

PAGE = "/admin/durq/task/"


def staff(name: str, *perms: str) -> Client:
    """A logged-in client of a staff user holding ``perms`` (``view_task``...)."""
    User.objects.filter(username=name).delete()
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="durq", codename__in=perms)
    )
    client = Client()
    client.login(username=name, password="pw")
    return client


def state_of(task_id: str) -> TaskState | None:
    backend = task_backends["default"]
    try:
        info = backend.call(lambda: backend.app.inspector.get_task_info("default", task_id))
    except TaskNotFoundError:
        return None
    return info.state


def test_the_index_and_sidebar_list_durq_for_staff_allowed_to_see_it() -> None:
    viewer = staff("viewer", "view_task")
    index = viewer.get("/admin/").content.decode()
    assert "durq tasks" in index and f'href="{PAGE}"' in index
    # The admin's sidebar lists it too, marked as the current page on its own page.
    sidebar = viewer.get(PAGE).content.decode().split('id="nav-sidebar"', 1)[1]
    assert f'href="{PAGE}" aria-current="page"' in sidebar.split("</nav>", 1)[0]

    nobody = staff("nobody")
    assert "durq tasks" not in nobody.get("/admin/").content.decode()
    assert nobody.get(PAGE).status_code == 403
    assert Client().get(PAGE).status_code == 302  # to the login page


def test_the_page_shows_queues_and_tasks_without_buttons_for_viewers() -> None:
    result = tasks.fail.enqueue("shown on the page")
    viewer = staff("viewer", "view_task")
    page = viewer.get(f"{PAGE}?queue=default&state=pending")
    assert page.status_code == 200
    body = page.content.decode()
    assert result.id in body and "django_backend.notes.tasks.fail" in body
    assert 'name="action"' not in body
    assert viewer.get(f"{PAGE}?state=nonsense").status_code == 400
    assert viewer.get(f"{PAGE}?backend=nosuchbackend").status_code == 404
    assert (
        viewer.post(
            PAGE, {"action": "delete", "queue": "default", "task_id": result.id}
        ).status_code
        == 403
    )
    assert state_of(result.id) is TaskState.PENDING


def test_run_cancel_and_delete_with_their_permissions() -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    assert state_of(later.id) is TaskState.SCHEDULED
    operator = staff("operator", "view_task", "change_task")
    body = operator.get(f"{PAGE}?queue=default&state=scheduled").content.decode()
    assert 'value="run"' in body and 'value="cancel"' in body and 'value="delete"' not in body

    back = f"{PAGE}?queue=default&state=scheduled"
    answer = operator.post(
        PAGE, {"action": "run", "queue": "default", "task_id": later.id, "next": back}
    )
    assert answer.status_code == 302 and answer["Location"] == back
    assert state_of(later.id) is TaskState.PENDING
    assert f"Task {later.id} will run now" in operator.get(back).content.decode()

    operator.post(PAGE, {"action": "cancel", "queue": "default", "task_id": later.id})
    assert state_of(later.id) is TaskState.ARCHIVED
    # A refused move is a message on the page, not an error page.
    answer = operator.post(
        PAGE, {"action": "run", "queue": "default", "task_id": "nosuchtask"}, follow=True
    )
    assert answer.status_code == 200 and "nosuchtask" in answer.content.decode()

    assert (
        operator.post(
            PAGE, {"action": "delete", "queue": "default", "task_id": later.id}
        ).status_code
        == 403
    )
    admin_ = staff("remover", "view_task", "delete_task")
    assert (
        admin_.post(PAGE, {"action": "delete", "queue": "default", "task_id": later.id}).status_code
        == 302
    )
    assert state_of(later.id) is None
    assert admin_.post(PAGE, {"action": "explode"}).status_code == 400
    # Elsewhere than this page, "next" is ignored: no open redirect.
    answer = admin_.post(
        PAGE,
        {"action": "delete", "queue": "default", "task_id": "x", "next": "https://evil.example/"},
    )
    assert answer["Location"] == PAGE


def test_actions_need_the_csrf_token() -> None:
    pending = tasks.add.enqueue(2, 3)
    client = Client(enforce_csrf_checks=True)
    User.objects.filter(username="boss").delete()
    User.objects.create_superuser("boss", password="pw")
    client.login(username="boss", password="pw")
    post = {"action": "cancel", "queue": "default", "task_id": pending.id}
    assert client.post(PAGE, post).status_code == 403
    assert state_of(pending.id) is TaskState.PENDING
    page = client.get(f"{PAGE}?queue=default&state=pending")
    token = page.cookies["csrftoken"].value
    assert client.post(PAGE, {**post, "csrfmiddlewaretoken": token}).status_code == 302
    assert state_of(pending.id) is TaskState.ARCHIVED


@override_settings(ROOT_URLCONF="django_backend.legacy_urls")
def test_the_old_hand_mounted_url_still_leads_to_the_page() -> None:
    viewer = staff("viewer", "view_task")
    answer = viewer.get("/admin/durq/?queue=default&state=pending")
    assert answer.status_code == 302 and answer["Location"] == f"{PAGE}?queue=default&state=pending"
    answer = viewer.get("/admin/durq/redis/")
    assert answer.status_code == 302 and answer["Location"] == f"{PAGE}?backend=redis"
    assert viewer.get(PAGE).status_code == 200  # not taken for a backend named "task"


@pytest.mark.parametrize("database", ["default"])
def test_showmigrations_lists_durq_and_the_model_needs_no_new_migration(database: str) -> None:
    out = io.StringIO()
    call_command("showmigrations", "durq", database=database, stdout=out)
    assert "[X] 0001_initial" in out.getvalue()
    call_command("makemigrations", "durq", check=True, dry_run=True, stdout=io.StringIO())
