# kvbench developer recipes (https://just.systems). Each is also a plain command you can copy.

# install kvbench and its dev tools into the current Python environment
install:
    python3 -m pip install -e '.[dev]'

# the quickstart: simulated Llama-3.1-8B on 1x H100, offload ON vs OFF, prints the t1/t2 table
demo:
    kvbench run quickstart

# lint, type-check and run every test (the README's test command)
test:
    bash scripts/test.sh

# lint and type-check only
lint:
    python3 -m ruff check .
    python3 -m mypy

# format the code
fmt:
    python3 -m ruff format .
    python3 -m ruff check --fix .
