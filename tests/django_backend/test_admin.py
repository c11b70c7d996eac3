"""The read-only admin page: staff only, through Django's test client."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from django_backend.notes import tasks


def test_staff_see_queues_and_tasks_others_are_sent_to_login() -> None:
    result = tasks.fail.enqueue("shown on the page")
    client = Client()
    answer = client.get("/admin/durq/?queue=default&state=pending")
    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]

    User.objects.filter(username="visitor").delete()
    User.objects.create_user("visitor", password="pw", is_staff=False)
    client.login(username="visitor", password="pw")
    assert client.get("/admin/durq/").status_code == 302

    User.objects.filter(username="staff").delete()
    User.objects.create_user("staff", password="pw", is_staff=True)
    client.login(username="staff", password="pw")
    page = client.get("/admin/durq/?queue=default&state=pending")
    assert page.status_code == 200
    body = page.content.decode()
    assert "default" in body and result.id in body
    assert "django_backend.notes.tasks.fail" in body
    assert client.get("/admin/durq/?state=nonsense").status_code == 400
    assert client.get("/admin/durq/nosuchbackend/").status_code == 404
