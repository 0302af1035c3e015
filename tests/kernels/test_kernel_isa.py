"""The AVX2 path's object code holds no instruction an AVX2-only CPU (Zen 3) lacks.

Each path's functions are compiled for their own instruction set only (csrc/qtiles_avx2.h), but
a target attribute that enables one feature too many lets the compiler place its instructions
anywhere in that function, and nothing fails until such a CPU runs it (SIGILL). So this reads the
built library's disassembly (binutils' objdump): every function of Ember's own code, except those
of the AVX-512 path (names with "512") and of the AVX-VNNI path (ember::avxvnni), must hold no
EVEX-encoded instruction (AVX-512: the 0x62 prefix, zmm and mask registers, xmm16-31) and no VNNI
dot product (vpdp*, VEX or EVEX). The AVX-VNNI path may use the VEX VNNI ops but no EVEX either.
A control: the library does hold both kinds, where they belong, so the reading is not blind.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from engine.kernel_library import library_path

if shutil.which("objdump") is None or not library_path().is_file():
    pytest.skip("needs binutils' objdump and Ember's built kernels", allow_module_level=True)

HEADER = re.compile(r"^[0-9a-f]+ <(.+)>:$")
INSN = re.compile(r"^\s*[0-9a-f]+:\t([0-9a-f ]+)\t(.*)$")
# legacy prefixes that may stand before a VEX/EVEX escape byte (segments, address size)
PREFIXES = {0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x67}


def evex(raw: str) -> bool:
    """In 64-bit mode a first opcode byte 0x62 is the EVEX escape (BOUND does not exist there)."""
    for b in (int(x, 16) for x in raw.split()):
        if b not in PREFIXES:
            return b == 0x62
    return False


def vnni(asm: str) -> bool:
    return re.search(r"\bvpdp(bu|ws)sds?\b", asm) is not None


def functions() -> dict[str, list[tuple[str, str]]]:
    """Ember's functions (demangled names in namespace ember) -> their (raw bytes, asm) lines."""
    out = subprocess.run(["objdump", "-d", "-C", "-w", "--section=.text", str(library_path())],
                         capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[tuple[str, str]]] = {}
    lines: list[tuple[str, str]] | None = None
    for line in out.splitlines():
        if m := HEADER.match(line):
            name = m.group(1)
            lines = funcs.setdefault(name, []) if "ember::" in name else None
        elif lines is not None and (m := INSN.match(line)):
            lines.append((m.group(1), m.group(2)))
    return funcs


FUNCS = functions()


def kind(name: str) -> str:
    return "avx512" if "512" in name else "avx_vnni" if "ember::avxvnni::" in name else "avx2"


def offenders(name: str, lines, allow_vnni: bool) -> list[str]:
    return [f"{name}: {asm}" for raw, asm in lines if evex(raw) or (vnni(asm) and not allow_vnni)]


def test_the_avx2_path_and_shared_code_hold_only_avx2_fma_f16c():
    plain = {n: ls for n, ls in FUNCS.items() if kind(n) == "avx2"}
    assert any("ember::avx2::w4_256" in n for n in plain) and any("ember::avx2::w6_256" in n for n in plain)
    bad = [o for n, ls in plain.items() for o in offenders(n, ls, allow_vnni=False)]
    assert not bad, "instructions an AVX2-only CPU lacks:\n" + "\n".join(bad[:20])


def test_the_avx_vnni_path_holds_no_avx512():
    vex = {n: ls for n, ls in FUNCS.items() if kind(n) == "avx_vnni"}
    assert vex
    bad = [o for n, ls in vex.items() for o in offenders(n, ls, allow_vnni=True)]
    assert not bad, "AVX-512 instructions in the AVX-VNNI path:\n" + "\n".join(bad[:20])
    # the control: its kernels do use the VEX dot product, so the reading sees what it checks
    assert any(vnni(asm) and not evex(raw) for ls in vex.values() for raw, asm in ls)


def test_the_reading_sees_avx512_where_it_is():
    wide = [ls for n, ls in FUNCS.items() if kind(n) == "avx512"]
    assert any(evex(raw) for ls in wide for raw, _ in ls)
    assert any(vnni(asm) and evex(raw) for ls in wide for raw, asm in ls)
