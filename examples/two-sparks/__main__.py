"""The example program: `cd examples/two-sparks && pulumi stack init dev && pulumi up`.

`components` and `sparkvllm` come from the installed package (`pip install` the spark-vllm
checkout into the virtualenv Pulumi.yaml names); `my_llm` from this folder, which the
language host puts on sys.path (it runs the program as the directory ".")."""

import my_llm

my_llm.main()
