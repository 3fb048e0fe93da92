"""The import map stays true: arrows only run down the layers of docs/architecture.md, and no module cycle.

Read from the source with ``ast`` (nothing is imported), lazy imports inside functions included: a lazy
import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "assistant"

# What each part may import besides itself. Parts are top-level packages or modules of ``assistant``.
BASE = {"config", "audio", "g711", "loading", "body", "languages", "cache_files", "cpus"}
ENGINES = {"vad", "asr", "respond", "tts"}
ALLOWED: dict[str, set[str]] = {
    "config": {"languages"},
    "languages": set(),
    "audio": set(),
    "g711": set(),
    "loading": set(),
    "body": set(),
    "cache_files": set(),
    "cpus": set(),
    "rtc": BASE,
    "engine_host": BASE,  # runs any engine in a supervised child process: knows none of them
    **{engine: BASE for engine in ENGINES},
    "respond": BASE | {"engine_host"},
    "asr": BASE | {"engine_host"},
    "pipeline": BASE | ENGINES,
    "serve_ray": BASE | ENGINES | {"pipeline", "telemetry"},  # the replicas' spans join the calls' traces
    "telemetry": BASE | ENGINES | {"pipeline"},
    "server": BASE | ENGINES | {"pipeline", "rtc", "serve_ray", "engine_host", "telemetry"},
    "bench": BASE | ENGINES | {"pipeline", "rtc", "server", "serve_ray", "engine_host", "telemetry"},
    "cli": BASE | ENGINES | {"pipeline", "rtc", "server", "bench", "serve_ray", "engine_host", "telemetry"},
    "__main__": {"cli"},
    "__init__": set(),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    """``assistant.server.app`` → ``server``; ``assistant`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, module: str) -> list[tuple[str, bool]]:
    """(imported assistant module, at module level?) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    is_package = path.name == "__init__.py"
    out: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
            names += [f"{names[0]}.{a.name}" for a in node.names]
        for name in names:
            if name == "assistant" or name.startswith("assistant."):
                out.append((name, id(node) in top_level))
    return out


def _graph() -> dict[str, list[tuple[str, bool]]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, list[tuple[str, bool]]] = {}
    for module, path in modules.items():
        edges = []
        for target, top in _imports(path, module):
            while target not in modules and "." in target:  # `from pkg.mod import name` → pkg.mod
                target = target.rsplit(".", 1)[0]
            # A package's own __init__ runs before any of its modules anyway: ``from pkg import sub`` inside
            # pkg is an arrow to ``pkg.sub``, not back up to ``pkg``.
            if target in modules and target != module and not module.startswith(target + "."):
                edges.append((target, top))
        graph[module] = edges
    return graph


def test_imports_only_point_down_the_layers() -> None:
    bad = []
    for module, edges in _graph().items():
        src = _part(module)
        assert src in ALLOWED, f"{module}: part {src!r} is not on the map (add it to ALLOWED and the docs)"
        for target, _ in edges:
            dst = _part(target)
            if dst != src and dst != "__init__" and dst not in ALLOWED[src]:
                bad.append(f"{module} → {target}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(set(bad)))


def test_the_package_never_imports_the_lab() -> None:
    """The lab (``lab/`` at the repository root: the team's studies) uses the product; the product never uses the lab,
    lazily or not, so a wheel of ``assistant`` runs without it."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.relative_to(PACKAGE.parent)}: {n}" for n in names if n == "lab" or n.startswith("lab.")]
    assert not bad, "the package imports the lab:\n" + "\n".join(bad)


def test_the_lab_is_not_shipped() -> None:
    """The wheel's packages are ``assistant*`` only: the lab runs from a checkout (``python -m lab``)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["assistant*"]
    assert "matplotlib" not in " ".join(project["project"]["dependencies"])


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return groups


# Circles being taken apart (issue 33): each entry names the work that removes it. Do not add to this list.
KNOWN_CIRCLES: list[list[str]] = []


def test_no_import_cycle() -> None:
    """No circle between modules, lazy imports included: a lazy import only hides a circle until it runs."""
    graph = {m: sorted({t for t, _ in edges}) for m, edges in _graph().items()}
    circles = [c for c in _circles(graph) if c not in KNOWN_CIRCLES]
    assert not circles, "import circles:\n" + "\n".join(" ↔ ".join(c) for c in circles)


def test_the_circle_finder_finds_lazy_circles() -> None:
    assert _circles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _circles({"a": ["b"], "b": []}) == []


# Inside ``server/``: each product is a room of its own. The TTS API and the dispatcher use only the shared floor,
# never the voice session's modules (so the TTS API runs without aiortc and the dispatcher without the engines).
# The Realtime API is the voice session under another protocol: it uses the voice room, and the TTS API's voice
# names (so ``voice`` means what it means there). A phone call is a peerless voice session too: telephony uses the
# voice room, and so does SIP (a call straight from a trunk or PBX). ``app`` assembles the rooms into one gateway.
SHARED_SERVER = {"http", "front", "limits", "metrics", "services", "routes", "openapi", "openai_front", "tls", "local",
                 "keys"}
ASSEMBLY = {"app"}
PRODUCT_ALLOWED = {
    "voice": SHARED_SERVER,
    "tts_api": SHARED_SERVER,
    "dispatch": {"http", "front", "limits", "routes", "openapi", "openai_front", "tls", "keys"},
    "realtime": SHARED_SERVER | {"voice", "tts_api"},
    "telephony": SHARED_SERVER | {"voice"},
    "sip": SHARED_SERVER | {"voice"},
}
MAX_SERVER_TOP = 12  # modules at the top of server/ (the shared floor and the assembly), __init__ aside


def _server_room(module: str) -> str | None:
    """``assistant.server.tts_api.routes`` → ``tts_api``; ``assistant.server.http`` → ``http``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "server" else None


def test_server_products_do_not_import_each_other_beyond_the_map() -> None:
    bad = []
    for module, edges in _graph().items():
        room = _server_room(module)
        if room not in PRODUCT_ALLOWED:
            continue
        for target, _ in edges:
            other = _server_room(target)
            if other is not None and other != room and other not in PRODUCT_ALLOWED[room]:
                bad.append(f"{module} → {target}")
            # telemetry: the dispatcher's own span (its modules reach the engines' base types, no engine library)
            if room == "dispatch" and _part(target) not in ("server", "config", "body", "telemetry", "__init__"):
                bad.append(f"{module} → {target} (the dispatcher needs no engines)")
    assert not bad, "a product room imports what it must not:\n" + "\n".join(sorted(set(bad)))


def test_shared_server_pieces_import_no_product() -> None:
    """The shared pieces are the floor every room stands on: they import no room (``services`` holds the engines)."""
    bad = []
    for module, edges in _graph().items():
        if _server_room(module) not in SHARED_SERVER:
            continue
        for target, _ in edges:
            other = _server_room(target)
            if other is not None and other not in SHARED_SERVER:
                bad.append(f"{module} → {target}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_server_top_is_the_floor_and_the_rooms() -> None:
    """Only the shared floor and the assembly sit at the top of ``server/``; everything else is in a room."""
    server = PACKAGE / "server"
    top = {p.stem for p in server.glob("*.py")} - {"__init__"}
    rooms = {p.name for p in server.iterdir() if (p / "__init__.py").exists()}
    assert top <= SHARED_SERVER | ASSEMBLY, f"not on the map: {sorted(top - SHARED_SERVER - ASSEMBLY)}"
    assert len(top) <= MAX_SERVER_TOP, sorted(top)
    assert rooms <= set(PRODUCT_ALLOWED), f"rooms not on the map: {sorted(rooms - set(PRODUCT_ALLOWED))}"
