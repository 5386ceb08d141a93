"""The example program, run from this folder (docs/component.md): `python3 -m venv .venv &&
.venv/bin/pip install ../..`, then `pulumi stack init dev && pulumi up` or, without the
Pulumi CLI, `.venv/bin/python -m localengine up --stack dev`.

`components` and `sparkvllm` come from the installed package (the spark-vllm checkout,
installed into the virtualenv Pulumi.yaml names); `my_llm` from this folder, which the
language host puts on sys.path (it runs the program as the directory ".")."""

import my_llm

my_llm.main()
