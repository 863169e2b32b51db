"""`kibo-ctrl serve --store postgresql://...` as a user runs it: the state is in the database,
not in --data-dir; the token commands reach the same store; a bad or unreachable --store is a
clear refusal at start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.ctrl.v1 import workspace_service_pb2_grpc as ws_grpc

from tests.client import Client, S, meta
from tests.postgres import Databases
from tests.server import ServerProcess, free_port


async def test_state_outlives_a_kill_9_and_the_data_dir(
    server_factory: Callable[..., ServerProcess], postgres_databases: Databases
) -> None:
    """Acknowledged commands survive a kill -9 of the server, and a server started on the
    same database with an empty data dir finds every workspace where it was."""
    url = postgres_databases.create()
    first = server_factory(store=url)
    async with Client.connect(first.address) as client:
        made = [(await client.create()).workspace_id for _ in range(4)]
        stopped = await client.stop(made[0])
        assert stopped.workspace.state == S.WORKSPACE_STATE_STOPPED
        accepted = await client.ws.StopWorkspace(ws.StopWorkspaceRequest(metadata=meta(), workspace_id=made[1]))
    first.kill()
    second = server_factory(store=url)
    assert second.data_dir != first.data_dir
    async with Client.connect(second.address) as client:
        assert (await client.get(made[0])).state == S.WORKSPACE_STATE_STOPPED
        # The stop acknowledged just before the kill is recorded, and carried on by the new server.
        assert (await client.command(accepted.command.command_id)).workspace_id == made[1]
        await client.wait_for(made[1], S.WORKSPACE_STATE_STOPPED)
        for workspace_id in made[2:]:
            assert (await client.get(workspace_id)).state == S.WORKSPACE_STATE_AVAILABLE
        listed = await client.ws.ListWorkspaces(ws.ListWorkspacesRequest(page_size=100))
        assert {w.workspace_id for w in listed.workspaces} == set(made)


async def test_token_create_with_store_makes_a_token_the_server_takes(
    server_factory: Callable[..., ServerProcess], postgres_databases: Databases
) -> None:
    url = postgres_databases.create()
    server = server_factory(store=url, auth=True)
    made = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "kibo_ctrl", "token", "create", "--tenant", "team", "--store", url],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KIBO_DATA_DIR": str(server.data_dir.parent / "elsewhere")},
    )
    token = made.stdout.strip()
    async with Client.connect(server.address, token=token) as client:
        created = await client.create()
        assert created.workspace_id
    async with Client.connect(server.address, token="kibo_not-a-token") as stranger:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stranger.create()
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("store", "words"),
    [
        ("mysql://kibo@127.0.0.1/kibo", "--store takes a postgresql://USER@HOST:PORT/DB URL"),
        ("postgresql://kibo@127.0.0.1:{port}/kibo", "PostgreSQL cannot be reached"),
    ],
    ids=["not-postgresql", "unreachable"],
)
def test_a_store_that_cannot_be_used_stops_serve_with_its_reason(tmp_path: Path, store: str, words: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "kibo_ctrl", "serve", "--listen", address, "--http-listen", ""]
    command += ["--runtime", "sim", "--insecure-no-auth", "--data-dir", str(tmp_path / "data")]
    command += ["--store", store.format(port=free_port())]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_replicas_starting_together_on_a_fresh_database_agree_on_one_token(
    server_factory: Callable[..., ServerProcess], postgres_databases: Databases
) -> None:
    """Each replica read the store's tokens, found none and made its own (issue 26): four
    replicas started at once on a fresh database made up to four "first" tokens. The check and
    the insert are now one transaction: one token, in one replica's admin.token, taken by all."""
    url = postgres_databases.create()
    with ThreadPoolExecutor(4) as pool:
        replicas = list(pool.map(lambda _: server_factory("--no-local-node", auth=True, store=url), range(4)))
    made = [replica for replica in replicas if (replica.data_dir / "admin.token").exists()]
    listed = subprocess.run(
        [sys.executable, "-m", "kibo_ctrl", "token", "list", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert len(made) == 1 and listed.count("tok-") == 1, (len(made), listed)
    token = made[0].admin_token
    for replica in replicas:
        with grpc.insecure_channel(replica.address) as channel:
            stub = ws_grpc.WorkspaceServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.ListWorkspaces(ws.ListWorkspacesRequest(), metadata=(("authorization", f"Bearer {token}"),))
