"""A plain script: enqueue, run a worker until the task is done, print its result."""

import asyncio
from typing import Any

import durq

app = durq.App()  # DURQ_BROKER_URL, else the embedded SQLite default


@app.task("math:add", retention="1h")
def add(payload: dict[str, Any]) -> int:
    return int(payload["a"]) + int(payload["b"])


async def main() -> Any:
    async with app:
        info = await app.enqueue(add, {"a": 2, "b": 3})
        async with app.worker(concurrency=2):
            while info.state is not durq.TaskState.COMPLETED:
                await asyncio.sleep(0.05)  # a script polls; web handlers answer 202 instead
                info = await app.inspector.get_task_info(info.queue, info.id)
        return info.result


if __name__ == "__main__":
    print(asyncio.run(main()))
