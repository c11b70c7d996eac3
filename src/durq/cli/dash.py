"""``durq dash``: the web dashboard and admin HTTP API (S2: token auth, loopback by default)."""

from __future__ import annotations

import ipaddress
import sys
from typing import Annotated

import typer

from durq import ranges
from durq.cli.common import BrokerOpt, UsageFailure, load_app, make_app
from durq.observability.logging import setup_logging

EPILOG = (
    "Examples:\n\n"
    "  durq dash\n\n"
    "  durq dash myproject.tasks:app   (also shows its periodic schedules)\n\n"
    "  DURQ_DASH_TOKEN=s3cret-token durq dash --broker postgresql://localhost/app\n\n"
    "  durq dash --read-only --host 0.0.0.0 --token s3cret-token\n\n"
    "Without --token (or $DURQ_DASH_TOKEN) a random token is generated and printed. "
    "Browsers log in with it; API clients send 'Authorization: Bearer TOKEN'."
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dash_command(
    app_path: Annotated[
        str | None,
        typer.Argument(
            metavar="[APP]",
            help="Your app as module:attribute, to show its periodic schedules [default: "
            "none; queues, tasks and workers need only the broker]",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on (1-65535).")] = 8181,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="DURQ_DASH_TOKEN",
            help="Access token (at least 8 characters) [default: $DURQ_DASH_TOKEN, else "
            "a random one, printed]",
            show_default=False,
        ),
    ] = None,
    broker: BrokerOpt = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show everything, allow no action.")
    ] = False,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve without authentication (anyone who can reach the port can act).",
        ),
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="Log level.")] = "INFO",
    cookie_secure: Annotated[
        bool,
        typer.Option(
            "--cookie-secure",
            help="Mark cookies Secure even over http (behind a TLS proxy) [default: only "
            "for https requests]",
        ),
    ] = False,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            envvar="DURQ_DASH_FORWARDED_ALLOW_IPS",
            help="Comma-separated addresses of proxies whose X-Forwarded-For/-Proto are "
            "believed [default: none]",
            show_default=False,
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A host name the dashboard answers to (repeatable; .example.com for a "
            "domain) [default: its address, IP addresses and localhost]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the dashboard and the admin HTTP API."""
    try:
        import uvicorn

        from durq.dashboard import DashboardSettings, create_dashboard, generate_token
        from durq.dashboard.server import server_config
    except ImportError as exc:
        raise UsageFailure(
            f"durq dash needs the web extra (pip install 'durq[web]'): {exc}"
        ) from None
    if insecure_no_auth and token:
        raise UsageFailure("give --token or --insecure-no-auth, not both")
    if token is not None and len(token) < 8:
        raise UsageFailure("--token must have at least 8 characters")
    ranges.port("--port", port)
    setup_logging(log_level)
    app = load_app(app_path, broker) if app_path else make_app(broker)
    generated = False
    if not insecure_no_auth and not token:
        token = generate_token()
        generated = True
    settings = DashboardSettings(
        read_only=read_only,
        cookie_secure=True if cookie_secure else None,
        allowed_hosts=tuple(allowed_host or ()),
    )
    dashboard = create_dashboard(
        app, token=token, insecure_no_auth=insecure_no_auth, settings=settings
    )
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{port}/"
    lines = [f"durq dashboard on {url} (broker {app.broker_url})"]
    if generated:
        lines.append(f"access token: {token}")
        lines.append("  (log in with it; API: Authorization: Bearer <token>)")
    if insecure_no_auth:
        lines.append("WARNING: no authentication (--insecure-no-auth)")
        if not _is_loopback(host):
            lines.append(
                f"WARNING: {host} is not a loopback address: anyone on the network can act"
            )
    if read_only:
        lines.append("read-only: actions are disabled")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    config = server_config(
        dashboard,
        host=host,
        port=port,
        log_level=log_level,
        forwarded_allow_ips=forwarded_allow_ips,
    )
    uvicorn.Server(config).run()


def register(app: typer.Typer) -> None:
    """Add ``durq dash``."""
    app.command("dash", epilog=EPILOG)(dash_command)
