"""The shop end to end: Django's test client, the test database, and a real
``manage.py durq_worker`` process on that database (SQLite or PostgreSQL: ``SHOP_DB``)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection
from django.tasks import default_task_backend
from django.test import TransactionTestCase

from shop.models import Order

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


class OrderFlowTests(TransactionTestCase):
    """TransactionTestCase: the worker is another process and sees only committed rows."""

    @classmethod
    def tearDownClass(cls) -> None:
        # durq's own connections to the test database: closed before the runner drops it.
        default_task_backend.close()
        super().tearDownClass()

    def start_worker(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # The worker must use the test database that the runner just created.
        name = connection.settings_dict["NAME"]
        env["SHOP_PG_NAME" if connection.vendor == "postgresql" else "SHOP_SQLITE"] = str(name)
        worker = subprocess.Popen(
            [sys.executable, str(MANAGE), "durq_worker", "--concurrency", "2"],
            env=env,
            stderr=subprocess.PIPE,
        )
        self.addCleanup(self.stop_worker, worker)
        return worker

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        self.assertEqual(
            worker.returncode, 0, worker.stderr.read().decode() if worker.stderr else ""
        )

    def wait_for(self, order_id: int, task_status: str) -> dict:
        # The task's own status: the order row is saved (and visible) before the worker has
        # reported the task done.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = self.client.get(f"/orders/{order_id}").json()
            if body["task"] == task_status:
                return body
            time.sleep(0.05)
        self.fail(f"the task of order {order_id} never became {task_status}: {body}")

    def task_count(self) -> int:
        queues = default_task_backend.call(default_task_backend.app.inspector.list_queues)
        return sum(q.size for q in queues)

    def test_an_order_is_confirmed_by_its_task(self) -> None:
        self.start_worker()
        answer = self.client.post(
            "/orders", {"item": "book", "quantity": 2}, content_type="application/json"
        )
        self.assertEqual(answer.status_code, 202)
        order = answer.json()["order"]
        self.assertEqual(answer["Location"], f"/orders/{order}")
        body = self.wait_for(order, "SUCCESSFUL")
        self.assertEqual(body["status"], "confirmed")
        self.assertEqual(body["result"], {"order": order, "total_items": 2})

    def test_a_rolled_back_order_leaves_no_task(self) -> None:
        before = self.task_count()
        self.client.raise_request_exception = False
        answer = self.client.post(
            "/orders", {"item": "explode", "quantity": 1}, content_type="application/json"
        )
        self.assertEqual(answer.status_code, 500)
        self.assertFalse(Order.objects.exists())
        self.assertEqual(self.task_count(), before)

    def test_bad_input_is_refused_before_anything_is_written(self) -> None:
        answer = self.client.post(
            "/orders", {"item": "book", "quantity": 0}, content_type="application/json"
        )
        self.assertEqual(answer.status_code, 400)
        self.assertFalse(Order.objects.exists())
