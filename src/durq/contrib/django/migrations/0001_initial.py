"""durq's tables, through ``manage.py migrate`` (listed by ``showmigrations``).

durq's schema has its own numbered migrations per broker (``durq migrate``), run here for
every ``TASKS`` backend stored in the database being migrated. They are idempotent, so later
durq versions upgrade the schema on the next ``migrate`` (the app's ``post_migrate`` runs
them again) without a Django migration each. The ``Task`` model has no table (the admin's
handle on durq's tasks)."""

from typing import Any

from django.db import migrations, models


def migrate_durq(apps: Any, schema_editor: Any) -> None:
    from durq.contrib.django.apps import migrate_brokers

    migrate_brokers(using=schema_editor.connection.alias)


class Migration(migrations.Migration):  # type: ignore[misc]
    # durq migrates through its own connection: SQLite would wait on a write lock Django's
    # transaction holds, so this migration runs outside one.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Task",
            fields=[("id", models.BigAutoField(primary_key=True, serialize=False))],
            options={
                "verbose_name": "task",
                "verbose_name_plural": "tasks",
                "db_table": "durq_admin_task",
                "managed": False,
                "default_permissions": ("view", "change", "delete"),
            },
        ),
        migrations.RunPython(migrate_durq, migrations.RunPython.noop, elidable=False),
    ]
