"""No code path reaches llama.cpp's extra buffer types by accident (the AMX segfault on Intel Xeons).

The crash cannot be seen on a machine without AMX, so the guard is structural and checked here:

- every module, test, study and script is read (``ast`` for Python, the text for shell scripts); only
  ``assistant/respond/llama/native.py`` may import ``llama_cpp`` or name a call that loads a model;
- in a fresh process, importing that module turns the extra buffer types off for the whole process: the real
  library, loading a Q4_0 model (whose weights an x86 CPU's kernels repack: into ``CPU_REPACK`` buffers on an AMD
  EPYC, into ``AMX`` tiles on a Xeon with AMX) through the high-level ``Llama`` class, keeps them in plain CPU
  buffers, where the library's own default repacks them; ``respond.extra_buffers`` still turns them on,
  deliberately.
"""

from __future__ import annotations

import ast
import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

from assistant.config import RespondConfig
from assistant.respond.llama import default_model_path

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "assistant" / "respond" / "llama" / "native.py"
HERE = Path(__file__).resolve()
ROOTS = ("assistant", "lab", "tests", "scripts", ".ci")

# What loads a model in llama-cpp-python: the high-level class and its wrapper, the low-level loaders, and the
# default parameters they start from.
LOADERS = ("Llama", "LlamaModel", "llama_model_load_from_file", "llama_load_model_from_file",
           "llama_model_load_from_splits", "llama_model_load_from_file_ptr", "llama_model_default_params")
_MODULE = re.compile(r"^llama_cpp(?:\.\w+)*$")  # a module named in a string: import_module, python -m
_IN_TEXT = re.compile(r"\b(?:" + "|".join(LOADERS) + r")\s*\(|\b(?:import|from)\s+llama_cpp\b|-m\s+llama_cpp\b")


