"""OpenAPI import through ToolService.ImportOpenApi, of the document the shop sandbox serves
over real HTTP: two reads and one keyed write; a write without its class, or a bad
document, refused naming the field with nothing saved (in-process control plane, real
Postgres). Then the chaos scenario over the imported write (executor processes): executors
killed with SIGKILL and responses dropped after the order was
placed, and still exactly one order per run (0 duplicate effects), every run completed.

The chaos test here is small (3 runs, two kills); the one under the `chaos` marker runs
AGENTRUN_OPENAPI_CHAOS_RUNS runs (default 40) with random kills and random drops.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pytest

from agentrun.v1 import run_pb2, tool_pb2, tool_pb2_grpc
from control_plane.ground.config import ServerConfig
from control_plane.server import start as start_server
from tests.harness import auth
from tests.harness.agentrun_api import (
    Api,
    clear_faults,
    sandbox_effects,
    sandbox_requests,
    set_fault,
)
from tests.harness.cli import agentrun_async
from tests.harness.invariants import assert_effects_at_most_once
from tests.harness.waiting import eventually

KEYED = tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY)


async def stub(server, db_url: str, ws: str = "acme"):
    key = await auth.workspace_key(db_url, ws, role="admin")
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    return channel, tool_pb2_grpc.ToolServiceStub(channel)


def shop_document(providers_url: str) -> str:
    response = httpx.get(f"{providers_url}/shop/openapi.json", timeout=10)
    response.raise_for_status()
    return response.text


async def saved_count(db) -> int:
    return await db.fetchval("SELECT count(*) FROM tools WHERE workspace_id = 'acme'")


async def test_the_shop_document_imports_as_two_reads_and_one_keyed_write(
    server, db_url, db, sandbox_providers
):
    document = shop_document(sandbox_providers.url)
    channel, tools = await stub(server, db_url)
    async with channel:
        proposed = await tools.ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(document=document, dry_run=True)
        )
        assert await saved_count(db) == 0  # a dry run saves nothing
        proposal = {t.name: t for t in proposed.tools}["createOrder"]
        assert proposal.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
        assert proposal.idempotency_header == "Idempotency-Key"
        imported = await tools.ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(document=document, classes={"createOrder": KEYED})
        )
        listed = {t.name: t for t in (await tools.ListTools(tool_pb2.ListToolsRequest())).tools}
    access = {t.name: t.access for t in imported.tools}
    assert access == {
        "listProducts": tool_pb2.TOOL_ACCESS_READ,
        "getProduct": tool_pb2.TOOL_ACCESS_READ,
        "createOrder": tool_pb2.TOOL_ACCESS_WRITE,
    }
    write = listed["createOrder"]
    assert (write.version, write.source, write.workspace_id) == (1, "openapi", "acme")
    assert write.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    assert write.http.url == f"{sandbox_providers.url}/shop/orders"
    assert write.created_by.startswith("key:")
    assert await saved_count(db) == 3


PETSTORE = Path(__file__).resolve().parents[1] / "data" / "openapi"
NOT_KEYED = tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_NONE)


@pytest.mark.parametrize(("version", "ws"), [("3.0", "acme"), ("3.1", "globex")])
async def test_the_canonical_petstore_documents_import(server, db_url, db, version, ws):
    """openapi-spec-validator's Petstore test data; 3.1's unquoted `200:` key is a YAML
    integer, which used to come back as "document: expected string or bytes-like object"."""
    document = (PETSTORE / f"petstore-{version}.yaml").read_text()
    channel, tools = await stub(server, db_url, ws)
    async with channel:
        imported = await tools.ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(document=document, classes={"createPets": NOT_KEYED})
        )
    urls = {t.name: (t.access, t.http.method, t.http.url) for t in imported.tools}
    base = "http://petstore.swagger.io/v1/pets"
    assert urls == {
        "listPets": (tool_pb2.TOOL_ACCESS_READ, "GET", base),
        "createPets": (tool_pb2.TOOL_ACCESS_WRITE, "POST", base),
        "showPetById": (tool_pb2.TOOL_ACCESS_READ, "GET", base + "/{petId}"),
    }
    saved = "SELECT count(*) FROM tools WHERE workspace_id = $1 AND source = 'openapi'"
    assert await db.fetchval(saved, ws) == 3


PETS = [{"id": 1, "name": "Rex", "tag": "dog"}, {"id": 2, "name": "Tom"}]


async def test_an_agent_calls_the_imported_petstore_against_a_local_server(
    db_url, control_plane, executor_factory
):
    """The Petstore 3.1 document imported with its server pointed at a local HTTP server: an
    agent's run calls listPets there with the model's arguments and reports the answer."""
    from tests.harness.http_stub import reply, serving

    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "pets")
    document = (PETSTORE / "petstore-3.1.yaml").read_text()
    async with serving(lambda r: reply(json=PETS)) as petstore:
        async with auth.channel(cp.address, await auth.workspace_key(db_url, "pets")) as ch:
            await tool_pb2_grpc.ToolServiceStub(ch).ImportOpenApi(
                tool_pb2.ImportOpenApiRequest(
                    document=document, operations=["listPets"], base_url=f"{petstore.url}/v1"
                )
            )
        await api.publish("keeper", "petstore", ["listPets"])
        executor_factory(cp)
        run_id = await api.start("keeper", "which pets?")
        (run,) = await api.wait_terminal([run_id], within=60)
    await api.close()
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert [(s.method, s.target) for s in petstore.seen] == [("GET", "/v1/pets?limit=2")]
    assert json.loads(run.output.removeprefix("The pets: ")) == PETS


REFUSALS = [
    ({}, "classes[createOrder]"),  # the write, without its class
    ({"operations": ["getProduct", "nope"]}, "operations[1]"),
    ({"classes": {"getProduct": KEYED}}, "classes[getProduct]"),
    ({"base_url": "ftp://shop"}, "base_url"),
    ({"connection": "Shop Inc", "classes": {"createOrder": KEYED}}, "tool.connection"),
]
BAD_DOCUMENTS = [
    "openapi: 3.0.3\ninfo: {title: t}\npaths: {}\n",
    "{[",
    "swagger: '2.0'",
    "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths: {}\nx: !!binary aGk=\n",
]


async def test_a_refused_import_names_the_field_and_saves_nothing(
    server, db_url, db, sandbox_providers
):
    document = shop_document(sandbox_providers.url)
    asks = [
        (tool_pb2.ImportOpenApiRequest(document=document, **fields), field)
        for fields, field in REFUSALS
    ]
    asks += [(tool_pb2.ImportOpenApiRequest(document=bad), "document") for bad in BAD_DOCUMENTS]
    channel, tools = await stub(server, db_url)
    async with channel:
        for request, field in asks:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tools.ImportOpenApi(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(f"{field}:"), refused.value.details()
    assert await saved_count(db) == 0


# -- the CLI ---------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shop.openapi.yaml"


async def cli(server, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await agentrun_async(
        f"127.0.0.1:{server.port}",
        key,
        "tools",
        "import-openapi",
        str(EXAMPLE),
        *args,
        workspace="acme",
        timeout=60,
    )


async def test_the_cli_proposes_then_imports(server, db_url, db):
    key = await auth.workspace_key(db_url, "acme", role="admin")
    proposed = await cli(server, key, "--dry-run")
    assert proposed.returncode == 0, proposed.stderr
    order = next(line for line in proposed.stdout.splitlines() if "createOrder" in line)
    assert "proposed" in order and "provider_key, Idempotency-Key" in order
    assert "nothing saved" in proposed.stderr
    assert await saved_count(db) == 0
    imported = await cli(server, key, "--class", "createOrder=provider_key", "-o", "json")
    assert imported.returncode == 0, imported.stderr
    kinds = {t["name"]: (t["access"], t["idempotency"]) for t in json.loads(imported.stdout)}
    assert kinds == {
        "listProducts": ("TOOL_ACCESS_READ", "IDEMPOTENCY_CLASS_UNSPECIFIED"),
        "getProduct": ("TOOL_ACCESS_READ", "IDEMPOTENCY_CLASS_UNSPECIFIED"),
        "createOrder": ("TOOL_ACCESS_WRITE", "IDEMPOTENCY_CLASS_PROVIDER_KEY"),
    }
    assert await saved_count(db) == 3


# -- the chaos scenario over the imported write -----------------------------------------

ORDERS = "/shop/orders"
COMPLETED = run_pb2.RUN_STATUS_COMPLETED
CHAOS_RUNS = int(os.environ.get("AGENTRUN_OPENAPI_CHAOS_RUNS", "40"))


@pytest.fixture
async def shop(db_url, sandbox_providers):
    """A control plane (in this process: only executors die here) whose workspace imported
    the shop and published an agent ordering there; the address and key executors use."""
    config = ServerConfig(
        database_url=db_url,
        listen="127.0.0.1:0",
        lease_seconds=3,
        heartbeat_seconds=1,
        claim_poll_seconds=0.1,
    )
    running = await start_server(config)
    address = f"127.0.0.1:{running.port}"
    api = await Api.connect(address, db_url)
    key = await auth.workspace_key(db_url, api.ws, role="admin")
    async with auth.channel(address, key) as channel:
        await tool_pb2_grpc.ToolServiceStub(channel).ImportOpenApi(
            tool_pb2.ImportOpenApiRequest(
                document=shop_document(sandbox_providers.url), classes={"createOrder": KEYED}
            )
        )
    await api.publish("orderer", "shop_orderer", ["createOrder", "getProduct"])
    yield address, {"AGENTRUN_EXECUTOR_KEY": await auth.executor_key(db_url)}, api
    await api.close()
    await running.stop(grace=0)
    clear_faults(sandbox_providers.url)


def mine(entries: list[dict], run_ids: list[str], key: str) -> list[dict]:
    """The entries (effects or requests) whose idempotency key belongs to one of these runs."""
    runs = set(run_ids)
    return [e for e in entries if (e.get(key) or "").rsplit(":", 1)[0] in runs]


def order_requests(url: str, run_ids: list[str]) -> list[dict]:
    logged = [r for r in sandbox_requests(url) if r["path"] == ORDERS]
    return mine(logged, run_ids, "idempotency_key")


def assert_one_order_per_run(url: str, run_ids: list[str]) -> list[dict]:
    """Exactly one order per run, none twice under a key: 0 duplicate effects."""
    orders = mine(sandbox_effects(url, "shop"), run_ids, "key")
    assert_effects_at_most_once(orders, "shop")
    per_run = Counter(o["key"].rsplit(":", 1)[0] for o in orders)
    assert per_run == Counter(dict.fromkeys(run_ids, 1)), per_run.most_common(3)
    return orders


async def test_the_imported_write_lands_once_per_run_through_kills_and_dropped_responses(
    shop, executor_factory, sandbox_providers
):
    cp, key, api = shop
    url = sandbox_providers.url
    run_ids = [await api.start("orderer", f"buyer-{i}") for i in range(3)]
    for run_id in run_ids:  # each run's first order is placed, and its answer lost (a reset)
        set_fault(
            url,
            provider="shop",
            mode="drop_response",
            path=ORDERS,
            key_prefix=f"{run_id}:",
            count=1,
            delay_ms=0,
        )
    # SIGKILLed from inside once its first order call returned, before its result is committed.
    (doomed,) = executor_factory(cp, AGENTRUN_FAULTS="executor.tool.after_response=kill@1", **key)

    async def claimed() -> bool:
        return all([(await api.get(r)).status == run_pb2.RUN_STATUS_RUNNING for r in run_ids])

    # The next boots once the doomed one holds every run (or has died already); it takes the
    # runs over when their leases lapse, and sends the orders again under their keys.
    await eventually(lambda: not doomed.alive or claimed(), timeout=30, message="never claimed")
    executor_factory(cp, **key)
    await eventually(lambda: not doomed.alive, timeout=30, message="the kill never fired")
    assert doomed.returncode == -9, doomed.log_tail()
    runs = await api.wait_terminal(run_ids, within=60)
    assert [r.status for r in runs] == [COMPLETED] * len(run_ids), [r.error for r in runs]
    assert_one_order_per_run(url, run_ids)
    requests = order_requests(url, run_ids)
    assert sum(r["fault"] == "drop_response" for r in requests) == len(run_ids)
    assert len(requests) > len(run_ids)  # orders were sent again, and answered from the key


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_chaos_over_the_imported_write(shop, executor_factory, sandbox_providers):
    """Many runs; random drops of the order's answer, executors killed at random fault
    points and at random moments; every run completes with exactly one order."""
    cp, key, api = shop
    url = sandbox_providers.url
    set_fault(
        url,
        provider="shop",
        mode="drop_response",
        path=ORDERS,
        probability=0.3,
        seed=18,
        delay_ms=0,
    )
    run_ids = [await api.start("orderer", f"buyer-{i:03d}") for i in range(CHAOS_RUNS)]
    rng, serial = random.Random(18), iter(range(1, 10_000))

    def spawn():
        env = {"AGENTRUN_FAULTS_RANDOM": "0.01", "AGENTRUN_FAULTS_SEED": str(next(serial))}
        return executor_factory(cp, AGENTRUN_CAPACITY="8", **env, **key)[0]

    fleet, kills = [spawn() for _ in range(3)], 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = [await api.get(r) for r in run_ids]
        if all(r.status == COMPLETED for r in done):
            break
        kills += sum(not p.alive for p in fleet)
        fleet = [p if p.alive else spawn() for p in fleet]
        if rng.random() < 0.25:
            victim = rng.randrange(len(fleet))
            fleet[victim].kill()
            fleet[victim], kills = spawn(), kills + 1
        await asyncio.sleep(0.5)  # a polling interval, not a synchronisation
    runs = await api.wait_terminal(run_ids, within=30)
    assert [r.run_id for r in runs if r.status != COMPLETED] == []
    orders = assert_one_order_per_run(url, run_ids)
    dropped = sum(r["fault"] == "drop_response" for r in order_requests(url, run_ids))
    print(
        f"\nopenapi chaos: runs={len(run_ids)} kills={kills} dropped={dropped} "
        f"orders={len(orders)} duplicates=0"
    )
    assert kills > 0 and dropped > 0, "nothing was exercised"
