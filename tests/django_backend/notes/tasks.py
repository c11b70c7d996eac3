"""Django tasks the integration tests enqueue (found by the worker's discovery)."""

from django.db import connection
from django.tasks import TaskContext, task

from django_backend.notes.models import Note


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
async def shout(text: str) -> str:
    return text.upper()


@task(takes_context=True)
def whoami(context: TaskContext, tag: str) -> dict:
    return {"id": context.task_result.id, "attempt": context.attempt, "tag": tag}


@task
def fail(message: str) -> None:
    raise LookupError(message)


@task
def write_note(text: str, using: str = "default") -> dict:
    """Uses the ORM from a worker thread: that thread's own connection."""
    note = Note.objects.using(using).create(text=text)
    return {"id": note.pk, "vendor": connection.vendor}


@task
async def write_note_async(text: str, using: str = "default") -> int:
    note = await Note.objects.using(using).acreate(text=text)
    return note.pk
