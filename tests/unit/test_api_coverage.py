"""Every RPC of the public services has a `kibo` command, a Python SDK method (kibotos.Client
and kibotos.AsyncClient) and a Go SDK method (sdk/go/kibotos.Client), unless ALLOWED says why not.

Found from the code, not from a list kept by hand: the RPCs from the services' descriptors;
an SDK method covers the RPCs of the stubs it calls (`self.workspaces.StopWorkspace(...)`,
`c.workspaces.StopWorkspace(...)`); a CLI command covers what the SDK methods it calls cover,
through the helpers of its own module. The Python SDK is the client classes and the classes a
workspace's access hands out (`client.workspace_access(id).processes.start(...)`: PYTHON_CLASSES);
a method of those counts for the CLI only when called through its attribute (`.processes.start`),
so that `os.kill` or `file.read` is never taken for one.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kibotos.access
import kibotos.aio
import kibotos.aio_access
import kibotos.client
import typer
from kibo.ctrl.v1 import data_plane_service_pb2, observation_service_pb2, volume_service_pb2, workspace_service_pb2
from kibo.node.v1 import node_admin_service_pb2
from kibo.sim.v1 import simulator_pb2
from kibo_cli.main import app

REPO = Path(__file__).resolve().parents[2]
GO_SDK = REPO / "sdk" / "go" / "kibotos"
# kibo.node.v1.NodeService is not here: it is the node agents' protocol (kibo-ctrl node calls
# it with a node token), not an API for people or programs; NodeAdminService is.
PUBLIC = (
    workspace_service_pb2,
    observation_service_pb2,
    volume_service_pb2,
    data_plane_service_pb2,
    simulator_pb2,
    node_admin_service_pb2,
)
SURFACES = ("cli", "python", "go")

# Deliberate exceptions: (RPC, surface) -> why it has none there.
ALLOWED: dict[tuple[str, str], str] = {
    ("SimulatorService/InjectFault", "cli"): (
        "the simulator's fault hook, served only by `kibo-ctrl serve --runtime sim`, for tests and demos "
        "of failure handling; a production CLI has nothing to inject into (the SDKs have it)"
    ),
}
# SDK methods that reach RPCs through kibotos.wait (it calls these methods on the client).
DELEGATES = {"wait": ("watch_workspace", "get_workspace", "get_command")}
# The Python SDK's classes, awaitable and blocking: (module, class, the attribute of a workspace's
# access that holds it; "" for the client itself, whose methods are called on it directly).
PYTHON_CLASSES: dict[str, list[tuple[ModuleType, str, str]]] = {
    "awaitable": [
        (kibotos.aio, "AsyncClient", ""),
        (kibotos.aio_access, "AsyncProcesses", "processes"),
        (kibotos.aio_access, "AsyncFiles", "files"),
    ],
    "blocking": [
        (kibotos.client, "Client", ""),
        (kibotos.access, "Processes", "processes"),
        (kibotos.access, "Files", "files"),
    ],
}


def rpcs() -> list[str]:
    return sorted(
        f"{service.name}/{method.name}"
        for module in PUBLIC
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    )


# -- Python SDK ------------------------------------------------------------------------------


def _stub_calls(node: ast.AST) -> set[str]:
    """RPC names of `self.<stub>.<Rpc>` in node."""
    found = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Attribute)
            and isinstance(sub.value.value, ast.Name)
            and sub.value.value.id == "self"
            and sub.attr[:1].isupper()
        ):
            found.add(sub.attr)
    return found


def python_methods(module: ModuleType, class_name: str) -> dict[str, set[str]]:
    """Public method -> the RPC names it calls (with DELEGATES and calls of other methods)."""
    tree = ast.parse(inspect.getsource(module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    functions = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    direct = {name: _stub_calls(f) for name, f in functions.items()}
    calls = {
        name: {
            sub.attr
            for sub in ast.walk(f)
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
        }
        | set(DELEGATES.get(name, ()))
        for name, f in functions.items()
    }

    def reach(name: str, seen: set[str]) -> set[str]:
        if name in seen or name not in direct:
            return set()
        seen.add(name)
        return direct[name].union(*(reach(other, seen) for other in calls[name]))

    return {name: reach(name, set()) for name in functions if not name.startswith("_")}


def python_sdk(flavour: str) -> dict[str, set[str]]:
    """Every Python SDK method of `flavour` -> the RPC names it calls: a client method by its
    name, an access class's as `processes.start` (its attribute, then its name)."""
    found: dict[str, set[str]] = {}
    for module, class_name, attribute in PYTHON_CLASSES[flavour]:
        for name, called in python_methods(module, class_name).items():
            found[f"{attribute}.{name}" if attribute else name] = called
    return found


