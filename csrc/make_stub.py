"""Write pyshmlock/_shmlock.pyi, the type stub of the cffi-built core, from
csrc/shmlock.h: every SHL_ constant and every shl_ function, with its C
parameter names.  The stub is generated, never edited by hand, so it cannot
drift from the header (tests/test_typing.py regenerates it and compares).

    python csrc/make_stub.py            # rewrite the stub
    python csrc/make_stub.py --check    # exit 1 if it is out of date
"""
import os
import re
import sys

CSRC = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(CSRC, "shmlock.h")
STUB = os.path.join(os.path.dirname(CSRC), "pyshmlock", "_shmlock.pyi")

_INTS = {"int", "int32_t", "uint32_t", "int64_t", "uint64_t", "size_t", "unsigned"}


def _py_type(ctype: str, is_return: bool = False) -> str:
    ctype = " ".join(ctype.replace("const ", "").split())
    if ctype == "void":
        return "None"
    if ctype == "char *":
        return "bytes"
    if "*" in ctype:
        return "CData"      # a cffi pointer (ffi.new, a handle, NULL)
    if ctype in _INTS:
        return "int"
    raise ValueError(f"no Python type for C type {ctype!r}")


def _split_param(param: str) -> tuple:
    m = re.match(r"(.*?[\s*])(\w+)$", param.strip())
    if not m:
        raise ValueError(f"cannot parse parameter {param!r}")
    return m.group(1).strip(), m.group(2)


def generate(header_text: str) -> str:
    # Join continued lines and drop comments.
    text = re.sub(r"/\*.*?\*/", " ", header_text, flags=re.S)
    consts = re.findall(r"^#define\s+(SHL_\w+)\s+\S", text, flags=re.M)
    protos = re.findall(r"^([A-Za-z_][\w \t]*?[\s*]+)(shl_\w+)\s*\(([^)]*)\)\s*;", text,
                        flags=re.M)
    out = [
        '"""Type stub of pyshmlock._shmlock, the cffi-built C core.',
        "",
        "Generated from csrc/shmlock.h by csrc/make_stub.py: do not edit.",
        '"""',
        "from typing import Any",
        "",
        "CData = Any   # a cffi pointer: ffi.new(...), a handle, ffi.NULL",
        "",
        "",
        "class _Lib:",
    ]
    for name in consts:
        out.append(f"    {name}: int")
    for ret, name, params in protos:
        args = []
        params = " ".join(params.split())
        if params and params != "void":
            for p in params.split(","):
                ctype, pname = _split_param(p)
                args.append(f"{pname}: {_py_type(ctype)}")
        sig = ", ".join(["self"] + args)
        line = f"    def {name}({sig}) -> {_py_type(ret, True)}: ..."
        if len(line) > 99:     # one parameter a line, as a formatter would
            inner = "".join(f"        {a},\n" for a in ["self"] + args)
            line = f"    def {name}(\n{inner}    ) -> {_py_type(ret, True)}: ..."
        out.append(line)
    out += ["", "", "ffi: Any", "lib: _Lib", ""]
    return "\n".join(out)


def main(argv: list) -> int:
    with open(HEADER) as f:
        stub = generate(f.read())
    if "--check" in argv:
        with open(STUB) as f:
            current = f.read()
        if current != stub:
            print(f"{STUB} is out of date: run python csrc/make_stub.py", file=sys.stderr)
            return 1
        return 0
    with open(STUB, "w") as f:
        f.write(stub)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
