"""The package's import graph: no cycle, and imports go down the layers.

Every `rljax` module is parsed, its imports of other `rljax` modules collected (module
level and inside functions; imports under `if TYPE_CHECKING:` do not run and are left
out). Three rules:

- no cycle between modules: every strongly connected component is one module;
- no cycle between packages: the same graph collapsed to `rljax.<package>` (a top-level
  module such as `rljax.runs` is its own node, and so is `rljax` itself);
- the packages form the layers `LAYERS` declares, bottom first: a module imports only
  from its own package and from packages below it.

The order follows the module map of docs/design.md: foundations (no model, no data), the
math of `algos/` (pure functions; the decoder uses its log-probs, so it sits below
`models/` although advantages run late in a step), the decoder, data, the sampler, the
agent loop that drives it, rewards and the evaluation metrics built on them, the run
scaffold, the supervised train step and loop, the RL orchestration that uses all of them,
and on top the TPU compile, the benchmarks, the commands and the entry point. Which loop
a config runs is decided in `commands/` (`rljax.commands.run_kinds`), so the loops and
the run scaffold import neither each other's configs nor anything above them.

Last, in a fresh interpreter: importing `rljax.agent` (or `rljax.agent.config`, which the
RL config imports) loads neither the agent loop nor the tools' sandbox, and the package's
names still come from their modules on first use.
"""

import ast
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "rljax")

# The layers, bottom first (module docstring). A module of one may import only its own
# package and those listed before it.
LAYERS: tuple[str, ...] = (
    # foundations
    "rljax",  # the package root: its version
    "rljax.xla_flags",  # XLA flags set before JAX starts
    "rljax.lazy",  # a package's names imported on first use
    "rljax.config",  # typed configs, YAML and overrides
    "rljax.parallel",  # the mesh and sharding rules
    "rljax.distributed",  # multi-process start, process 0
    "rljax.hostsync",  # host data shared by every process
    "rljax.checkpoint",  # orbax checkpoints, resume
    "rljax.tracking",  # metrics writers
    "rljax.metrics",  # how step metrics combine
    "rljax.memory",  # peak memory, the host's free memory, the low-memory watch
    # what a step is made of, in data-flow order
    "rljax.algos",  # losses, advantages, log-probs: pure math
    "rljax.models",  # the decoder, HF weights, LoRA
    "rljax.data",  # files, synthetic tasks, tokenizer, batches
    "rljax.rollout",  # the sampler
    "rljax.agent",  # multi-turn episodes on a sampler, tools
    "rljax.rewards",  # scorers, reward model, verifier
    "rljax.evaluation",  # pass@k, majority voting, validation metrics
    # runs
    "rljax.runs",  # the run scaffold: folder, checkpoints, resume, tracker
    "rljax.train",  # the train step and the supervised loop
    "rljax.rl",  # the RL trainer
    # tools and the command line
    "rljax.tpu",  # every program of a run compiled for a TPU slice
    "rljax.bench",  # benchmarks
    "rljax.commands",  # one module per `rljax` command
    "rljax.cli",  # the entry point
)


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path[:-3], os.path.dirname(ROOT)).replace(os.sep, ".")
                out[module.removesuffix(".__init__")] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[module].update(n for n in names if n in modules and n != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def package_of(module: str) -> str:
    """`rljax.<package>` of a module; a top-level module (and `rljax` itself) is its own."""
    return ".".join(module.split(".")[:2])


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, imported package) -> the module imports that make that edge, as
    "importer -> imported" lines; imports inside a package are left out."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, imported in graph.items():
        for other in sorted(imported):
            a, b = package_of(module), package_of(other)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {other}")
    return edges


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for a, b in package_edges(graph):
        out[a].add(b)
    return out


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """Every package import that goes up `layers` (bottom first), one line each naming the
    edge and the module imports that make it."""
    rank = {package: i for i, package in enumerate(layers)}
    return [f"{a} (layer {rank[a]}) imports {b} (layer {rank[b]}): {'; '.join(why)}"
            for (a, b), why in sorted(package_edges(graph).items()) if rank[b] > rank[a]]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """rljax's module import graph, parsed once for the tests below."""
    return import_graph()


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_packages_collapse_and_an_upward_import_is_named_with_its_module():
    assert [package_of(m) for m in ("rljax", "rljax.runs", "rljax.rl", "rljax.rl.config", "rljax.agent.tools.base")] \
        == ["rljax", "rljax.runs", "rljax.rl", "rljax.rl", "rljax.agent"]
    toy = {"rljax.data.a": {"rljax.data.b", "rljax.agent.tools.c"}, "rljax.data.b": set(),
           "rljax.agent.tools.c": {"rljax.data.b"}, "rljax.agent": set()}
    assert package_graph(toy) == {"rljax.data": {"rljax.agent"}, "rljax.agent": {"rljax.data"}}
    assert cycles(package_graph(toy)) == [["rljax.agent", "rljax.data"]]
    assert upward_imports(toy, ("rljax.data", "rljax.agent")) == [
        "rljax.data (layer 0) imports rljax.agent (layer 1): rljax.data.a -> rljax.agent.tools.c"]
    assert upward_imports(toy, ("rljax.agent", "rljax.data")) == [
        "rljax.agent (layer 0) imports rljax.data (layer 1): rljax.agent.tools.c -> rljax.data.b"]


