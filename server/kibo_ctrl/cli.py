"""`kibo-ctrl`: run the control plane."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from .app import App, Config
from .model import Backend

cli = typer.Typer(help="kibo control plane.", no_args_is_help=True, add_completion=False)


@cli.callback()
def _group() -> None:
    """kibo control plane: kibo-ctrl serve runs it."""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kibo"


@cli.command()
def serve(
    listen: Annotated[str, typer.Option(help="gRPC address, HOST:PORT.")] = "127.0.0.1:50051",
    http_listen: Annotated[
        str, typer.Option(help="Connect, gRPC-Web and plain HTTP JSON address, HOST:PORT; empty to disable.")
    ] = "127.0.0.1:8080",
    http_server: Annotated[
        str, typer.Option(help="uvicorn (HTTP/1.1, fastest here) or hypercorn (adds h2c and gRPC over h2c).")
    ] = "uvicorn",
    data_dir: Annotated[Path | None, typer.Option(help="Where the embedded store keeps its files.")] = None,
    runtime: Annotated[str, typer.Option(help="What runs workspaces: sim (simulated).")] = "sim",
    sim_backend: Annotated[Backend, typer.Option(help="Backend personality of the simulator.")] = Backend.FIRECRACKER,
    sim_step_ms: Annotated[float, typer.Option(min=0, help="Simulated time each lifecycle step takes.")] = 20.0,
    sim_nodes: Annotated[int, typer.Option(min=1, max=64, help="How many simulated nodes.")] = 1,
    node_vcpus: Annotated[int, typer.Option(min=1, help="vCPUs each node offers.")] = 4096,
    node_memory_mib: Annotated[int, typer.Option(min=128, help="Memory each node offers, MiB.")] = 16 * 1024 * 1024,
    settle_ms: Annotated[
        float, typer.Option(min=0, help="How long a command call waits for its command to finish.")
    ] = 1000.0,
    node_timeout_ms: Annotated[float, typer.Option(min=50, help="Silence after which a node is UNKNOWN.")] = 3000.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the control plane until SIGTERM or SIGINT."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = Config(
        data_dir=data_dir or default_data_dir(),
        listen=listen,
        http_listen=http_listen,
        http_server=http_server,
        runtime=runtime,
        sim_backend=sim_backend,
        sim_step_ms=sim_step_ms,
        sim_nodes=sim_nodes,
        node_vcpus=node_vcpus,
        node_memory_mib=node_memory_mib,
        settle_ms=settle_ms,
        node_timeout_ms=node_timeout_ms,
    )
    if http_server not in ("uvicorn", "hypercorn"):
        raise typer.BadParameter("choose uvicorn or hypercorn", param_hint="--http-server")
    try:
        asyncio.run(_serve(config))
    except OSError as error:
        typer.echo(f"kibo-ctrl: {error}", err=True)
        raise typer.Exit(2) from None


async def _serve(config: Config) -> None:
    app = await App.start(config)
    log = logging.getLogger("kibo")
    log.info(
        "serving gRPC on %s (port %d), HTTP on %s, data in %s, runtime %s/%s",
        config.listen,
        app.port,
        config.http_listen or "-",
        config.data_dir,
        config.runtime,
        config.sim_backend.value,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight calls")
    await app.stop()
    log.info("stopped")


def main() -> None:
    cli()
