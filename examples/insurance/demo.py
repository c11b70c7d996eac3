"""``durq demo``: the reference service on the embedded SQLite default, in one process.

Starts the partner simulator, the API and the worker (monolith), prints the URLs, a demo
customer's token and ready-to-paste curl commands; Ctrl-C stops everything gracefully (the
API stops taking requests, the worker hands unfinished polls back to the queue, then the
simulator stops). Also runnable as ``python -m examples.insurance.demo [--port 8000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import shlex
import signal
from collections.abc import Callable
from typing import Any

from durq.brokers import DEFAULT_URL

from . import partner_sim
from .api import ITEMS_EXAMPLE, create_app, order_ids
from .config import Settings
from .logs import setup_logging
from .serve import QuietServer, bind, make_server

log = logging.getLogger("insurance.demo")

#: The demo partner: a little slow, "pending" three times before it confirms, and its
#: callback 3 s after the request: the order shows a poll or two, then ends at the callback.
DEMO_PARTNER = partner_sim.SimConfig(latency=0.2, pending_polls=3, callback_delay=3.0)


def banner(api_url: str, sim_url: str, broker_url: str, token: str, key: str) -> str:
    """What the demo prints once everything is up."""
    order_id, _ = order_ids("demo", key)
    auth = f"Authorization: Bearer {token}"
    create = (
        f"curl -i -X POST {api_url}/orders -H {shlex.quote(auth)} "
        f"-H 'Idempotency-Key: {key}' -H 'Content-Type: application/json' "
        f"-d {shlex.quote(ITEMS_EXAMPLE)}"
    )
    status = f"curl -s {api_url}/orders/{order_id} -H {shlex.quote(auth)}"
    dash = "durq dash" if broker_url == DEFAULT_URL else f"durq dash --broker {broker_url}"
    return "\n".join(
        [
            "durq demo: the insurance coverage service (examples/insurance), monolith",
            f"API: {api_url}",
            f"partner simulator: {sim_url} (OpenAPI at {sim_url}/openapi.json)",
            f"broker: {broker_url}",
            "customer: demo",
            f"token: {token}",
            "",
            "Create an order (202 Accepted + Location):",
            f"  {create}",
            "Repeat it with the same Idempotency-Key (200 already_accepted, nothing new):",
            f"  {create}",
            "Read its status (PENDING while the partner checks, then COVERED with a policy,"
            " by the partner's callback):",
            f"  {status}",
            f"Health: curl -s {api_url}/health",
            f"Dashboard (another terminal): {dash}",
            "",
            "Ctrl-C stops the API, the worker and the simulator gracefully.",
        ]
    )


#: Seconds within which a second SIGTERM is the first one delivered again, not a request to
#: stop at once.
REPEATED_SIGTERM = 2.0


async def serve(
    port: int = 8000,
    *,
    host: str = "127.0.0.1",
    out: Callable[[str], Any] = print,
    settings: Settings | None = None,
) -> None:
    """Run the demo until SIGINT/SIGTERM; Ctrl-C again, or a SIGTERM 2 s or more after the
    first, stops at once."""
    base = settings or Settings.from_env()
    setup_logging(base.log_format, base.log_level)
    token = secrets.token_urlsafe(12)
    partner_secret = secrets.token_urlsafe(16)  # shared by the simulator and the service
    sim_sock = bind(host, 0)
    api_sock = bind(host, port)
    sim_url = f"http://{host}:{sim_sock.getsockname()[1]}"
    api_url = f"http://{host}:{api_sock.getsockname()[1]}"
    settings = base.with_(
        tokens={token: "demo"},
        partner_url=sim_url,
        warehouses={name: sim_url for name in partner_sim.WAREHOUSES},
        callback_url=f"{api_url}/partner/callbacks/coverage",
        partner_secret=partner_secret,
        monolith=True,
    )
    partner = DEMO_PARTNER.model_copy(update={"callback_secret": partner_secret})
    sim: QuietServer = make_server(partner_sim.create_app(partner))
    api: QuietServer = make_server(create_app(settings, configure_logging=False))

    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    stopping: list[tuple[signal.Signals, float]] = []  # the first signal, and when

    def on_signal(sig: signal.Signals) -> None:
        if stopping:
            # One SIGTERM can arrive twice: make passes the one its process group got on to
            # `make demo`'s child. Ctrl-C again, or a SIGTERM sent later, stops at once.
            first, at = stopping[0]
            if sig == first == signal.SIGTERM and loop.time() - at < REPEATED_SIGTERM:
                return
            api.force_exit = sim.force_exit = True
            api.should_exit = sim.should_exit = True
            return
        stopping.append((sig, loop.time()))
        out("\nstopping: API first (the worker drains), then the partner simulator...")
        api.should_exit = True

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    sim_task = asyncio.create_task(sim.serve(sockets=[sim_sock]))
    api_task = asyncio.create_task(api.serve(sockets=[api_sock]))
    try:
        while not (sim.started and api.started):
            if api_task.done() or sim_task.done():
                break
            await asyncio.sleep(0.02)
        if api.started and sim.started:
            key = f"order-{secrets.token_hex(3)}"
            out(banner(api_url, sim_url, settings.broker_url, token, key))
        await api_task
    finally:
        sim.should_exit = True
        await sim_task
        for sig in signals:
            loop.remove_signal_handler(sig)
        api_sock.close()
        sim_sock.close()
    out("demo stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
