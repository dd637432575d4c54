# Developer shortcuts.  The README's two commands need none of this.
PYTHON ?= python3
SAN_DIR := build/sanitize

.PHONY: test sanitize warnings clean

test:
	pip install -q '.[test]' && pytest

# The C core must compile without a single warning.
warnings:
	for c in csrc/*.c; do gcc -std=gnu11 -O2 -Wall -Wextra -Wpedantic -Wshadow -Werror -c $$c -o /dev/null || exit 1; done

# The whole test suite against a core built with AddressSanitizer + UBSan.
# The package is copied to build/sanitize so the instrumented build never
# shadows the installed one.
sanitize: warnings
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)/pyshmlock
	cp pyshmlock/*.py pyshmlock/py.typed $(SAN_DIR)/pyshmlock/
	PYSHMLOCK_SANITIZE=1 $(PYTHON) pyshmlock/_build.py $(SAN_DIR)
	cd $(SAN_DIR) && \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  PYTHONPATH=$$PWD $(PYTHON) -m pytest -q -p no:cacheprovider $(CURDIR)/tests

clean:
	rm -rf build dist *.egg-info pyshmlock/_shmlock.* csrc/*.o