def test_every_class_of_the_access_modules_that_calls_an_rpc_is_counted() -> None:
    for flavour, module in (("awaitable", kibotos.aio_access), ("blocking", kibotos.access)):
        counted = {name for m, name, _ in PYTHON_CLASSES[flavour] if m is module}
        tree = ast.parse(inspect.getsource(module))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            if cls.name not in counted:
                assert not set().union(*python_methods(module, cls.name).values()), (
                    f"{module.__name__}.{cls.name} calls RPCs: add it to PYTHON_CLASSES"
                )


def test_the_method_names_that_reach_rpcs_are_unambiguous() -> None:
    """The CLI analysis reads a client method by its bare name: no two classes may share the name
    of a method that calls an RPC, or one would be counted for the other."""
    for flavour in PYTHON_CLASSES:
        owners: dict[str, list[str]] = {}
        for module, class_name, _ in PYTHON_CLASSES[flavour]:
            for name, called in python_methods(module, class_name).items():
                if called:
                    owners.setdefault(name, []).append(class_name)
        assert not {name: classes for name, classes in owners.items() if len(classes) > 1}


def test_the_delegates_are_what_kibotos_wait_calls() -> None:
    source = inspect.getsource(kibotos.wait)
    for method in DELEGATES["wait"]:
        assert f"target.{method}(" in source, method


# -- Go SDK ----------------------------------------------------------------------------------

_GO_METHOD = re.compile(r"^func \(c \*Client\) ([A-Z]\w*)\(", re.MULTILINE)
_GO_STUB_CALL = re.compile(r"\bc\.(?:workspaces|observation|volumes|dataPlane|simulator|nodes)\.([A-Z]\w*)\b")


def go_methods(sources: Iterable[str]) -> dict[str, set[str]]:
    """Exported method of *Client -> the RPC names of the stubs it calls."""
    methods: dict[str, set[str]] = {}
    for source in sources:
        for match in _GO_METHOD.finditer(source):
            body = source[match.end() :].split("\n}\n", 1)[0]  # up to the method's closing brace
            methods[match.group(1)] = set(_GO_STUB_CALL.findall(body))
    return methods


def go_sources() -> list[str]:
    return [p.read_text() for p in sorted(GO_SDK.glob("*.go")) if not p.name.endswith("_test.go")]


# -- CLI -------------------------------------------------------------------------------------


def cli_commands(root: typer.Typer, prefix: str = "kibo") -> Iterator[tuple[str, Callable[..., Any]]]:
    for info in root.registered_commands:
        assert info.callback is not None
        yield f"{prefix} {info.name or info.callback.__name__.replace('_', '-')}", info.callback
    for group in root.registered_groups:
        assert group.typer_instance is not None
        yield from cli_commands(group.typer_instance, f"{prefix} {group.name}")


def _holder(node: ast.expr) -> str:
    """The name an attribute is read from: `processes` in `x.processes.start` and `processes.start`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def sdk_calls_in(node: ast.AST, sdk_methods: set[str]) -> set[str]:
    """The SDK methods named in `node`: a client method by its name, an access class's
    (`processes.start`) only when read from that attribute."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            qualified = f"{_holder(sub.value)}.{sub.attr}"
            if qualified in sdk_methods:
                found.add(qualified)
            elif sub.attr in sdk_methods:
                found.add(sub.attr)
    return found


def _sdk_calls(function: Callable[..., Any], sdk_methods: set[str]) -> set[str]:
    """SDK methods `function` calls, itself or through module-level helpers of its module
    (functions and coroutine functions)."""
    original = inspect.unwrap(function)
    module_tree = ast.parse(inspect.getsource(inspect.getmodule(original)))  # type: ignore[arg-type]
    helpers = {f.name: f for f in module_tree.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(textwrap.dedent(inspect.getsource(original)))]
    seen: set[str] = set()
    while pending:
        node = pending.pop()
        found |= sdk_calls_in(node, sdk_methods)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in helpers and sub.id not in seen:
                seen.add(sub.id)
                pending.append(helpers[sub.id])
    return found


