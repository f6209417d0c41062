"""Reading judged queries: BEIR (jsonl / tsv) and TREC formats, detected from the content."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson


class DataError(ValueError):
    """A queries or qrels file that cannot be read; says which and why."""


def read_queries(path: str | Path) -> dict[str, str]:
    """Query id -> text from BEIR `queries.jsonl` (`_id`, `text`) or a tab-separated `id<TAB>text` file
    (TREC's and MS MARCO's topic tsv); a first line `query-id ...`/`id ...` header is skipped. A query
    without a text (null, empty, blank) is left out: there is nothing to search."""
    path = Path(path)
    lines = [line for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    if not lines:
        raise DataError(f"{path}: no queries")
    out: dict[str, str] = {}
    if lines[0].lstrip().startswith("{"):
        for n, line in enumerate(lines, 1):
            try:
                item = orjson.loads(line)
                qid, text = str(item["_id"]), item["text"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{n}: expected a JSON object with _id and text") from exc
            if text is not None and str(text).strip():
                out[qid] = str(text)
        return out
    for n, line in enumerate(lines, 1):
        qid, sep, text = line.partition("\t")
        if not sep:
            raise DataError(f"{path}:{n}: expected id<TAB>text")
        if n == 1 and qid.strip().lower() in ("id", "qid", "query-id", "query_id", "_id"):
            continue
        if text.strip():
            out[qid.strip()] = text.strip()
    return out


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Query id -> {doc id: grade} from a BEIR qrels tsv (`query-id corpus-id score`, with header; ids
    may hold spaces: a line with tabs is split on them) or a TREC qrels file (`qid iteration docid
    grade`, whitespace-separated)."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        tabbed = [p.strip() for p in line.strip().split("\t")]
        parts = tabbed if len(tabbed) in (3, 4) else line.split()
        if not parts:
            continue
        if n == 1 and not _is_int(parts[-1]):
            continue  # a header
        try:
            if len(parts) == 3:
                qid, did, grade = parts
            elif len(parts) == 4:
                qid, _, did, grade = parts
            else:
                raise ValueError
            qrels[qid][did] = int(grade)
        except ValueError as exc:
            raise DataError(
                f"{path}:{n}: expected 'qid docid grade' (BEIR) or 'qid 0 docid grade' (TREC)"
            ) from exc
    if not qrels:
        raise DataError(f"{path}: no judgments")
    return dict(qrels)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
