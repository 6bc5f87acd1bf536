"""GPU count and type, CUDA, PyTorch and NCCL versions.

Each comes from torch where it is installed; without torch, GPUs come from ``nvidia-smi`` and
the NCCL version from ``ncclGetVersion`` in whatever ``libnccl.so.2`` the loader finds (the
library a job on this node would load). Anything unknown is "not available", never an error.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

from c4d.check.result import CheckResult, Status

NA = "not available"


def _nccl_code_to_str(code: int) -> str:
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_version_from_library() -> tuple[str | None, str]:
    try:
        lib = ctypes.CDLL("libnccl.so.2")
        code = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return None, "ncclGetVersion failed"
        return _nccl_code_to_str(code.value), "libnccl.so.2"
    except (OSError, AttributeError) as e:
        return None, f"libnccl.so.2: {e}"


def gpus(torch) -> tuple[list[str], str]:
    """Names of the GPUs and where the answer came from."""
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "torch"
        except Exception:  # a driver problem shows up here; fall through to nvidia-smi
            pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            if out.returncode == 0:
                return [s.strip() for s in out.stdout.splitlines() if s.strip()], "nvidia-smi"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return [], "torch" if torch is not None else "nvidia-smi absent"


def _matches(value: str, expect: str) -> bool:
    return value == expect or value.startswith((expect + ".", expect + "+"))


def version_check(name: str, value: str | None, expect: str | None, source: str) -> CheckResult:
    shown = value or NA
    if expect is None:
        status = Status.SUCCEED if value else Status.SKIPPED
        return CheckResult(
            name, "", status, shown, None, f"{value} from {source}" if value else f"{NA}: {source}"
        )
    ok = value is not None and _matches(value, expect)
    detail = f"{shown}, expected {expect}" + (f", from {source}" if value else f"; {source}")
    return CheckResult(name, "", Status.SUCCEED if ok else Status.FAILED, shown, expect, detail)


def env_checks(
    torch,
    torch_reason: str | None,
    expect_gpus: int | None = None,
    expect_cuda: str | None = None,
    expect_torch: str | None = None,
    expect_nccl: str | None = None,
) -> list[CheckResult]:
    names, source = gpus(torch)
    count = len(names)
    kinds = sorted(set(names))
    value = {"count": count, "types": kinds, "source": source}
    desc = f"{count} x {', '.join(kinds)}" if count else "no GPU found"
    if expect_gpus is None:
        gpu = CheckResult("GPUTest", "", Status.SUCCEED if count else Status.SKIPPED, value, None, desc)
    else:
        ok = count == expect_gpus
        gpu = CheckResult(
            "GPUTest",
            "",
            Status.SUCCEED if ok else Status.FAILED,
            value,
            expect_gpus,
            f"{desc}, expected {expect_gpus}",
        )
    out = [gpu]
    if torch is None:
        out.append(version_check("CUDAVersion", None, expect_cuda, torch_reason or NA))
        out.append(version_check("PyTorchVersion", None, expect_torch, torch_reason or NA))
        v, src = nccl_version_from_library()
        out.append(version_check("NCCLVersion", v, expect_nccl, src))
        return out
    out.append(version_check("CUDAVersion", torch.version.cuda, expect_cuda, "torch.version.cuda"))
    out.append(version_check("PyTorchVersion", torch.__version__, expect_torch, "torch"))
    v, src = None, "torch built without NCCL"
    try:
        if torch.cuda.is_available():
            nv = torch.cuda.nccl.version()
            v = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else _nccl_code_to_str(int(nv))
            src = "torch.cuda.nccl"
    except Exception as e:
        src = f"torch.cuda.nccl: {e}"
    if v is None:
        lv, lsrc = nccl_version_from_library()
        if lv is not None:
            v, src = lv, lsrc
    out.append(version_check("NCCLVersion", v, expect_nccl, src))
    return out
