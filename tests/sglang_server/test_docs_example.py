"""The documentation's SGLang examples (docs/sglang.md, README.md) run as
printed in the SGLang venv, against the real SGLang 0.5.23 modules: each in
a fresh interpreter, with the harness's GPU-only import stand-ins (boot.py)
loaded first, as every process of this suite does."""

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HOOK
from .servers import INSIDE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from docs_examples import python_blocks

pytestmark = pytest.mark.timeout(900)   # the first test may build the venv

SGLANG_BLOCKS = [b for b in python_blocks() if b.needs_sglang]
CHECK = ("\nfrom pyshmlock.integrations import sglang as _integration\n"
         "assert _integration.installed(), 'the example did not install the integration'\n"
         "print('installed')\n")


@pytest.mark.parametrize("block", SGLANG_BLOCKS, ids=lambda b: b.id)
def test_docs_sglang_example_installs_into_real_sglang(sglang_venv, block, tmp_path):
    if HOOK:
        pytest.skip("the examples install() into a release; the hook venv's SGLang is "
                    "a patched build, which install() refuses (as it should)")
    script = tmp_path / "example.py"
    script.write_text("import boot  # noqa: F401\n" + block.code + CHECK)
    done = subprocess.run([str(sglang_venv / "bin" / "python"), str(script)], cwd=INSIDE,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
                               "PYTHONPATH": str(INSIDE), "HOME": str(sglang_venv.parent)})
    assert done.returncode == 0, f"{block.id}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    assert done.stdout.strip().splitlines()[-1] == "installed"
