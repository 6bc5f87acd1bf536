"""libc4d.so against NVIDIA's real libnccl.so.2 (the nvidia-nccl-cu12 wheel), without a GPU.

1. tests/native/nccl_calls.c, compiled here against the wheel's nccl.h, calls the real library
   as an application would on a machine with no GPU (queries, inits that fail, collectives and
   p2p with bad arguments, the *Config variants, groups nested, unbalanced and simulated) and
   prints each return code with ncclGetErrorString and ncclGetLastError. With the shim
   preloaded the output must be the same byte for byte, nothing may crash, and stderr may carry
   only the shim's documented lines (SHIM_LINES), exactly.
2. The real library's exported nccl* functions against libc4d.so's: every one the shim does not
   hook is named in UNHOOKED with the reason; every hooked prototype is compiled against the
   real one.

These need the optional extra `real-nccl` (pyproject.toml; CI installs it):
``pip install -e '.[dev,real-nccl]'``. Without it they are skipped, saying so.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c4d.record import schema
from tests.test_shim import Master, base_env, wait_records

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _wheel_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


NCCL = _wheel_dir("nvidia.nccl")  # .../site-packages/nvidia/nccl: lib/libnccl.so.2, include/nccl.h
CUDART = _wheel_dir("nvidia.cuda_runtime")  # lib/libcudart.so.12, include/driver_types.h

pytestmark = pytest.mark.skipif(
    NCCL is None or CUDART is None or not (NCCL / "lib" / "libnccl.so.2").is_file(),
    reason="the real NCCL is the optional extra real-nccl: pip install -e '.[dev,real-nccl]' (CI has it)",
)

# What the shim may write to stderr in these runs, line by line and in order (full matches).
# The shim writes nothing else there: every line starts with "c4d: " (native/shim/log.cc).
SUMMARY = (
    r"c4d: rank 0 pid \d+: (\d+) records sent, 0 dropped \(queue full 0, master busy 0, no link 0\)"
    r"(?:, (\d+) delivered|, delivery not known)"
)
# The NCCL the hooks bound, named once at the first hooked call (native/shim/real_nccl.cc).
BOUND = (
    rf"c4d: NCCL 2\.32\.3 bound from {re.escape(str(NCCL / 'lib' / 'libnccl.so.2'))} \(RTLD_NEXT\)"
    if NCCL
    else ""
)
SHIM_LINES = {
    # No CUDA runtime in the process (NCCL links its own statically): said once, at the first
    # communicator init, when the shim starts recording; then the exit summary.
    "plain": [BOUND, r"c4d: no CUDA runtime in this process: ops carry host times only", SUMMARY],
    # libcudart.so.12 linked in, as PyTorch has it: found, nothing to say (its calls all fail here).
    "cudart": [BOUND, SUMMARY],
}

# nccl_calls.c's failing communicator inits, as COMM records the shim sends: every one carries
# NCCL's own result, ncclUnhandledCudaError (1). ncclCommInitAll: one record per device slot
# when it is given an array (two calls of 1 and 2 devices), none without.
INIT_RECORDS = {
    schema.CommEvent.INIT_RANK: 6,
    schema.CommEvent.INIT_RANK_CONFIG: 4,
    schema.CommEvent.INIT_ALL: 3,
    schema.CommEvent.INIT_SCALABLE: 2,
    schema.CommEvent.SPLIT: 2,
}
UNHANDLED_CUDA_ERROR = 1

# NCCL's debug lines: "[date time] host:pid:tid [dev] file:line (fn) NCCL WARN ..."
NCCL_LOG_PREFIX = re.compile(r"^\[[^\]]*\] [^\s:]+:\d+:\d+ ", re.M)


def compiler() -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    assert cc, "no C compiler (cc/gcc): the native build needs one too"
    return cc


@pytest.fixture(scope="session")
def programs(tmp_path_factory) -> dict[str, Path]:
    """nccl_calls.c built against the wheel's nccl.h and linked to its libnccl.so.2; the
    'cudart' build links the wheel's libcudart.so.12 too."""
    assert NCCL and CUDART
    out = {}
    for variant in ("plain", "cudart"):
        exe = tmp_path_factory.mktemp("calls") / f"nccl_calls_{variant}"
        lib = NCCL / "lib"
        cmd = [compiler(), "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"]
        cmd += [f"-I{HERE / 'native' / 'cuda_stub'}", f"-I{NCCL / 'include'}"]
        cmd += [str(HERE / "native" / "nccl_calls.c")]
        cmd += ["-o", str(exe), f"-L{lib}", "-l:libnccl.so.2", f"-Wl,-rpath,{lib}"]
        if variant == "cudart":
            rt = CUDART / "lib"
            cmd += ["-DWITH_CUDART", f"-L{rt}", "-l:libcudart.so.12", f"-Wl,-rpath,{rt}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        out[variant] = exe
    return out


@pytest.fixture(params=["plain", "cudart"])
def calls(request, programs) -> tuple[str, Path]:
    return request.param, programs[request.param]


def run(exe: Path, lib: Path | None, master: Master, **extra: str) -> subprocess.CompletedProcess:
    env = base_env(lib, C4D_MASTER_ADDR=master.endpoint, RANK="0", NCCL_DEBUG="WARN", **extra)
    env.pop("NCCL_PROFILER_PLUGIN", None)
    return subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120)


