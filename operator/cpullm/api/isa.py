"""CPU flag names: the one spelling a plan uses (lscpu's, as /proc/cpuinfo lists them) and Node Feature Discovery's
cpuid feature names, which a spec may use too (`requiredISA: [AMXBF16]`). Both the spec's reader and the node
labels' reader (core/topology.py) translate through here."""

from __future__ import annotations

import difflib

# NFD's cpuid names whose lscpu spelling is not simply the lower-cased name.
NFD_TO_LSCPU = {
    "AVX512VNNI": "avx512_vnni",
    "AVX512BF16": "avx512_bf16",
    "AVX512FP16": "avx512_fp16",
    "AVX512BITALG": "avx512_bitalg",
    "AVX512VBMI2": "avx512_vbmi2",
    "AVX512VPOPCNTDQ": "avx512_vpopcntdq",
    "AVX512VP2INTERSECT": "avx512_vp2intersect",
    "AVXVNNI": "avx_vnni",
    "AVXVNNIINT8": "avx_vnni_int8",
    "AVXNECONVERT": "avx_ne_convert",
    "AVXIFMA": "avx_ifma",
    "AMXTILE": "amx_tile",
    "AMXBF16": "amx_bf16",
    "AMXINT8": "amx_int8",
    "AMXFP16": "amx_fp16",
    "AMXCOMPLEX": "amx_complex",
    "FMA3": "fma",
    "SSE42": "sse4_2",
    "SSE4": "sse4_1",
    "SSE3": "pni",
    "AESNI": "aes",
    "SHA": "sha_ni",
}
# The flags a plan or its user commonly asks for (lscpu names; x86 and Arm): a name close to one of these and none
# of them is a typo, refused with the one meant.
KNOWN_FLAGS = frozenset(
    {
        *NFD_TO_LSCPU.values(),
        "avx",
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512cd",
        "avx512dq",
        "avx512vl",
        "avx512ifma",
        "avx512vbmi",
        "f16c",
        "bmi1",
        "bmi2",
        "adx",
        "gfni",
        "vaes",
        "vpclmulqdq",
        "asimd",
        "asimddp",
        "asimdhp",
        "bf16",
        "i8mm",
        "sve",
        "sve2",
        "svebf16",
        "sme",
    }
)


def lscpu_name(flag: str) -> str:
    """A flag as lscpu spells it: an NFD cpuid name translated (AMXBF16 -> amx_bf16), others lower-cased."""
    return NFD_TO_LSCPU.get(flag, flag.lower())


def typo_of(flag: str) -> str | None:
    """The known flag an unknown name is a near miss of (avx512vnni -> avx512_vnni), None when it is known or near
    none (a rarer lscpu flag is taken as written)."""
    if flag in KNOWN_FLAGS:
        return None
    close = difflib.get_close_matches(flag, sorted(KNOWN_FLAGS), n=1, cutoff=0.85)
    return close[0] if close else None
