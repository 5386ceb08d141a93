"""The example program: `cd examples/two-sparks && pulumi stack init dev && pulumi up`."""

import sys
from pathlib import Path

# The spark-vllm checkout, for `components` and `sparkvllm` (or `pip install -e` it).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import my_llm

my_llm.main()