def normalized(stdout: str) -> str:
    return NCCL_LOG_PREFIX.sub("[time] host:pid:tid ", stdout)


def test_same_results_and_last_errors_with_and_without_the_shim(calls, libc4d, master):
    variant, exe = calls
    ref = run(exe, None, master)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert ref.stderr == ""  # NCCL writes its WARN lines to stdout
    # The program did meet NCCL's errors, so the comparison below means something.
    assert "rc=1 (unhandled cuda error" in ref.stdout and "comm argument is NULL" in ref.stdout
    assert "ncclGroupEnd: not in a group call." in ref.stdout and "NCCL WARN" in ref.stdout
    if variant == "cudart":
        assert re.search(r"cudaGetDeviceCount: [1-9]\d*, ", ref.stdout), ref.stdout  # no driver: an error

    on = run(exe, libc4d, master)
    assert on.returncode == 0, on.stdout + on.stderr
    assert normalized(on.stdout) == normalized(ref.stdout)
    # Only the shim's own lines, its documented ones among them (the exact list: the test below).
    lines = on.stderr.splitlines()
    assert all(line.startswith("c4d: ") for line in lines), on.stderr
    assert all(any(re.fullmatch(w, x) for x in lines) for w in SHIM_LINES[variant]), on.stderr

    # The shim did record: this process registered and every failed init was reported with
    # NCCL's own result code.
    wait_records(master, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL")
    recs = master.records()
    assert len(recs[schema.Kind.REGISTER]) >= 1 and len(recs[schema.Kind.OP]) == 0
    comm = recs[schema.Kind.COMM]
    assert (comm["result"] == UNHANDLED_CUDA_ERROR).all(), comm["result"]
    got = {schema.CommEvent(int(e)): int((comm["event"] == e).sum()) for e in set(comm["event"].tolist())}
    assert got == INIT_RECORDS

    off = run(exe, libc4d, master, C4D_ENABLE="0")
    assert off.returncode == 0, off.stdout + off.stderr
    assert normalized(off.stdout) == normalized(ref.stdout) and off.stderr == ""


@pytest.mark.parametrize("variant", ["plain", "cudart"])
def test_shim_stderr_is_exactly_its_documented_lines(programs, variant, libc4d):
    """Run after run (8, each against a fresh master that receives everything): stderr is
    SHIM_LINES exactly, and a summary that counts deliveries counts what the master received.
    (Short-lived processes claimed "nothing was delivered" until main's 0e699b2.)"""
    exe = programs[variant]
    for _ in range(8):
        m = Master()
        try:
            p = run(exe, libc4d, m)
            assert p.returncode == 0, p.stderr
            wait_records(
                m, lambda r: (r[schema.Kind.HEARTBEAT]["hb_flags"] & schema.HBF_FINAL).any(), "FINAL"
            )
            received = sum(len(v) for v in m.records().values())
        finally:
            m.close()
        lines, want = p.stderr.splitlines(), SHIM_LINES[variant]
        exact = len(lines) == len(want) and all(re.fullmatch(w, x) for w, x in zip(want, lines, strict=True))
        assert exact, p.stderr
        sent, delivered = re.fullmatch(SUMMARY, lines[-1]).groups()  # type: ignore[union-attr]
        assert int(sent) == received and delivered in (None, sent), (p.stderr, received)


def test_cuda_stub_matches_the_wheels_cuda_types():
    """tests/native/cuda_stub/cuda_runtime.h stands in for the wheel's (which needs nvcc's
    headers): its typedefs are the CUDA runtime's own."""
    assert CUDART
    real = (CUDART / "include" / "driver_types.h").read_text()
    real = re.sub(r"\s+", " ", real.replace("__device_builtin__", ""))
    stub = (HERE / "native" / "cuda_stub" / "cuda_runtime.h").read_text()
    typedefs = re.findall(r"typedef struct \w+ \*\w+;", stub)
    assert len(typedefs) == 2
    for t in typedefs:
        assert t in real, t


# ----------------------------------------------------------- exported functions

R = {
    "query": "pure query: returns a value, no work to time",
    "shim-calls": "pure query the shim itself calls on the agent thread (comm shape); nothing to time",
    "setup": "setup/teardown of resources (memory, buffers, windows, reduction ops), no communication",
    "device": "device-side API (kernel-initiated communication): runs in the application's kernels, "
    "the host sees no operation to time",
    "params": "NCCL's parameter/config API: reads or binds settings, no communication",
    "debug": "debug logging control",
}

# Every public nccl* function of libnccl.so.2 (2.32.3) that libc4d.so does not hook, and why.
UNHOOKED = {
    "ncclGetVersion": R["shim-calls"],
    "ncclGetErrorString": R["query"],
    "ncclGetLastError": R["query"],
    "ncclGetUniqueId": R["query"] + " (makes an id; the shim hashes the one init receives)",
    "ncclCommCount": R["shim-calls"],
    "ncclCommUserRank": R["shim-calls"],
    "ncclCommCuDevice": R["shim-calls"],
    "ncclCommGetUniqueId": R["query"] + " (an id for ncclCommGrow)",
    "ncclCommMemStats": R["query"],
    "ncclCommQueryProperties": R["query"],
    "ncclWinGetUserPtr": R["query"],
    "ncclCommRegister": R["setup"],
    "ncclCommDeregister": R["setup"],
    "ncclCommWindowRegister": R["setup"],
    "ncclCommWindowDeregister": R["setup"],
    "ncclMemAlloc": R["setup"],
    "ncclMemFree": R["setup"],
    "ncclRedOpCreatePreMulSum": R["setup"],
    "ncclRedOpDestroy": R["setup"],
    "ncclSetEncryption": R["setup"],
    "ncclDevCommCreate": R["device"],
    "ncclDevCommDestroy": R["device"],
    "ncclGetCftDeviceLeInfo": R["device"],
    "ncclGetLsaDevicePointer": R["device"],
    "ncclGetLsaMultimemDevicePointer": R["device"],
    "ncclGetMultimemDeviceLeInfo": R["device"],
    "ncclGetMultimemDevicePointer": R["device"],
    "ncclGetPeerDeviceLeInfo": R["device"],
    "ncclGetPeerDevicePointer": R["device"],
    "ncclGinBarrierCreateRequirement": R["device"],
    "ncclGinInboxA2ACreateRequirement": R["device"],
    "ncclGinOutboxCreateRequirement": R["device"],
    "ncclLLA2ACalcSlots": R["device"],
    "ncclLLA2ACreateRequirement": R["device"],
    "ncclLsaBarrierCreateRequirement": R["device"],
    "ncclTeamCft": R["device"],
    "ncclTeamCftMultimem": R["device"],
    "ncclTeamLsa": R["device"],
    "ncclTeamRail": R["device"],
    "ncclTeamRankToLsa": R["device"],
    "ncclTeamRankToWorld": R["device"],
    "ncclTeamWorld": R["device"],
    "ncclParamBind": R["params"],
    "ncclParamDumpAll": R["params"],
    "ncclParamGet": R["params"],
    "ncclParamGetAllParameterKeys": R["params"],
    "ncclParamGetI8": R["params"],
    "ncclParamGetI16": R["params"],
    "ncclParamGetI32": R["params"],
    "ncclParamGetI64": R["params"],
    "ncclParamGetU8": R["params"],
    "ncclParamGetU16": R["params"],
    "ncclParamGetU32": R["params"],
    "ncclParamGetU64": R["params"],
    "ncclParamGetParameter": R["params"],
    "ncclParamGetStr": R["params"],
    "ncclResetDebugInit": R["debug"],
    "ncclResetDebugInitInternal": R["debug"] + " (internal helper, in no header)",
}


def defined_functions(lib: Path, prefix: str) -> dict[str, str]:
    """name -> nm type letter of the defined dynamic function symbols starting with prefix."""
    nm = shutil.which("nm")
    assert nm, "binutils' nm is missing (the native build needs binutils)"
    cmd = [nm, "-D", "--defined-only", str(lib)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TWi" and parts[2].startswith(prefix):
            syms[parts[2]] = parts[1]
    return syms


def test_every_unhooked_nccl_function_is_named_with_a_reason(libc4d):
    assert NCCL
    real = set(defined_functions(NCCL / "lib" / "libnccl.so.2", "nccl"))
    hooked = set(defined_functions(libc4d, "nccl"))
    assert len(real) >= 90 and len(hooked) >= 30
    assert hooked <= real, f"libc4d.so exports nccl functions NCCL 2.32.3 lacks: {sorted(hooked - real)}"
    new = sorted(real - hooked - set(UNHOOKED))
    assert not new, f"NCCL functions neither hooked nor in UNHOOKED (classify them): {new}"
    stale = sorted(set(UNHOOKED) & hooked)
    assert not stale, f"hooked now: remove from UNHOOKED {stale}"
    gone = sorted(set(UNHOOKED) - real)
    assert not gone, f"not in this NCCL: remove from UNHOOKED {gone}"
    assert all(len(why) > 20 for why in UNHOOKED.values())
    # Every real function exists twice (src/include/nccl.h.in): ncclX weak, pncclX strong.
    strong = set(defined_functions(NCCL / "lib" / "libnccl.so.2", "pnccl"))
    assert {f"p{n}" for n in hooked} <= strong


HOOK_DEF = re.compile(r"C4D_HOOK\s+([\w\s\*]+?)\s*\b(nccl\w+)\s*\(([^)]*)\)\s*\{", re.S)
REAL_DECL = re.compile(
    r"(?:^|\n)\s*(?:ncclResult_t|const\s+char\s*\*|void|int)\s+(nccl\w+)\s*\(([^;{)]*)\)\s*;"
)


def hook_prototypes() -> dict[str, tuple[str, str]]:
    """name -> (return type, parameter list) of every C4D_HOOK definition in native/shim/."""
    out: dict[str, tuple[str, str]] = {}
    for src in sorted((REPO / "native" / "shim").glob("*.cc")):
        for ret, name, params in HOOK_DEF.findall(src.read_text()):
            assert name not in out, f"{name} defined twice"
            out[name] = (" ".join(ret.split()), " ".join(params.split()))
    return out


def n_params(params: str) -> int:
    params = params.strip()
    return 0 if params in ("", "void") else params.count(",") + 1


def real_declarations() -> dict[str, str]:
    """name -> parameter list of every function the wheel's nccl.h declares."""
    assert NCCL
    header = re.sub(r"/\*.*?\*/|//[^\n]*", "", (NCCL / "include" / "nccl.h").read_text(), flags=re.S)
    return dict(REAL_DECL.findall(header))


def assert_same_prototypes(ours: dict[str, tuple[str, str]], tmp_path: Path, what: str) -> None:
    """Same parameter count as nccl.h, and a C++ compiler takes &ncclX for a pointer of our
    exact type (C++: no implicit conversion between function pointer types)."""
    assert NCCL
    real = real_declarations()
    for name, (_, params) in ours.items():
        assert name in real, f"{name} ({what}) is not declared in the wheel's nccl.h"
        assert n_params(params) == n_params(real[name]), (what, name, params, real[name])
    lines = ["#include <nccl.h>"]
    for name, (ret, params) in sorted(ours.items()):
        lines.append(f"{ret} (*const check_{name})({params}) = &{name};")
    src = tmp_path / "prototypes.cc"
    src.write_text("\n".join(lines) + "\nint main() { return 0; }\n")
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    assert cxx, "no C++ compiler"
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Werror", f"-I{HERE / 'native' / 'cuda_stub'}"]
    p = subprocess.run([*cmd, f"-I{NCCL / 'include'}", str(src)], capture_output=True, text=True)
    assert p.returncode == 0, f"{what}:\n{p.stderr[-4000:]}"


def test_every_hooked_prototype_is_the_real_one(libc4d, tmp_path):
    """Each hook's parameter list, as written in native/shim/*.cc, against the wheel's nccl.h."""
    hooks = hook_prototypes()
    hooked = set(defined_functions(libc4d, "nccl"))
    assert set(hooks) == hooked, f"a C4D_HOOK not exported, or an export without one: {set(hooks) ^ hooked}"
    assert_same_prototypes(hooks, tmp_path, "native/shim hooks")


def test_our_nccl_declarations_are_the_real_ones(tmp_path):
    """native/include/c4d/nccl_abi.h: what the shim calls NCCL with (hooked or not: it calls
    ncclCommCount, ncclCommUserRank, ncclCommCuDevice, ncclGetVersion itself) and what
    simnccl implements."""
    text = re.sub(
        r"/\*.*?\*/|//[^\n]*",
        "",
        (REPO / "native" / "include" / "c4d" / "nccl_abi.h").read_text(),
        flags=re.S,
    )
    decl = re.compile(r"(ncclResult_t|const\s+char\s*\*)\s*(nccl\w+)\s*\(([^;{)]*)\)\s*;")
    ours = {
        name: (" ".join(ret.split()), " ".join(params.split())) for ret, name, params in decl.findall(text)
    }
    assert len(ours) >= 37 and {
        "ncclCommCount",
        "ncclCommUserRank",
        "ncclCommCuDevice",
        "ncclGetVersion",
    } <= set(ours)
    assert_same_prototypes(ours, tmp_path, "native/include/c4d/nccl_abi.h")


def test_gpu_validate_config_struct_is_ncclConfig_t(tmp_path):
    """scripts/gpu_validate_worker.py builds an ncclConfig_t in ctypes (non-blocking comms on
    simnccl): its layout and initializer are nccl.h's."""
    assert NCCL
    path = REPO / "scripts" / "gpu_validate_worker.py"
    spec = importlib.util.spec_from_file_location("gpu_validate_worker", path)
    assert spec and spec.loader
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    fields = [name for name, _ in worker.NcclConfig._fields_]
    body = "".join(f'  printf("{f} %zu\\n", offsetof(ncclConfig_t, {f}));\n' for f in fields)
    src = tmp_path / "config.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <nccl.h>\nint main(void) {\n"
        '  printf("SIZEOF %zu\\n", sizeof(ncclConfig_t));\n'
        '  printf("MAGIC %u\\n", (unsigned)NCCL_API_MAGIC);\n'
        '  printf("VERSION %d\\n", NCCL_VERSION_CODE);\n'
        '  printf("UNDEF %d\\n", NCCL_CONFIG_UNDEF_INT);\n' + body + "  return 0;\n}\n"
    )
    exe = tmp_path / "config"
    cmd = [compiler(), f"-I{HERE / 'native' / 'cuda_stub'}", f"-I{NCCL / 'include'}", str(src)]
    subprocess.run([*cmd, "-o", str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    real = {k: int(v) for k, v in (line.split() for line in out.splitlines())}

    assert real["SIZEOF"] == ctypes.sizeof(worker.NcclConfig)
    for f in fields:
        assert real[f] == getattr(worker.NcclConfig, f).offset, f
    c = worker.nccl_config(0)
    assert (c.size, c.magic, c.version, c.blocking) == (real["SIZEOF"], real["MAGIC"], real["VERSION"], 0)
    assert c.minCTAs == real["UNDEF"] and c.netName is None
