"""Read an ELF file's dynamic section (NEEDED, RUNPATH) and dynamic symbols without readelf.

What `readelf -d` shows, in pure Python, so the link check works on a host without binutils and
costs no extra process. Only what doctor needs: ELF64/ELF32, either byte order, no relocation math.
"""

from __future__ import annotations

import struct

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
SHT_DYNSYM = 11
SHN_UNDEF = 0


class NotElf(ValueError):
    pass


def _cstr(blob: bytes, offset: int) -> str:
    end = blob.find(b"\0", offset)
    return blob[offset : end if end >= 0 else len(blob)].decode("utf-8", "replace")


def read_dynamic(path: str, scan_symbols: bool = True) -> dict:
    """{'needed': [...], 'runpath': [...], 'rpath': [...], 'cxx11_undefined': N, 'undefined': N}.

    cxx11_undefined counts undefined dynamic symbols whose mangled name carries `B5cxx11` (the
    std::__cxx11 ABI tag): a binary built with _GLIBCXX_USE_CXX11_ABI=0 has none of them.
    """
    with open(path, "rb") as fh:
        ident = fh.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise NotElf(f"{path} is not an ELF file")
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        fh.seek(0)
        header = fh.read(64 if is64 else 52)
        if is64:
            (shoff,) = struct.unpack_from(end + "Q", header, 0x28)
            shentsize, shnum = struct.unpack_from(end + "HH", header, 0x3A)
        else:
            (shoff,) = struct.unpack_from(end + "I", header, 0x20)
            shentsize, shnum = struct.unpack_from(end + "HH", header, 0x2E)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        sections = []
        for i in range(shnum):
            raw = table[i * shentsize : (i + 1) * shentsize]
            if is64:
                _name, stype, _flags, addr, off, size, link, _info, _align, entsize = struct.unpack_from(
                    end + "IIQQQQIIQQ", raw
                )
            else:
                _name, stype, _flags, addr, off, size, link, _info, _align, entsize = struct.unpack_from(
                    end + "IIIIIIIIII", raw
                )
            sections.append((stype, addr, off, size, link, entsize))

        def read(off: int, size: int) -> bytes:
            fh.seek(off)
            return fh.read(size)

        out: dict = {"needed": [], "runpath": [], "rpath": [], "cxx11_undefined": 0, "undefined": 0}
        SHT_DYNAMIC = 6
        for stype, _addr, off, size, link, _entsize in sections:
            if stype != SHT_DYNAMIC:
                continue
            strtab = sections[link]
            strings = read(strtab[2], strtab[3])
            data = read(off, size)
            fmt = end + ("qQ" if is64 else "iI")
            step = struct.calcsize(fmt)
            for pos in range(0, len(data) - step + 1, step):
                tag, val = struct.unpack_from(fmt, data, pos)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    out["needed"].append(_cstr(strings, val))
                elif tag == DT_RUNPATH:
                    out["runpath"] = _cstr(strings, val).split(":")
                elif tag == DT_RPATH:
                    out["rpath"] = _cstr(strings, val).split(":")
        if scan_symbols:
            for stype, _addr, off, size, link, entsize in sections:
                if stype != SHT_DYNSYM or not entsize:
                    continue
                strtab = sections[link]
                strings = read(strtab[2], strtab[3])
                data = read(off, size)
                for pos in range(0, len(data) - entsize + 1, entsize):
                    if is64:
                        name, _info, _other, shndx = struct.unpack_from(end + "IBBH", data, pos)
                    else:
                        name, _v, _s, _info, _other, shndx = struct.unpack_from(end + "IIIBBH", data, pos)
                    if shndx != SHN_UNDEF or not name:
                        continue
                    out["undefined"] += 1
                    if b"B5cxx11" in strings[name : strings.find(b"\0", name)]:
                        out["cxx11_undefined"] += 1
        return out