def other_ways_in(source: str, name: str) -> list[str]:
    """Where ``source`` (a Python module) reaches llama.cpp other than through ``native.py``."""
    found = []
    tree = ast.parse(source)
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings: never run
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{name}:{line} imports {a.name}" for a in node.names if a.name.split(".")[0] == "llama_cpp"]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "llama_cpp" and not node.level:
                found.append(f"{name}:{line} imports from {node.module}")
            found += [f"{name}:{line} imports {a.name}" for a in node.names if a.name in LOADERS]
        elif isinstance(node, ast.Name) and node.id in LOADERS:
            found.append(f"{name}:{line} names {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in LOADERS:
            found.append(f"{name}:{line} names .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value
            if _MODULE.match(text) or _IN_TEXT.search(text):
                found.append(f"{name}:{line} names llama_cpp in a string ({text[:60]!r})")
    return found


def scripts_ways_in(text: str, name: str) -> list[str]:
    return [f"{name}:{i} {line.strip()[:80]!r}" for i, line in enumerate(text.splitlines(), 1)
            if _IN_TEXT.search(line)]


def sources() -> list[Path]:
    files: list[Path] = []
    for root in ROOTS:
        base = REPO / root
        if base.is_file():
            files.append(base)
        elif base.is_dir():
            files += [p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return [p for p in files if p.resolve() not in (NATIVE, HERE)]


def test_only_native_py_imports_llama_cpp_or_loads_a_model() -> None:
    found: list[str] = []
    scanned = 0
    for path in sources():
        name = str(path.relative_to(REPO))
        if path.suffix == ".py":
            found += other_ways_in(path.read_text(encoding="utf-8"), name)
            scanned += 1
        elif path.suffix in (".sh", "") and path.stat().st_size < 1_000_000:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            found += scripts_ways_in(text, name)
            scanned += 1
    assert scanned > 300  # the whole tree was read
    assert not found, ("llama.cpp reached around assistant/respond/llama/native.py (use its llama_cpp, load_model, "
                       "model_params or open_llama):\n" + "\n".join(found))


def test_the_scan_finds_the_ways_in_that_crashed() -> None:
    """What the suite and the lab did before: each of these is found."""
    before = {
        "the weights test": "from llama_cpp import Llama\nllm = Llama(str(path), n_ctx=512)",
        "the engine": "import llama_cpp\nm = llama_cpp.llama_model_load_from_file(b'x', p)",
        "its parameters": "import llama_cpp.llama_cpp as lib\np = lib.llama_model_default_params()",
        "the deprecated loader": "from assistant.respond.llama.native import llama_cpp\n"
                                 "llama_cpp.llama_load_model_from_file(b'x', p)",
        "bench llm's server": "cmd = [sys.executable, '-m', 'llama_cpp.server', '--model', path]",
        "an import by name": "importlib.import_module('llama_cpp')",
        "a python -c": "subprocess.run([python, '-c', 'import llama_cpp; llama_cpp.Llama(p)'])",
    }
    for what, code in before.items():
        assert other_ways_in(code, what), what
    assert scripts_ways_in("python -m llama_cpp.server --model m.gguf", "run.sh")
    assert not other_ways_in("from assistant.respond.llama.native import open_llama\nllm = open_llama(path)", "ok")


@pytest.fixture(scope="module")
def repacked_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as Q4_0: weights an x86 CPU's extra buffer type takes (CPU_REPACK; AMX, which takes Q4_1 and Q8_0
    too, on a Xeon that has it)."""
    from assistant.respond.llama.native import llama_cpp

    path = tmp_path_factory.mktemp("q4_0") / "smollm2.Q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(default_model_path()).encode(), str(path).encode(), ctypes.byref(params))
    assert rc == 0 and path.is_file()
    return path


def python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (nothing imported yet); its exit, stdout and stderr (llama.cpp's log)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False,
                          cwd=REPO)


# llama.cpp's log line for weights in an extra buffer type: the x86 repacked kernels, or AMX's tiles on a Xeon that
# has them (there the same Q4_0 model goes to AMX, not CPU_REPACK).
REPACKED = ("CPU_REPACK model buffer", "AMX model buffer")


def repacked(log: str) -> bool:
    return any(kind in log for kind in REPACKED)


LOAD = """
import llama_cpp, llama_cpp.llama_cpp as low, llama_cpp._internals as internals
llm = llama_cpp.Llama(model_path={path!r}, n_ctx=64, n_threads=1, verbose=True)
print("defaults", llama_cpp.llama_model_default_params().use_extra_bufts,
      low.llama_model_default_params().use_extra_bufts, internals.LlamaModel.default_params().use_extra_bufts,
      llm.model_params.use_extra_bufts)
llm.close()
"""


@pytest.mark.slow
def test_after_the_import_no_model_in_the_process_is_repacked(repacked_model: Path) -> None:
    """The library's own default repacks the weights (what crashes on AMX); after ``native.py`` is imported, a model
    loaded by anyone, through ``Llama`` here, stays in plain CPU buffers."""
    bare = python(LOAD.format(path=str(repacked_model)))
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert "defaults True True True True" in bare.stdout and repacked(bare.stderr)

    guarded = python("import assistant.respond.llama.native\n" + LOAD.format(path=str(repacked_model)))
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    assert "defaults False False False False" in guarded.stdout
    assert "CPU_Mapped model buffer" in guarded.stderr and not repacked(guarded.stderr)


@pytest.mark.slow
def test_respond_extra_buffers_turns_them_on_for_the_engine_only(repacked_model: Path) -> None:
    """The embedded engine with the default config loads plain buffers; ``respond.extra_buffers = true`` repacks, on
    purpose; and the process default stays off after it."""
    code = f"""
import logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
from pathlib import Path
from assistant.respond.llama.engine import LlamaEngine
from assistant.respond.llama.native import llama_cpp
from assistant.respond.llama import engine as e
e._LOG_LEVELS[2] = logging.WARNING  # llama.cpp's info lines too: the buffers it loads into
for extra in (False, True):
    print("extra", extra, file=sys.stderr, flush=True)
    eng = LlamaEngine(Path({str(repacked_model)!r}), slots=1, context_tokens=64, threads=1, extra_buffers=extra)
    eng.close()
print("default", llama_cpp.llama_model_default_params().use_extra_bufts)
"""
    run = python(code)
    assert run.returncode == 0, run.stderr[-2000:]
    plain, extra = run.stderr.split("extra True", 1)
    assert "CPU_Mapped model buffer" in plain and not repacked(plain)
    assert repacked(extra)
    assert "default False" in run.stdout
    assert RespondConfig().extra_buffers is False


def test_the_end_of_turn_study_loads_its_model_in_plain_buffers() -> None:
    """The lab's end-of-turn language model loads through ``Llama``, by way of ``open_llama``."""
    from lab.eot_llm import EndOfTurnLM

    assert EndOfTurnLM(threads=1).llm.model_params.use_extra_bufts is False
