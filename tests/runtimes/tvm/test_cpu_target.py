"""CPU targets for TVM builds (optimize/runtimes/tvm/cpu_target.py)."""

from __future__ import annotations

import pytest

from optimize.errors import UsageError

pytestmark = pytest.mark.tvm


def test_target_detection_and_validation() -> None:
    pytest.importorskip("tvm")
    from optimize.runtimes.tvm.cpu_target import resolve_cpu_target

    host = resolve_cpu_target()
    assert host.host and host.mcpu not in ("generic", "native") and host.spec["kind"] == "llvm"
    assert "sse2" in host.isa_requires or "asimd" in host.isa_requires
    with pytest.raises(UsageError, match="'native' silently compiles generic code"):
        resolve_cpu_target("native")
    with pytest.raises(UsageError, match="does not know the CPU 'znver99'"):
        resolve_cpu_target("znver99")
    with pytest.raises(UsageError, match="no longer parses target strings"):
        resolve_cpu_target("llvm -mcpu=skylake")
    if host.triple.startswith("x86_64"):
        portable = resolve_cpu_target('{"kind": "llvm", "mcpu": "x86-64-v3"}')
        assert {"avx2", "fma"} <= set(portable.isa_requires) and "avx512f" not in portable.isa_requires