def test_rljax_has_no_import_cycle(graph):
    assert cycles(graph) == []


def test_rljax_packages_have_no_import_cycle(graph):
    found = cycles(package_graph(graph))
    edges = package_edges(graph)
    assert found == [], "\n".join(f"{a} -> {b}: {'; '.join(edges[a, b])}" for component in found
                                   for a in component for b in component if (a, b) in edges)


def test_every_package_has_its_layer(graph):
    assert sorted(package_graph(graph)) == sorted(LAYERS)


def test_imports_go_down_the_layers(graph):
    assert upward_imports(graph, LAYERS) == []


def test_importing_the_agent_package_loads_neither_the_loop_nor_the_sandbox():
    code = ("import json, sys, rljax.agent, rljax.agent.config; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rljax.agent'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "rljax.agent.config" in loaded
    heavy = {"rljax.agent.loop", "rljax.agent.tools", "rljax.agent.tools.registry", "rljax.agent.tools.python_sandbox",
             "rljax.agent.tools.os_sandbox", "rljax.agent.tools.sandbox_preamble", "rljax.agent.tools.sandbox_fusion"}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_the_agent_package_names_are_its_modules_own():
    import importlib

    import rljax.agent
    from rljax.agent import AgentLoop

    assert AgentLoop is importlib.import_module("rljax.agent.loop").AgentLoop
    for name in rljax.agent.__all__:
        value = getattr(rljax.agent, name)
        assert value.__module__.startswith("rljax.agent.") and getattr(sys.modules[value.__module__], name) is value
    assert set(rljax.agent.__all__) <= set(dir(rljax.agent))
    with pytest.raises(AttributeError, match="has no attribute 'Loop'"):
        rljax.agent.Loop  # noqa: B018


def test_the_tool_registry_imports_a_builtin_only_when_it_is_built():
    code = ("import json, sys; from rljax.agent.tools import load_tools; "
            "before = sorted(m for m in sys.modules if m.startswith('rljax.agent.tools')); "
            "tools = load_tools([{'name': 'calculator'}]); "
            "after = sorted(m for m in sys.modules if m.startswith('rljax.agent.tools')); "
            "print(json.dumps([before, after, sorted(tools)]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after, names = json.loads(done.stdout.strip().splitlines()[-1])
    assert "rljax.agent.tools.python_sandbox" not in before and "rljax.agent.tools.calculator" not in before
    assert "rljax.agent.tools.calculator" in after and "rljax.agent.tools.os_sandbox" not in after
    assert names == ["calculator"]
