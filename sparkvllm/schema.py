"""Write the JSON Schema of Pulumi.<stack>.yaml for editors:
`python -m sparkvllm.schema` (tests fail when the committed file is stale)."""

import json
from pathlib import Path

from sparkvllm.config import json_schema

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schema" / "stack-config.schema.json"


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render())
    print(f"wrote {SCHEMA_FILE}")
