"""The LLVM CPU target TVM compiles for: detected, validated, and what it demands of a CPU.

Two silent failures shape this module (docs/tvm.md#targets): CLI target strings
("llvm -mcpu=znver5") are gone in TVM 0.27, so targets are JSON dicts; and an unknown or
"native" `mcpu` is accepted when the target is built but compiles *generic* code. So the host
CPU comes from LLVM's own detection and every `mcpu` is checked with `llvm_is_valid_cpu`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from optimize.errors import UsageError, message_line
from optimize.runtimes.tvm import import_tvm
from optimize.system.env import cpu_isa_flags, physical_cores

# LLVM target features -> the /proc/cpuinfo flag that says the CPU executes them. Only
# instruction-set features are listed; LLVM's tuning features ("fast-15bytenop") are not ISA.
LLVM_FEATURE_TO_CPUINFO: dict[str, str] = {
    # x86
    "sse": "sse",
    "sse2": "sse2",
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "sse4a": "sse4a",
    "popcnt": "popcnt",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "lzcnt": "abm",
    "movbe": "movbe",
    "aes": "aes",
    "pclmul": "pclmulqdq",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
    "gfni": "gfni",
    "sha": "sha_ni",
    "adx": "adx",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "avxvnniint8": "avx_vnni_int8",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    # aarch64 (cpuinfo "Features")
    "neon": "asimd",
    "fullfp16": "fphp",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
}

# A portable choice for x86 artifacts: AVX2 + FMA, which every x86 server CPU since ~2015 has.
PORTABLE_X86 = "x86-64-v3"


@dataclass(frozen=True)
class TargetInfo:
    """A validated LLVM CPU target and what running its code requires."""

    target: Any  # tvm.target.Target
    spec: dict[str, Any]  # the JSON dict form (what the manifest stores)
    mcpu: str
    triple: str
    num_cores: int
    isa_requires: tuple[str, ...]  # /proc/cpuinfo flags the generated code may use
    host: bool  # built for the machine we are on

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "mcpu": self.mcpu,
            "triple": self.triple,
            "num_cores": self.num_cores,
            "isa_requires": list(self.isa_requires),
            "host": self.host,
        }

    @property
    def key(self) -> str:
        """A stable string that identifies the code this target produces (for the tuning cache)."""
        return json.dumps(self.spec, sort_keys=True, separators=(",", ":"))


def default_num_cores() -> int:

    return physical_cores()


def _parse_user_target(text: str) -> dict[str, Any]:
    """`--tvm-target` forms: 'host', a CPU name ('x86-64-v3', 'skylake-avx512'), or a JSON dict."""
    value = text.strip()
    if value.startswith("{"):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--tvm-target is not valid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(spec, dict):
            raise UsageError(
                '--tvm-target JSON must be an object, e.g. {"kind": "llvm", "mcpu": "x86-64-v3"}'
            )
        return spec
    if " " in value or value.startswith("-") or value.startswith("llvm"):
        raise UsageError(
            f"--tvm-target {text!r}: TVM 0.27 no longer parses target strings",
            'give a CPU name (e.g. x86-64-v3) or JSON: {"kind": "llvm", "mcpu": "x86-64-v3"}',
        )
    return {"kind": "llvm", "mcpu": value}


def resolve_cpu_target(text: str | None = None, num_cores: int | None = None) -> TargetInfo:
    """The target to build for: the host CPU (text None or 'host') or the one named in `text`.

    Raises UsageError for a CPU LLVM does not know, for "native", and for non-CPU targets.
    """

    tvm = import_tvm()
    from tvm.target import codegen

    system_cpu = str(codegen.llvm_get_system_cpu())
    system_triple = str(codegen.llvm_get_system_triple())
    host = text is None or text.strip() in ("", "host")
    spec: dict[str, Any] = {"kind": "llvm", "mcpu": system_cpu} if host else _parse_user_target(str(text))
    if spec.get("kind", "llvm") != "llvm":
        raise UsageError(f"the TVM stage builds for CPUs only (kind 'llvm'), not {spec.get('kind')!r}")
    spec["kind"] = "llvm"
    mcpu = str(spec.get("mcpu") or "")
    if not mcpu:
        raise UsageError("--tvm-target needs an mcpu (e.g. x86-64-v3)", "without one LLVM emits generic code")
    if mcpu == "native":
        raise UsageError(
            "--tvm-target mcpu 'native' silently compiles generic code in TVM 0.27",
            f"leave --tvm-target out to build for this CPU ({system_cpu}) or name a CPU",
        )
    triple = str(spec.get("mtriple") or system_triple)
    if not codegen.llvm_is_valid_cpu(mcpu, triple):
        raise UsageError(
            f"LLVM does not know the CPU {mcpu!r} for {triple}",
            f"this machine is {system_cpu}; a portable x86 choice is {PORTABLE_X86}",
        )
    if host and system_cpu in ("generic", ""):
        raise UsageError(
            "LLVM could not detect this CPU (it reports 'generic')",
            f"name one with --tvm-target (e.g. {PORTABLE_X86})",
        )
    spec.setdefault("num-cores", int(num_cores or default_num_cores()))
    try:
        target = tvm.target.Target(spec)
    except Exception as exc:  # TVM raises ValueError/TVMError for malformed attributes
        first = message_line(exc)
        raise UsageError(f"TVM rejects the target {json.dumps(spec)}: {first}") from None
    features = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    isa = tuple(sorted({LLVM_FEATURE_TO_CPUINFO[f] for f in features if f in LLVM_FEATURE_TO_CPUINFO}))
    return TargetInfo(
        target=target,
        spec=json.loads(json.dumps(spec)),
        mcpu=mcpu,
        triple=triple,
        num_cores=int(spec["num-cores"]),
        isa_requires=isa,
        host=host or (mcpu == system_cpu and triple == system_triple),
    )


def missing_isa(required: list[str] | tuple[str, ...], have: set[str] | None = None) -> list[str]:
    """Flags in `required` that this CPU (or `have`) lacks."""
    if have is None:
        have = cpu_isa_flags()
    return sorted(set(required) - have)


def host_threads() -> int:
    """Threads a TVM module should use here: TVM_NUM_THREADS when set, else the physical cores."""
    env = os.environ.get("TVM_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return default_num_cores()
