"""Where the shared data lie: the test vectors and the BEIR datasets, in `shared/` beside the checkout
(they are not part of it); the BEIR datasets in `$BMX_BEIR_DIR` when set, as for `bmx-rerank eval`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
VECTORS_FILE = SHARED / "testvectors" / "bmx_small.json"
BEIR = Path(os.environ.get("BMX_BEIR_DIR") or SHARED / "data" / "beir")
SCIFACT = BEIR / "scifact"


def vectors() -> dict[str, Any]:
    """bmx_small.json: a small corpus, queries and the expected BMX/BM25 scores of each case."""
    return json.loads(VECTORS_FILE.read_text())


def scifact_records(name: str, limit: int = 0) -> list[dict[str, Any]]:
    """The first `limit` records (0: all) of a SciFact JSONL file (`corpus.jsonl`, `queries.jsonl`)."""
    return beir_records("scifact", name, limit)


def beir_records(dataset: str, name: str, limit: int = 0) -> list[dict[str, Any]]:
    """The first `limit` records (0: all) of a BEIR dataset's JSONL file (`corpus.jsonl`, `queries.jsonl`)."""
    out = []
    with open(BEIR / dataset / name) as fh:
        for line in fh:
            out.append(json.loads(line))
            if limit and len(out) >= limit:
                break
    return out
