"""The pytest plugin, run by a real pytest in a subprocess on a project of its own."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # a pytest subprocess per test

TASKS = """
import durq

app = durq.App("sqlite:///never-used.sqlite3")


@app.task("email:send", max_retry=3, retry_delay=lambda n, e: 30)
async def send(payload, ctx):
    if ctx.retried == 0:
        raise durq.NotReady("smtp busy")
    return {"to": payload["to"]}
"""

USES_THE_APP = """
import durq
import myapp


async def test_enqueue_and_drain(durq_app, durq_worker, durq_clock):
    assert durq_app is myapp.app
    await durq_app.enqueue("email:send", {"to": "a@b.c"})
    assert (await durq_worker.drain()).outcomes == [("email:send", "retry")]
    durq_clock.advance("30s")
    ran = await durq_worker.drain()
    assert ran[0].result == {"to": "a@b.c"}


async def test_nothing_leaks_from_the_test_before(durq_app, durq_worker):
    assert await durq_worker.tasks() == []
    assert durq_app.broker_url.startswith("memory://")


def test_the_app_is_given_back():
    assert myapp.app.broker_url.endswith("never-used.sqlite3")
    assert not isinstance(myapp.app.clock, durq.testing.FakeClock)
"""


def marked(marker: str) -> str:
    """The shared test module with every async test marked ``marker``."""
    return USES_THE_APP.replace("\nasync def", f"\n@pytest.mark.{marker}\nasync def").replace(
        "import durq\n", "import durq\nimport pytest\n", 1
    )


def project(pytester: pytest.Pytester, ini: str, **files: str) -> None:
    pytester.makeini(textwrap.dedent(ini))
    pytester.makepyfile(myapp=TASKS, **files)


@pytest.mark.parametrize(
    ("mode", "module"),
    [("strict", marked("asyncio")), ("auto", USES_THE_APP)],
    ids=["strict", "auto"],
)
def test_pytest_asyncio_modes_with_the_users_app(
    pytester: pytest.Pytester, mode: str, module: str
) -> None:
    project(
        pytester,
        f"""
        [pytest]
        asyncio_mode = {mode}
        durq_app = myapp:app
        """,
        test_mode=module,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_anyio(pytester: pytest.Pytester) -> None:
    project(
        pytester,
        """
        [pytest]
        durq_app = myapp:app
        """,
        test_anyio=marked("anyio")
        + """

@pytest.fixture
def anyio_backend():
    return "asyncio"
""",
    )
    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_a_fresh_app_without_configuration(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(
        test_fresh="""
        def test_register_and_run(durq_app, durq_worker_sync):
            @durq_app.task("t:add")
            def add(payload):
                return payload["a"] + payload["b"]

            info = durq_app.enqueue_sync("t:add", {"a": 2, "b": 3})
            assert durq_worker_sync.drain().outcomes == [("t:add", "completed")]
            assert durq_worker_sync.get(info).result == 5
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


SCHEDULED = """
import durq
import pytest

app = durq.App("memory://")


@app.periodic("@every 5s", type="health:ping")
async def ping() -> None: ...


@app.task("email:send")
async def send(payload) -> None: ...


@pytest.fixture
def durq_app():
    with durq.testing.in_memory(app, start=1_800_000_000.0) as bound:
        yield bound


async def test_a_test_that_does_not_ask_sees_no_schedule(durq_worker):
    await app.enqueue("email:send", {"to": "a@b.c"})
    assert (await durq_worker.drain()).outcomes == [("email:send", "completed")]
    durq_worker.clock.advance("1m")
    assert await durq_worker.drain() == []


def test_nor_does_the_sync_worker(durq_worker_sync):
    durq_worker_sync.advance("1m")
    assert durq_worker_sync.drain() == []


@pytest.mark.durq_worker(scheduler=True)
async def test_a_marked_test_ticks_with_the_clock(durq_worker):
    assert (await durq_worker.drain()).outcomes == [("health:ping", "completed")]
    durq_worker.clock.advance("4s")
    assert await durq_worker.drain() == []
    durq_worker.clock.advance("1s")
    assert (await durq_worker.drain()).outcomes == [("health:ping", "completed")]


@pytest.mark.durq_worker(scheduler=True, queues=["other"])
def test_the_marker_reaches_the_sync_worker(durq_worker_sync):
    assert durq_worker_sync.worker.queues == {"other": 1}
    assert durq_worker_sync.drain() == []  # health:ping's queue is not served
"""


def test_schedules_tick_only_in_tests_that_ask(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(test_scheduled=SCHEDULED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=4)


def test_a_bad_app_setting_is_one_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndurq_app = myapp\n")
    pytester.makepyfile(test_bad="def test_it(durq_app):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*APP must look like module:attribute*"])