def cli_coverage(python: dict[str, set[str]]) -> dict[str, set[str]]:
    """RPC -> the kibo commands that call it."""
    covered: dict[str, set[str]] = {}
    for name, callback in cli_commands(app):
        for method in _sdk_calls(callback, set(python)):
            for rpc in python[method]:
                covered.setdefault(rpc, set()).add(name)
    return covered


# -- the check -------------------------------------------------------------------------------


def uncovered(
    all_rpcs: list[str], by_surface: dict[str, set[str]], allowed: dict[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """(RPC, surface) pairs with no method or command there and no reason in `allowed`."""
    return [
        (rpc, surface)
        for rpc in all_rpcs
        for surface in SURFACES
        if rpc.split("/")[1] not in by_surface[surface] and (rpc, surface) not in allowed
    ]


def surfaces() -> dict[str, set[str]]:
    python = python_sdk("awaitable")
    blocking = python_sdk("blocking")
    assert python == blocking, "the two Python SDKs call different RPCs"
    return {
        "cli": set(cli_coverage(python)),
        "python": set().union(*python.values()),
        "go": set().union(*go_methods(go_sources()).values()),
    }


def test_every_public_rpc_has_a_cli_command_and_both_sdk_methods() -> None:
    missing = uncovered(rpcs(), surfaces(), ALLOWED)
    assert not missing, "RPCs without a CLI command or SDK method (add one, or a reason to ALLOWED):\n" + "\n".join(
        f"  {rpc}: {surface}" for rpc, surface in missing
    )


def test_every_allowed_exception_is_still_an_exception() -> None:
    """A reason in ALLOWED for an RPC that has gained its command or method is stale."""
    by_surface = surfaces()
    names = set(rpcs())
    for rpc, surface in ALLOWED:
        assert rpc in names, f"{rpc} is not an RPC of the public services"
        assert rpc.split("/")[1] not in by_surface[surface], f"{rpc} now has a {surface} entry: drop it from ALLOWED"


def test_the_check_finds_a_missing_rpc() -> None:
    """Remove one Go helper and one CLI command: the check names exactly those."""
    by_surface = surfaces()
    go_without_bind = go_methods(
        [re.sub(r"func \(c \*Client\) BindWorkspaceVolume\(.*?\n}\n", "", "".join(go_sources()), flags=re.DOTALL)]
    )
    by_surface["go"] = set().union(*go_without_bind.values())
    python = python_sdk("awaitable")
    by_surface["cli"] = {
        rpc for rpc, names in cli_coverage(python).items() if names != {"kibo workspace revoke-access"}
    }
    assert uncovered(rpcs(), by_surface, ALLOWED) == [
        ("WorkspaceService/BindWorkspaceVolume", "go"),
        ("WorkspaceService/RevokeWorkspaceDataPlaneAccess", "cli"),
    ]


def test_cli_commands_cover_the_rpcs_named_in_the_docs() -> None:
    """Spot checks of the analysis itself, from the lifecycle page's table."""
    coverage = cli_coverage(python_sdk("awaitable"))
    assert "kibo workspace stop" in coverage["StopWorkspace"]
    assert "kibo workspace cleanup-status" in coverage["GetWorkspaceCleanup"]
    assert "kibo workspace wait" in coverage["WatchWorkspace"]
    assert "kibo workspace cp" in coverage["WriteWorkspaceFile"]
    assert {"kibo workspace bind-volume", "kibo workspace rebind-volume"} <= coverage["BindWorkspaceVolume"]


def test_an_access_method_counts_only_through_its_attribute() -> None:
    """`os.kill`, `path.stat()` or `file.read()` in a command is not the SDK's processes.kill,
    files.stat or files.read; `access.processes.kill(...)` and `files.read(...)` are."""
    sdk = set(python_sdk("awaitable"))
    assert {"processes.kill", "files.stat", "files.read"} <= sdk
    source = "os.kill(pid, 9)\nPath(p).stat()\nhandle.read()\naccess.processes.kill(pid)\nfiles.read(path)\n"
    assert sdk_calls_in(ast.parse(source), sdk) == {"processes.kill", "files.read"}


def test_removing_an_access_method_uncovers_its_rpc() -> None:
    """The access classes are SDK surface: without Files.stat, StatWorkspacePath has no Python
    method (list_dir and the others do not call it)."""
    python = python_sdk("awaitable")
    without = {name: rpcs for name, rpcs in python.items() if name != "files.stat"}
    by_surface = surfaces()
    by_surface["python"] = set().union(*without.values())
    assert ("DataPlaneService/StatWorkspacePath", "python") in uncovered(rpcs(), by_surface, ALLOWED)
